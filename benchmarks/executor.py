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
3. Mutation suite: every deliberate bug of planner/executor/mutants.py run on the 2-rank
   small plan (3 steps, Adam epsilon 1e-2), caught or not by `planner execute`'s checks; the
   kill rate, and which checks caught each.
4. Bytes: the all-types demo plan (planner.executor.demo, every sharding type and tier),
   batch 64, at each precision for both directions; measured bytes per step summed over ranks
   per collective, beside the cost model's (cost_models/traffic.py).

5. Memory: per rank, the memory model's peak against the allocator's, for 6 plans of 3
   fixtures (benchmarks/executor_memory.py). `--memory` runs this part alone and keeps the
   other sections of the results as they were.

Usage (from the repo root):
    PYTHONPATH=. python -m benchmarks.executor [--memory]
"""

import json
import os
import platform
import sys
import time
from typing import Any

import torch

from benchmarks import RESULTS, write_results
from benchmarks.executor_memory import markdown as memory_markdown
from benchmarks.executor_memory import memory_table
from planner.executor.demo import GPUS_PER_HOST, HOSTS, all_types_plan
from planner.executor.job import RunOptions
from planner.executor.predict import COLLECTIVES
from planner.executor.run import ExecutionReport, execute
from planner.plan_model import Plan, PlanLayout
from planner.presets import preset_dict

COMMAND = "PYTHONPATH=. python -m benchmarks.executor"
MEMORY_COMMAND = "PYTHONPATH=. python -m benchmarks.executor --memory"
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
        pm = r.get("peak_memory") or {}
        out.append({"rank": r["rank"], "lookups_per_step": per_rank, "lookup_s": s,
                    "lookups_per_s": per_rank / s, "gathered_gb_per_s": per_rank * DIM * 4 / s
                    / 1e9,
                    # Allocator-measured bytes the lookup phase allocates above what it
                    # started with, beside what gathering the rows would take.
                    "lookup_transient_bytes": pm.get("phase_transient", {}).get("lookup"),
                    "gathered_rows_bytes": per_rank * DIM * 4})
    return out


def mutation_suite() -> dict[str, Any]:
    from planner.executor.demo import small_plan
    from planner.executor.launch import RankFailure
    from planner.executor.mutants import MUTANTS

    peak = "memory peak"
    rows = []
    t0 = time.perf_counter()
    for fwd in sorted({m.fwd for m in MUTANTS}):
        base = execute(small_plan(fwd), RunOptions(steps=3, eps=1e-2), timeout_s=120)
        # Correct code must pass every check, the allocator-measured memory peak included.
        rows.append({"mutant": f"(none, fwd {fwd})", "kind": "baseline", "what": "correct code",
                     "caught_by": [c.name for c in base.checks if not c.ok]})
    for m in MUTANTS:
        try:
            rep = execute(small_plan(m.fwd), RunOptions(steps=3, eps=1e-2, mutants=(m.name,),
                                                        collective_timeout_s=20),
                          timeout_s=120)
            caught = [c.name for c in rep.checks if not c.ok and not c.name.startswith(peak)]
        except RankFailure as exc:
            caught = [f"rank failure: {str(exc).splitlines()[0]}"]
        rows.append({"mutant": m.name, "kind": m.kind, "what": m.what, "fwd": m.fwd,
                     "caught_by": caught})
    muts = [r for r in rows if r["kind"] != "baseline"]
    killed = sum(1 for r in muts if r["caught_by"])
    return {"rows": rows, "killed": killed, "total": len(muts),
            "baselines_pass": all(not r["caught_by"] for r in rows if r["kind"] == "baseline"),
            "seconds": time.perf_counter() - t0}


def main() -> None:
    if "--memory" in sys.argv[1:]:
        # The memory table alone, into the results the other sections already hold.
        payload = json.loads((RESULTS / "executor.json").read_text())
        payload["memory"] = {"command": MEMORY_COMMAND, **memory_table()}
        write_results("executor", payload, _markdown(payload))
        print("\n".join(memory_markdown(payload["memory"])))
        return
    before = stream_copy_gbps()
    rep = execute(lookup_plan(), RunOptions(steps=3, collective_timeout_s=300),
                  timeout_s=900, reference=False)
    after = stream_copy_gbps()
    rows = lookups(rep)
    mutations = mutation_suite()
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
        "mutation_suite": mutations,
        "memory": {"command": MEMORY_COMMAND, **memory_table()},
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
        "Lookups are fused (torch.nn.functional.embedding_bag per piece): the lookup phase's "
        "allocator-measured transient (torch.profiler memory events) is beside the bytes "
        "the gathered rows would take.", "",
        "| rank | lookups/step | lookup+pool s/step | lookups/s | gathered GB/s | "
        "share of copy bandwidth | lookup transient B | gathered rows B |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in lk["ranks"]:
        tr = r.get("lookup_transient_bytes")
        lines.append(f"| {r['rank']} | {r['lookups_per_step']:,} | {r['lookup_s']:.4f} | "
                     f"{r['lookups_per_s']:,.0f} | {r['gathered_gb_per_s']:.2f} | "
                     f"{r['share_of_copy_bandwidth']:.2f} | "
                     f"{'-' if tr is None else f'{tr:,}'} | {r['gathered_rows_bytes']:,} |")
    mu = p["mutation_suite"]
    lines += ["", "## Mutation suite", "",
              f"Kill rate: **{mu['killed']}/{mu['total']}** deliberate bugs caught by "
              f"`planner execute`'s checks (correct code: "
              f"{'passes every check' if mu['baselines_pass'] else 'FAILS a check'}, the "
              f"allocator-measured memory peak included; a mutant counts as caught only by a "
              f"check other than the memory peak); {mu['seconds']:.0f} s for all runs. 2-rank plan "
              f"(`planner.executor.demo.small_plan`), 3 steps, Adam epsilon 1e-2 (at 1e-8 "
              f"the two epsilon placements differ below fp32's resolution). The same suite "
              f"runs in `tests/executor/test_executor_mutants.py`.", "",
              "| mutant | kind | bug | wire fwd | caught by |", "|---|---|---|---|---|"]
    for r in mu["rows"]:
        by = "; ".join(c.split(" vs ")[0] for c in r["caught_by"]) or (
            "**survived**" if r["kind"] != "baseline" else "nothing fails (correct)")
        lines.append(f"| {r['mutant']} | {r['kind']} | {r['what']} | {r.get('fwd', '')} | "
                     f"{by} |")
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
        other = [f for f in c["checks_failed"] if not f.startswith("memory peak")]
        verdict = ("pass" if c["checks_pass"] else
                   "memory peak only fails" if not other else "FAIL: " + "; ".join(other))
        lines.append(f"| {prec} | " + " | ".join(cells) + f" | {verdict} |")
    if "memory" in p:
        lines += ["", *memory_markdown(p["memory"]), f"Command: `{p['memory']['command']}`."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
