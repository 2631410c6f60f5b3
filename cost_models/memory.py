"""Bytes a piece holds in each memory tier.

hbm: weights and optimizer state in HBM.
hbm_cache: an HBM cache of `cache_ratio` of the rows (weights and slot metadata) in front of
    the whole table and its optimizer state in host DDR.
ddr: weights and state in host DDR, read over PCIe.
ssd: weights and state on the host SSD behind a DDR cache of `cache_ratio` of the rows.
Data-parallel replicas live in HBM on every GPU.
"""

from dataclasses import dataclass

from cost_models.geometry import TableGeom, cache_rows
from cost_models.hardware import HardwareProfile
from cost_models.sizes import optimizer_state_row_bytes, weight_row_bytes
from cost_models.types import Tier


@dataclass(frozen=True)
class MemoryFootprint:
    """Bytes per tier. HBM counts against the piece's GPU, DDR and SSD against its host."""

    hbm: int = 0
    ddr: int = 0
    ssd: int = 0

    def __add__(self, other: "MemoryFootprint") -> "MemoryFootprint":
        return MemoryFootprint(self.hbm + other.hbm, self.ddr + other.ddr, self.ssd + other.ssd)


def piece_memory(
    table: TableGeom,
    tier: Tier,
    cache_ratio: float,
    piece_rows: int,
    piece_cols: int,
    hw: HardwareProfile,
) -> MemoryFootprint:
    w_row = weight_row_bytes(table.data_type, piece_cols)
    s_row = optimizer_state_row_bytes(table.optimizer, piece_cols)
    full = piece_rows * (w_row + s_row)
    meta = hw.constants.cache_metadata_bytes_per_row
    if tier is Tier.HBM:
        return MemoryFootprint(hbm=full)
    if tier is Tier.HBM_CACHE:
        slots = cache_rows(cache_ratio, piece_rows)
        return MemoryFootprint(hbm=slots * (w_row + meta), ddr=full)
    if tier is Tier.DDR:
        return MemoryFootprint(ddr=full)
    slots = cache_rows(cache_ratio, piece_rows)
    return MemoryFootprint(ddr=slots * (w_row + s_row + meta), ssd=full)
