"""Lookup throughput of the executor's own kernel path on one GPU (torch's kernels: FBGEMM's
CUDA wheel is too large to bring to the lent machine), against the h100 preset's constants.

For each table shape (rows x dim, fp32 weights, row-wise Adagrad as in every fixture) and
batch x pooling, on an hbm DenseStore (planner/executor/store.py):
  forward: store.read(ids) then kernels.pool (gather rows, sum per sample), as rank.py runs it;
  backward: kernels.row_grads (unique ids, summed gradient per row) then store.update with
    kernels.apply_optimizer (row-wise Adagrad), as rank.py runs it.
Ids uniform over the rows, bags of `pooling` ids each. Timed with torch.cuda.synchronize
around each repetition; median of REPEATS after WARMUP. Reported beside the cost model's bytes
for the same work (cost_models/traffic.py, tier hbm): forward lookups x (row + 8 B id),
backward lookups x 2 x (row + state row), and the model's seconds at
hbm_bandwidth x hbm_efficiency (h100: 3350 GB/s x 0.55 = 1842.5 GB/s). "model GB/s" =
model bytes / measured seconds: the bandwidth the model would have to assume to predict the
measured time. Both torch.use_deterministic_algorithms settings (the executor runs True).

Usage (on a CUDA machine, repo root):  python -m benchmarks.gpu_lookup OUT.json
"""

import json
import statistics
import sys
import time

import torch

from cost_models import Tier
from cost_models.types import Optimizer
from planner.executor import kernels
from planner.executor.store import DenseStore

WARMUP, REPEATS = 2, 7
PEAK_GBPS, EFFICIENCY = 3350.0, 0.55  # fixtures/hardware/h100.json, CostConstants
SHAPES = [(1_000_000, 16), (1_000_000, 64), (1_000_000, 128), (10_000_000, 64),
          (10_000_000, 128)]
BAGS = [(2048, 1), (2048, 32), (8192, 8), (8192, 32), (32768, 1), (32768, 8)]


def _time(fn) -> float:
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def one(rows: int, dim: int, batch: int, pooling: int, deterministic: bool) -> dict:
    dev = torch.device("cuda")
    torch.use_deterministic_algorithms(deterministic)
    g = torch.Generator(device=dev).manual_seed(0)
    w = torch.randn((rows, dim), device=dev, generator=g) * 0.1
    s = torch.zeros((rows, 1), device=dev)
    store = DenseStore(w, s, Tier.HBM, dev)
    n = batch * pooling
    ids = torch.randint(0, rows, (n,), device=dev, generator=g)
    lengths = torch.full((batch,), pooling, dtype=torch.int64, device=dev)
    sample = kernels.sample_index(lengths)
    grad = torch.randn((batch, dim), device=dev, generator=g)
    cfg = kernels.OptimConfig()

    def fwd() -> torch.Tensor:
        return kernels.pool(store.read(ids), sample, batch)

    def bwd() -> None:
        uniq, gr = kernels.row_grads(ids, grad[sample])
        store.update(uniq, lambda a, b: kernels.apply_optimizer(
            Optimizer.ROWWISE_ADAGRAD, cfg, a, b, gr, 1))

    tf, tb = _time(fwd), _time(bwd)
    row, srow = dim * 4, 4
    fwd_b, bwd_b = n * (row + 8), n * 2 * (row + srow)
    eff = PEAK_GBPS * 1e9 * EFFICIENCY
    return {"rows": rows, "dim": dim, "batch": batch, "pooling": pooling, "lookups": n,
            "deterministic": deterministic,
            "fwd_s": tf, "bwd_s": tb,
            "fwd_model_bytes": fwd_b, "bwd_model_bytes": bwd_b,
            "fwd_model_s": fwd_b / eff, "bwd_model_s": bwd_b / eff,
            "fwd_model_gbps": fwd_b / tf / 1e9, "bwd_model_gbps": bwd_b / tb / 1e9,
            "fwd_rows_gbps": n * row / tf / 1e9, "lookups_per_s": n / tf}


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "gpu_lookup.json"
    res = []
    for det in (True, False):
        for rows, dim in SHAPES:
            for batch, pooling in BAGS:
                r = one(rows, dim, batch, pooling, det)
                torch.cuda.empty_cache()
                res.append(r)
                print(f"det={det!s:5} rows={rows:>10,} dim={dim:>3} b={batch:>5} L={pooling:>2}"
                      f" fwd {r['fwd_s'] * 1e3:8.3f} ms ({r['fwd_model_gbps']:7.1f} model-GB/s,"
                      f" model {r['fwd_model_s'] * 1e3:7.3f} ms)  bwd {r['bwd_s'] * 1e3:8.3f} ms"
                      f" ({r['bwd_model_gbps']:7.1f} model-GB/s, model "
                      f"{r['bwd_model_s'] * 1e3:7.3f} ms)", flush=True)
    body = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "peak_gbps": PEAK_GBPS, "hbm_efficiency": EFFICIENCY,
            "results": res}
    with open(out, "w") as f:
        json.dump(body, f, indent=1)


if __name__ == "__main__":
    main()
