"""Helpers of the interop tests: a small two-host cluster and hand-made layouts."""

from typing import Any

import pytest

from planner.plan_model import PlanLayout, PlanPiece, TablePlan
from planner.planning import resolve

# 2 hosts x 4 GPUs: small enough to write every piece by hand.
HARDWARE: dict[str, Any] = {
    "name": "tiny", "hosts": 2, "gpus_per_host": 4,
    "gpu": {"name": "gpu", "hbm_capacity_bytes": "16GiB", "hbm_bandwidth_gb_per_s": 1000.0},
    "host": {"ddr_capacity_bytes": "256GiB", "ddr_bandwidth_gb_per_s": 200.0,
             "ssd_capacity_bytes": "2TiB", "ssd_bandwidth_gb_per_s": 10.0},
    "links": {"nvlink_gb_per_s": 300.0, "nic_gb_per_s": 25.0, "pcie_gb_per_s": 32.0},
}


def table(name: str, rows: int, dim: int) -> dict[str, Any]:
    return {"name": name, "num_embeddings": rows, "embedding_dim": dim, "pooling_factor": 3.0}


def piece(rank: int, r0: int, rn: int, c0: int, cn: int) -> PlanPiece:
    return PlanPiece(rank=rank, host=rank // 4, row_offset=r0, row_count=rn, col_offset=c0,
                     col_count=cn)


@pytest.fixture
def make_layout():
    """layout(tables=[(spec dict, TablePlan)]) on the tiny cluster."""

    def build(entries: list[tuple[dict[str, Any], TablePlan]]) -> PlanLayout:
        req = resolve({"model": {"batch_size_per_gpu": 64, "tables": [e[0] for e in entries]},
                       "hardware": HARDWARE})
        return PlanLayout(request=req, tables=[e[1] for e in entries])

    return build


def tplan(name: str, kind: str, pieces: list[PlanPiece], tier: str = "hbm",
          ratio: float | None = None) -> TablePlan:
    return TablePlan(name=name, sharding_type=kind, tier=tier, cache_ratio=ratio, pieces=pieces)
