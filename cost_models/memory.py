"""Bytes a piece holds in each memory tier.

hbm: weights and optimizer state in HBM.
hbm_cache: an HBM cache of `cache_ratio` of the rows (weights and slot metadata) in front of
    the whole table and its optimizer state in host DDR.
ddr: weights and state in host DDR, read over PCIe.
ssd: weights and state on the host SSD behind a DDR cache of `cache_ratio` of the rows.
Data-parallel replicas live in HBM on every GPU.
"""

import math
from dataclasses import dataclass

from cost_models.geometry import ModelGeom, TableGeom, cache_rows
from cost_models.hardware import HardwareProfile
from cost_models.sizes import comm_row_bytes, optimizer_state_row_bytes, weight_row_bytes
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


# Ids and bag offsets live on the device as int64, as FBGEMM's table-batched embedding takes
# them (and the executor stores them), whatever width they cross the wire at.
DEVICE_INDEX_BYTES = 8
# Pooled vectors and their gradients are fp32 on the device (the dense part's input).
POOLED_BYTES = 4
# The backward's transient rows per touched row: the row's gradient and up to two optimizer
# temporaries (Adam's moments' updates), fp32, for the rows a step touches.
WORKSPACE_ROWS_PER_TOUCHED_ROW = 3
# A row-split piece's id count is random; its buffer is sized for the hottest rows it could
# hold plus this many standard deviations, so a measured peak stays under the model's.
ID_COUNT_SIGMAS = 6.0


@dataclass(frozen=True)
class StepBuffers:
    """Bytes a step needs in HBM besides weights, optimizer state and caches, by term:
    - ids: ids and bag offsets (int64 on the device);
    - pooled: pooled vectors (or row-split partial sums), fp32;
    - grads: their gradients, fp32;
    - wire: output all-to-all staging at the communication precision (forward, backward);
    - dense: the dense part's stand-in for the pooled vectors' consumer (the executor's
      targets; a real model holds at least its input activations), fp32;
    - dense_grad: a data-parallel replica's dense gradient and its all-reduce staging;
    - workspace: the backward's per-row gradients and optimizer temporaries, for every row
      the step touches (at most its ids, at most its rows).
    Counted as if all were alive at once: a bound on the step's peak, not an estimate of it."""

    ids: int = 0
    pooled: int = 0
    grads: int = 0
    wire: int = 0
    dense: int = 0
    dense_grad: int = 0
    workspace: int = 0

    @property
    def total(self) -> int:
        return (self.ids + self.pooled + self.grads + self.wire + self.dense + self.dense_grad
                + self.workspace)

    def __add__(self, other: "StepBuffers") -> "StepBuffers":
        return StepBuffers(self.ids + other.ids, self.pooled + other.pooled,
                           self.grads + other.grads, self.wire + other.wire,
                           self.dense + other.dense, self.dense_grad + other.dense_grad,
                           self.workspace + other.workspace)


def _id_bound(table: TableGeom, batch: int, ranks: int, piece_rows: int) -> int:
    """Ids a piece of `piece_rows` rows receives per step from `ranks` ranks of `batch`
    samples each, at most (with high probability): the share of the hottest `piece_rows`
    rows (the largest share any row range can draw) plus ID_COUNT_SIGMAS binomial
    deviations. Each rank sends round(batch * pooling) ids of a table per step."""
    total = ranks * round(batch * table.pooling)
    if piece_rows >= table.rows:
        return total
    mean = total * table.access.hit_rate(piece_rows, table.rows)
    return min(total, math.ceil(mean + ID_COUNT_SIGMAS * math.sqrt(max(mean, 1.0))) + 1)


def piece_buffers(table: TableGeom, data_parallel: bool, piece_rows: int, piece_cols: int,
                  world: int, model: ModelGeom) -> StepBuffers:
    """A piece's own step buffers. A sharded piece serves all b*W samples: the ids it
    receives, its pooled vectors and their gradients, and its side of the output all-to-all.
    A data-parallel replica's ids and vectors are its own samples', counted with the sample
    owner's (owner_buffers); the replica adds its dense gradient and all-reduce staging."""
    b = model.batch_per_gpu
    row = piece_cols * POOLED_BYTES * WORKSPACE_ROWS_PER_TOUCHED_ROW
    if data_parallel:
        touched = min(piece_rows, round(b * table.pooling))
        return StepBuffers(dense_grad=piece_rows * piece_cols * POOLED_BYTES
                           + piece_rows * comm_row_bytes(model.bwd_precision, piece_cols),
                           workspace=touched * row)
    samples = b * world
    pooled = samples * piece_cols * POOLED_BYTES
    wire = samples * (comm_row_bytes(model.fwd_precision, piece_cols)
                      + comm_row_bytes(model.bwd_precision, piece_cols))
    n_ids = _id_bound(table, b, world, piece_rows)
    ids = (n_ids + samples) * DEVICE_INDEX_BYTES
    return StepBuffers(ids=ids, pooled=pooled, grads=pooled, wire=wire,
                       workspace=min(piece_rows, n_ids) * row)


def owner_buffers(tables: list[TableGeom], model: ModelGeom) -> StepBuffers:
    """Every GPU's buffers as the owner of its b samples, the same on every GPU and for any
    placement: per table the ids and offsets it sends (or looks up, data-parallel), the
    pooled vectors it receives (wire and fp32), their gradients (fp32 and wire) and the
    dense part's stand-in."""
    b = model.batch_per_gpu
    ids = pooled = wire = 0
    for t in tables:
        ids += (round(b * t.pooling) + b) * DEVICE_INDEX_BYTES
        pooled += b * t.dim * POOLED_BYTES
        wire += b * (comm_row_bytes(model.fwd_precision, t.dim)
                     + comm_row_bytes(model.bwd_precision, t.dim))
    return StepBuffers(ids=ids, pooled=pooled, grads=pooled, wire=wire, dense=pooled)
