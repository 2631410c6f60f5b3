"""Executor benchmark: lookup throughput per rank against this machine's memory bandwidth, and
the bytes each collective moves at fp32, fp16, bf16 and int8 communication.

1. Memory bandwidth: a STREAM-like copy (`dst.copy_(src)` of 256 MiB float32, one thread, as
   each rank runs; best of 5; 2 x bytes / seconds, read plus write), measured in this process
   right before and right after the lookup run.
2. Lookups: 4 ranks (gloo, 2 hosts x 2 ranks on this machine), one table-wise table of
   500,000 x 64 fp32 rows (128 MB, far beyond the CPU caches) per rank, uniform ids, batch
   4,096 per rank, pooling 16: 262,144 lookups per rank per step. Lookups per second = the
   rank's lookups per step / its measured lookup-and-pool phase; gathered bytes per second =
   lookups x 256 B / the same time, beside the copy bandwidth.
3. Bytes: the all-types demo plan (planner.executor.demo, every sharding type and tier),
   batch 64, at each precision for both directions; measured bytes per step summed over ranks
   per collective, beside the cost model's (cost_models/traffic.py).

Usage (from the repo root):
    PYTHONPATH=. python -m benchmarks.executor
"""

import os
import platform
import time
from typing import Any

import torch

from benchmarks import write_results
from planner.executor.demo import GPUS_PER_HOST, HOSTS, all_types_plan
from planner.executor.job import RunOptions
from planner.executor.predict import COLLECTIVES
from planner.executor.run import ExecutionReport, execute
from planner.plan_model import Plan, PlanLayout
from planner.presets import preset_dict

COMMAND = "PYTHONPATH=. python -m benchmarks.executor"
COPY_BYTES = 256 * 2**20
ROWS, DIM, BATCH, POOLING = 500_000, 64, 4096, 16
PRECISIONS = ("fp32", "fp16", "bf16", "int8")


def stream_copy_gbps(repeats: int = 5) -> float:
    torch.set_num_threads(1)
    src = torch.ones(COPY_BYTES // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * COPY_BYTES / best / 1e9


def lookup_plan() -> Plan:
    from planner.planning import evaluate

    world = HOSTS * GPUS_PER_HOST
    tables = [{"name": f"t{r}", "num_embeddings": ROWS, "embedding_dim": DIM,
               "pooling_factor": POOLING, "optimizer": "sgd"} for r in range(world)]
    hw = preset_dict("h100")
    hw.update(hosts=HOSTS, gpus_per_host=GPUS_PER_HOST)
    layout = {"request": {"model": {"name": "lookup-bench", "batch_size_per_gpu": BATCH,
                                    "tables": tables}, "hardware": hw},
              "tables": [{"name": f"t{r}", "sharding_type": "table_wise", "tier": "hbm",
                          "pieces": [{"rank": r, "host": r // GPUS_PER_HOST, "row_offset": 0,
                                      "row_count": ROWS, "col_offset": 0, "col_count": DIM}]}
                         for r in range(world)]}
    return evaluate(PlanLayout.model_validate(layout))


def lookups(rep: ExecutionReport) -> list[dict[str, Any]]:
    per_rank = BATCH * HOSTS * GPUS_PER_HOST * POOLING
    out = []
    for r in rep.ranks:
        s = r["seconds_measured"]["lookup"]
        out.append({"rank": r["rank"], "lookups_per_step": per_rank, "lookup_s": s,
                    "lookups_per_s": per_rank / s, "gathered_gb_per_s": per_rank * DIM * 4 / s
                    / 1e9})
    return out


def main() -> None:
    before = stream_copy_gbps()
    rep = execute(lookup_plan(), RunOptions(steps=3, collective_timeout_s=300),
                  timeout_s=900, reference=False)
    after = stream_copy_gbps()
    rows = lookups(rep)
    copy = max(before, after)
    for r in rows:
        r["share_of_copy_bandwidth"] = r["gathered_gb_per_s"] / copy
    comm = {}
    for p in PRECISIONS:
        q = execute(all_types_plan(p, p, batch=64), RunOptions(steps=3, warmup_steps=15),
                    timeout_s=300, reference=False)
        per = {}
        for k in COLLECTIVES:
            per[k] = {"measured": sum(r["bytes"][k]["measured"] for r in q.ranks),
                      "predicted": sum(r["bytes"][k]["predicted"] for r in q.ranks)}
        per["checks_pass"] = all(c.ok for c in q.checks)
        per["checks_failed"] = [f"{c.name}: {c.detail}" for c in q.checks if not c.ok]
        comm[p] = per
    payload = {
        "command": COMMAND,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "torch": torch.__version__, "device": "cpu (gloo)", "ranks": len(rows)},
        "stream_copy_gb_per_s": {"before": before, "after": after},
        "lookup": {"rows": ROWS, "dim": DIM, "batch_per_rank": BATCH, "pooling": POOLING,
                   "ranks": rows, "checks_pass": rep.ok},
        "bytes_per_step": comm,
    }
    write_results("executor", payload, _markdown(payload))
    print(_markdown(payload))


def _markdown(p: dict[str, Any]) -> str:
    m, lk = p["machine"], p["lookup"]
    lines = [
        "# Executor benchmark", "",
        f"`{p['command']}` on {m['platform']}, {m['cpus']} CPUs, torch {m['torch']}, "
        f"{m['ranks']} ranks on {m['device']}. No GPU was available for this run.", "",
        "## Lookups per rank vs memory bandwidth", "",
        f"STREAM-like copy (1 thread): {p['stream_copy_gb_per_s']['before']:.2f} GB/s before, "
        f"{p['stream_copy_gb_per_s']['after']:.2f} GB/s after the run. Table {lk['rows']:,} x "
        f"{lk['dim']} fp32 per rank, batch {lk['batch_per_rank']} per rank, pooling "
        f"{lk['pooling']}, uniform ids; the 4 ranks share the machine's cores.", "",
        "| rank | lookups/step | lookup+pool s/step | lookups/s | gathered GB/s | "
        "share of copy bandwidth |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in lk["ranks"]:
        lines.append(f"| {r['rank']} | {r['lookups_per_step']:,} | {r['lookup_s']:.4f} | "
                     f"{r['lookups_per_s']:,.0f} | {r['gathered_gb_per_s']:.2f} | "
                     f"{r['share_of_copy_bandwidth']:.2f} |")
    lines += ["", "## Bytes per step, all ranks (measured = predicted?)", "",
              "Demo plan with every sharding type and tier, batch 64 per rank, the same "
              "precision forward and backward. Input ids of row-split pieces depend on the "
              "ids drawn (the model gives their expectation).", "",
              "| precision | input lengths | input ids | output fwd | output bwd | all-reduce | "
              "checks |",
              "|---|---:|---:|---:|---:|---:|---|"]
    for prec, c in p["bytes_per_step"].items():
        cells = []
        for k in COLLECTIVES:
            meas, pred = c[k]["measured"], c[k]["predicted"]
            mark = "=" if abs(meas - pred) < 1e-6 else "~"
            cells.append(f"{meas:,.0f} {mark} {pred:,.0f}")
        lines.append(f"| {prec} | " + " | ".join(cells) +
                     f" | {'pass' if c['checks_pass'] else 'FAIL'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
