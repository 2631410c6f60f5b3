"""Where one piece's backward spends its time on a GPU: the executor's own code path
(kernels.row_grads_bags, then DenseStore.update with kernels.apply_optimizer, under the
worker's deterministic algorithms), timed per call (wall, synchronised) and profiled with
CUDA activity (torch.profiler: each operator's CPU time and its kernels' GPU time).

Why: on the H200 the calibrated model priced criteo_dcnv2's backward (26 pieces of up to
200,000 x 128, batch 8,192, pooling 1-100) 43-46% short in two runs on fresh machines
(gpu_h200.md, runs 3 and 4), while criteo_kaggle's (26 pieces, batch 128) came out within
14-24% either way; the calibration plans' backward points run 1.0-2.8 ms a piece whatever
their ids (8,192 to 2.6 million), so the fit finds no per-id or per-byte term.

    python3 -m benchmarks.gpu_backward_profile OUT.json     (on a machine with a GPU)

Shapes: (rows, cols, pooling, batch), each one table-wise piece in HBM, uniform ids.
"""

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from cost_models.types import Optimizer, Tier
from planner.executor import kernels
from planner.executor.store import DenseStore

SHAPES = ((200_000, 128, 100, 8192), (200_000, 128, 10, 8192), (200_000, 128, 1, 8192),
          (1_000, 128, 1, 8192), (200_000, 16, 100, 8192), (100, 16, 1, 128),
          (1_000_000, 16, 1, 128))
REPS = 10


def one(device: torch.device, rows: int, cols: int, pooling: int, batch: int,
        profile: bool) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    store = DenseStore(torch.rand(rows, cols, generator=gen),
                       torch.zeros(rows, 1), Tier.HBM, device)
    ids = torch.randint(0, rows, (batch * pooling,), generator=gen).to(device)
    offsets = torch.arange(0, batch * pooling, pooling, dtype=torch.int64).to(device)
    grad = torch.rand(batch, cols, generator=gen).to(device)
    opt = kernels.OptimConfig()

    def step(k: int) -> None:
        uniq, g = kernels.row_grads_bags(ids, offsets, grad)
        store.update(uniq, lambda w, s: kernels.apply_optimizer(
            Optimizer.ROWWISE_ADAGRAD, opt, w, s, g, k + 1))

    for k in range(3):
        step(k)
    torch.cuda.synchronize(device)
    times = []
    for k in range(REPS):
        t0 = time.perf_counter()
        c0 = time.thread_time()
        step(k)
        torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0, time.thread_time() - c0))
    out: dict[str, Any] = {
        "rows": rows, "cols": cols, "pooling": pooling, "batch": batch,
        "ids": batch * pooling,
        "unique": int(torch.unique(ids).numel()),
        "wall_s_median": sorted(t for t, _ in times)[REPS // 2],
        "cpu_s_median": sorted(c for _, c in times)[REPS // 2],
    }
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as prof
        with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for k in range(3):
                step(k)
            torch.cuda.synchronize(device)
        ev = p.key_averages()
        rows_ = [{"op": e.key, "calls": e.count / 3,
                  "cpu_us": e.self_cpu_time_total / 3,
                  "gpu_us": getattr(e, "self_device_time_total",
                                    getattr(e, "self_cuda_time_total", 0)) / 3}
                 for e in ev]
        out["ops_by_gpu"] = sorted(rows_, key=lambda r: -r["gpu_us"])[:12]
        out["ops_by_cpu"] = sorted(rows_, key=lambda r: -r["cpu_us"])[:12]
        out["gpu_us_total"] = sum(r["gpu_us"] for r in rows_)
        out["cpu_us_total"] = sum(r["cpu_us"] for r in rows_)
    return out


def main() -> None:
    dest = Path(sys.argv[1])
    device = torch.device("cuda")
    torch.use_deterministic_algorithms(True)  # as the executor's worker
    torch.set_num_threads(1)
    res = []
    for shape in SHAPES:
        r = one(device, *shape, profile=True)
        res.append(r)
        print(f"rows {r['rows']:>9,} cols {r['cols']:>3} pooling {r['pooling']:>3} batch "
              f"{r['batch']:>5}: ids {r['ids']:>9,} unique {r['unique']:>8,}  wall "
              f"{1e3 * r['wall_s_median']:.3f} ms  cpu {1e3 * r['cpu_s_median']:.3f} ms  "
              f"(profiled: gpu {r['gpu_us_total'] / 1e3:.3f} ms, ops' cpu "
              f"{r['cpu_us_total'] / 1e3:.3f} ms)", flush=True)
        for o in r["ops_by_gpu"][:6]:
            print(f"    gpu {o['gpu_us']:9.1f} us  cpu {o['cpu_us']:8.1f} us  "
                  f"x{o['calls']:.0f}  {o['op'][:70]}")
    dest.write_text(json.dumps({"device": torch.cuda.get_device_name(device),
                                "torch": torch.__version__, "results": res}, indent=1))


if __name__ == "__main__":
    main()
