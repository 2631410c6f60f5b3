"""A small plan with every sharding type and memory tier on 2 hosts x 2 GPUs: what the tests
and the benchmark run on 4 CPU ranks. Hand-made layout, scored by `planner.planning.evaluate`
(and so checked by `planner check`'s checker)."""

from typing import Any

from planner.plan_model import Plan, PlanLayout
from planner.presets import preset_dict

HOSTS, GPUS_PER_HOST = 2, 2


def piece(rank: int, row0: int, rows: int, col0: int, cols: int) -> dict[str, int]:
    """One piece on `rank` (hosts of GPUS_PER_HOST ranks)."""
    return {"rank": rank, "host": rank // GPUS_PER_HOST, "row_offset": row0,
            "row_count": rows, "col_offset": col0, "col_count": cols}


def _table(name: str, rows: int, dim: int, pooling: float, access: dict[str, Any],
           optimizer: str, data_type: str = "fp32", min_width: int | None = None
           ) -> dict[str, Any]:
    """A table spec; `min_width`: its min_column_shard_width, for the demo's column chunks
    of 3 to 5 columns (the default 32 would refuse them: planner/check.py)."""
    spec = {"name": name, "num_embeddings": rows, "embedding_dim": dim,
            "pooling_factor": pooling, "access_frequency": access, "optimizer": optimizer,
            "data_type": data_type}
    if min_width is not None:
        spec["constraints"] = {"min_column_shard_width": min_width}
    return spec


