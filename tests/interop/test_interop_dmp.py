"""Our exported plan applied by TorchRec's DistributedModelParallel on CPU, 2 gloo ranks.

A planned layout with a table on each rank, a column-wise table split over both, a row-wise
table and a data-parallel one: each rank's pooled output must equal the unsharded
EmbeddingBagCollection's on its local batch; after backward, each local shard must hold the
reference weights minus lr x (gradient of both ranks' losses) / 2 (TorchRec divides the
gradients by the world size), and the data-parallel replica's gradient is the reference /2.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchrec")

WORLD = 2
TIMEOUT_S = 150
ROOT = Path(__file__).resolve().parents[2]

HARDWARE = {"name": "cpu2", "hosts": 1, "gpus_per_host": 2,
            "gpu": {"name": "cpu", "hbm_capacity_bytes": "1GiB", "hbm_bandwidth_gb_per_s": 100.0},
            "host": {"ddr_capacity_bytes": "8GiB", "ddr_bandwidth_gb_per_s": 50.0},
            "links": {"nvlink_gb_per_s": 50.0, "nic_gb_per_s": 10.0, "pcie_gb_per_s": 16.0}}


def _table(name: str, rows: int, dim: int, **constraints) -> dict:
    return {"name": name, "num_embeddings": rows, "embedding_dim": dim, "pooling_factor": 2.0,
            "optimizer": "sgd", "constraints": constraints}


TABLES = [
    _table("tw0", 50, 8, sharding_types=["table_wise"], pinned_ranks=[1]),
    _table("tw1", 30, 16, sharding_types=["table_wise"], pinned_ranks=[0]),
    _table("cw", 40, 16, sharding_types=["column_wise"], min_column_shard_width=4),
    _table("rw", 41, 8, sharding_types=["row_wise"]),
    _table("dp", 20, 8, sharding_types=["data_parallel"]),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_exported_plan_runs_in_distributed_model_parallel(tmp_path):
    from planner import plan
    from planner.interop import to_torchrec

    p = plan({"model": {"batch_size_per_gpu": 4, "tables": TABLES}, "hardware": HARDWARE})
    export = to_torchrec(p, device="cpu")
    assert {t.status for t in export.tables} == {"exact"}
    kinds = {t.name: t.sharding_type.value for t in p.tables}
    assert kinds == {"tw0": "table_wise", "tw1": "table_wise", "cw": "column_wise",
                     "rw": "row_wise", "dp": "data_parallel"}
    spec = tmp_path / "export.json"
    spec.write_text(json.dumps({"export": export.model_dump(mode="json"),
                                "model_tables": TABLES}))
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.interop.dmp_worker", str(r),
                               str(WORLD), str(port), str(spec), str(tmp_path / f"out{r}.json")],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for r in range(WORLD)]
    logs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=TIMEOUT_S)
            logs.append(out)
    finally:
        for proc in procs:  # never leave a rank behind, even on timeout
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for r, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {r} failed:\n{logs[r][-3000:]}"
    for r in range(WORLD):
        res = json.loads((tmp_path / f"out{r}.json").read_text())
        for name, err in res["forward_max_err"].items():
            assert res["forward_max_abs"][name] > 0, name  # the batch really looked rows up
            assert err <= 1e-6, (r, name, err)
        # Every table's shards on this rank, and the replica, were checked after backward.
        assert set(res["update_max_err"]) >= {"cw", "rw", "dp"}
        assert {"tw0", "tw1"} & set(res["update_max_err"])
        for name, err in res["update_max_err"].items():
            assert err <= 1e-6, (r, name, err)
