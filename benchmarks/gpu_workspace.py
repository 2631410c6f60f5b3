"""A piece's backward workspace on CUDA, read from the caching allocator, against the memory
model's (cost_models.memory.backward_workspace).

The executor's backward of one piece (rank.py `_update_piece`): kernels.row_grads_bags (unique
ids, their pooled gradients summed), then the store's update with kernels.apply_optimizer.
Each point runs it once on a fresh hbm DenseStore after a warm-up and reads the allocator's
requested_bytes peak above what was live before it (requested: before the allocator's
rounding, as the executor's memory check reads it). Ids uniform over the rows.

    python -m benchmarks.gpu_workspace OUT.json      (on a CUDA machine, repo root)
"""

import json
import sys

import torch

from cost_models import Tier
from cost_models.memory import backward_workspace
from cost_models.types import Optimizer
from planner.executor import kernels
from planner.executor.store import DenseStore

OPTIMIZERS = (Optimizer.SGD, Optimizer.ADAGRAD, Optimizer.ROWWISE_ADAGRAD, Optimizer.ADAM)
IDS = (2_000, 50_000, 500_000)
ROWS = (1_000, 100_000, 2_000_000)
COLS = (16, 64)
POOLING = (1, 20)
# Pieces of the fixture plans benchmarks/gpu_calibrate.sh runs, whose backward peaks the
# executor measured (results/gpu_h200.md): (optimizer, ids, rows, cols, pooling). rm2's
# piece: 2,048 samples x 120 ids over 25,000 rows of 64 (run 2: 1.77 MB over the model).
PIECES = ((Optimizer.ROWWISE_ADAGRAD, 245_760, 25_000, 64, 120),)


def requested(dev: torch.device, which: str) -> int:
    return int(torch.cuda.memory_stats(dev)[f"requested_bytes.all.{which}"])


def one(dev: torch.device, opt: Optimizer, n: int, rows: int, cols: int, pooling: int
        ) -> dict[str, float]:
    g = torch.Generator(device=dev).manual_seed(0)
    w = torch.randn((rows, cols), device=dev, generator=g) * 0.1
    s = torch.zeros((rows, kernels.state_cols(opt, cols)), device=dev)
    store = DenseStore(w, s, Tier.HBM, dev)
    bags = max(1, n // pooling)
    ids = torch.randint(0, rows, (n,), device=dev, generator=g)
    offsets = torch.arange(0, n, n // bags, device=dev)[:bags]
    grad = torch.randn((bags, cols), device=dev, generator=g)
    cfg = kernels.OptimConfig()

    def backward(step: int) -> None:
        uniq, gr = kernels.row_grads_bags(ids, offsets, grad)
        store.update(uniq, lambda a, b: kernels.apply_optimizer(opt, cfg, a, b, gr, step))

    backward(1)  # warm-up: kernels loaded, cub's temporaries sized
    torch.cuda.synchronize(dev)
    base = requested(dev, "current")
    torch.cuda.reset_peak_memory_stats(dev)
    backward(2)
    torch.cuda.synchronize(dev)
    peak = requested(dev, "peak") - base
    u = int(torch.unique(ids).numel())
    model = backward_workspace(opt, n, bags, rows, u, cols)
    return {"optimizer": str(opt), "ids": n, "rows": rows, "cols": cols, "bags": bags,
            "unique": u, "measured": peak, "model": model, "ratio": peak / model}


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "gpu_workspace.json"
    dev = torch.device("cuda")
    torch.use_deterministic_algorithms(True)  # as the executor's ranks run
    res = []
    grid = [(opt, n, rows, cols, pooling) for opt in OPTIMIZERS for n in IDS for rows in ROWS
            for cols in COLS for pooling in POOLING]
    for opt, n, rows, cols, pooling in (*grid, *PIECES):
        r = one(dev, opt, n, rows, cols, pooling)
        res.append(r)
        torch.cuda.empty_cache()
        print(f"{r['optimizer']:16s} ids {n:>7,} rows {rows:>9,} cols {cols:>3} bags "
              f"{r['bags']:>7,} unique {r['unique']:>7,}: measured {r['measured']:>12,} "
              f"model {r['model']:>12,} ({r['ratio']:.3f})", flush=True)
    body = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "results": res}
    with open(out, "w") as f:
        json.dump(body, f, indent=1)


if __name__ == "__main__":
    main()