def split_rows(rows: int, ranks: list[int], col0: int, cols: int) -> list[dict[str, int]]:
    """The rows split evenly over `ranks`, one piece each."""
    n = len(ranks)
    return [piece(r, rows * i // n, rows * (i + 1) // n - rows * i // n, col0, cols)
            for i, r in enumerate(ranks)]


def all_types_plan(fwd: str = "fp32", bwd: str = "fp32", batch: int = 32,
                   pipelined: bool = False) -> Plan:

    uni: dict[str, Any] = {"kind": "uniform"}
    tables = [
        _table("tw_hbm", 64, 8, 3, uni, "rowwise_adagrad"),
        _table("tw_fp16_ddr", 48, 8, 2, uni, "sgd", "fp16"),
        _table("cw_cache", 400, 8, 4, {"kind": "zipf", "alpha": 1.1}, "rowwise_adagrad",
               min_width=4),
        _table("rw_ddr", 100, 4, 3, uni, "sgd"),
        _table("twrw_ssd", 96, 4, 2.5, uni, "rowwise_adagrad"),
        _table("twcw_hbm", 40, 8, 2, uni, "adagrad", min_width=3),
        _table("grid_cache", 120, 8, 3, {"kind": "curve", "points": [[0.2, 0.8]]},
               "rowwise_adagrad", min_width=4),
        _table("dp_hbm", 32, 4, 2, uni, "adam"),
        _table("zipf_cache", 2000, 4, 8, {"kind": "zipf", "alpha": 1.05}, "sgd"),
        _table("zipf_ssd", 1000, 4, 8, {"kind": "zipf", "alpha": 0.9}, "rowwise_adagrad"),
    ]
    plans = [
        ("tw_hbm", "table_wise", "hbm", None, [piece(0, 0, 64, 0, 8)]),
        ("tw_fp16_ddr", "table_wise", "ddr", None, [piece(1, 0, 48, 0, 8)]),
        ("cw_cache", "column_wise", "hbm_cache", 0.25,
         [piece(1, 0, 400, 0, 4), piece(3, 0, 400, 4, 4)]),
        ("rw_ddr", "row_wise", "ddr", None, split_rows(100, [0, 1, 2, 3], 0, 4)),
        ("twrw_ssd", "table_row_wise", "ssd", 0.25, split_rows(96, [2, 3], 0, 4)),
        ("twcw_hbm", "table_column_wise", "hbm", None,
         [piece(0, 0, 40, 0, 5), piece(1, 0, 40, 5, 3)]),
        ("grid_cache", "grid", "hbm_cache", 0.3,
         split_rows(120, [0, 1], 0, 4) + split_rows(120, [2, 3], 4, 4)),
        ("dp_hbm", "data_parallel", "hbm", None, [piece(r, 0, 32, 0, 4) for r in range(4)]),
        ("zipf_cache", "table_wise", "hbm_cache", 0.1, [piece(2, 0, 2000, 0, 4)]),
        ("zipf_ssd", "table_wise", "ssd", 0.1, [piece(3, 0, 1000, 0, 4)]),
    ]
    return evaluated_plan("executor-demo", HOSTS, GPUS_PER_HOST, batch, fwd, bwd, tables, plans,
                          pipelined)


def small_plan(fwd: str = "fp32", bwd: str = "fp32", batch: int = 8,
               pipelined: bool = False) -> Plan:
    """2 ranks on one host: every optimizer (SGD, Adagrad, row-wise Adagrad, Adam, sharded and
    data-parallel), table-, column- and row-wise pieces, hbm, ddr and an LFU/LRU-cached tier,
    fp16 and int8 storage, several pieces per rank. What the mutation suite and the CLI
    failure tests run: a launch takes about a second."""

    uni: dict[str, Any] = {"kind": "uniform"}
    tables = [
        _table("tw_sgd", 40, 4, 3, uni, "sgd"),
        _table("tw_adam", 30, 4, 2, uni, "adam"),
        _table("cw_adagrad", 50, 8, 3, uni, "adagrad", min_width=4),
        _table("rw_rowwise", 60, 4, 4, uni, "rowwise_adagrad"),
        _table("dp_adam", 16, 4, 2, uni, "adam"),
        # zipf: a cache policy that keeps the wrong rows shows in the hit rate.
        _table("tw_cache", 80, 4, 6, {"kind": "zipf", "alpha": 1.0}, "rowwise_adagrad"),
        _table("tw_fp16", 24, 4, 2, uni, "sgd", "fp16"),
        _table("cw_int8", 36, 8, 3, uni, "rowwise_adagrad", "int8", min_width=4),
    ]

    plans = [
        ("tw_sgd", "table_wise", "hbm", None, [piece(0, 0, 40, 0, 4)]),
        ("tw_adam", "table_wise", "hbm", None, [piece(1, 0, 30, 0, 4)]),
        ("cw_adagrad", "column_wise", "hbm", None, [piece(0, 0, 50, 0, 4),
                                                    piece(1, 0, 50, 4, 4)]),
        ("rw_rowwise", "row_wise", "ddr", None, [piece(0, 0, 30, 0, 4),
                                                 piece(1, 30, 30, 0, 4)]),
        ("dp_adam", "data_parallel", "hbm", None, [piece(r, 0, 16, 0, 4) for r in range(2)]),
        ("tw_cache", "table_wise", "hbm_cache", 0.25, [piece(1, 0, 80, 0, 4)]),
        ("tw_fp16", "table_wise", "hbm", None, [piece(0, 0, 24, 0, 4)]),
        ("cw_int8", "column_wise", "hbm", None, [piece(0, 0, 36, 0, 4),
                                                 piece(1, 0, 36, 4, 4)]),
    ]
    return evaluated_plan("executor-small", 1, 2, batch, fwd, bwd, tables, plans, pipelined)


def evaluated_plan(name: str, hosts: int, gpus_per_host: int, batch: int, fwd: str,
                   bwd: str, tables: list[dict[str, Any]], plans: list[tuple[Any, ...]],
                   pipelined: bool = False) -> Plan:
    """The plan of hand-placed `plans` (name, sharding, tier, cache ratio, pieces) of
    `tables` on h100 hosts, scored by planning.evaluate."""
    from planner.planning import evaluate  # imported on use, as the builders did

    hw = preset_dict("h100")
    hw.update(hosts=hosts, gpus_per_host=gpus_per_host)
    request = {
        "model": {"name": name, "batch_size_per_gpu": batch,
                  "fwd_comm_precision": fwd, "bwd_comm_precision": bwd,
                  "pipelined": pipelined, "tables": tables},
        "hardware": hw,
    }
    layout = {"request": request, "tables": [
        {"name": n, "sharding_type": k, "tier": tier, "cache_ratio": ratio, "pieces": ps}
        for n, k, tier, ratio, ps in plans]}
    return evaluate(PlanLayout.model_validate(layout))
