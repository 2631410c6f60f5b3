"""Executor memory benchmark: per rank, the memory model's peak against the peak the allocator
measured, for plans of bundled fixtures, scaled down to run on 4 CPU ranks in minutes.

Each plan: `planner.planning.plan` on a fixture model (fixtures/models) and the H100 preset
cut to 2 hosts x 2 GPUs or 1 x 4, some with little HBM so the planner reaches for caches,
row splits and data-parallel replicas; then `planner execute` of that plan with every table's
rows scaled (--scale-rows) and a smaller batch (the plan's shape kept), 2 warm-up and 5
measured steps, no reference check (memory only).

Predicted: the model's peak for the rank (cost_models.memory: what its pieces hold plus
`step_peak`, the step buffers at the peak over the step's phases), hbm + ddr since a CPU rank
keeps every tier in one memory. Measured: the peak of live bytes in torch's CPU allocator over
the measured steps, from torch.profiler's allocation events (planner/executor/memprobe.py),
not from the model's shapes. Neither counts the hardware's fixed HBM reserve (CUDA context,
NCCL, the dense model), so error = (predicted - measured) / measured is the error above it.

Usage (repo root): PYTHONPATH=. python -m benchmarks.executor --memory
"""

import json
import statistics
import time
from pathlib import Path
from typing import Any

from planner.executor.job import RunOptions
from planner.executor.run import execute
from planner.plan_model import Plan
from planner.planning import plan
from planner.presets import preset_dict

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "models"
# The plans run, kept: CP-SAT's parallel search may place a table elsewhere on another run,
# so the measured figures are tied to these files (delete one to plan it again).
PLAN_DIR = Path(__file__).resolve().parent / "results" / "executor_plans"
GIB = 2**30


# name: (fixture, hosts, GPUs per host, HBM capacity per GPU or None for the preset's,
#        scale_rows, batch per rank)
PLANS: dict[str, tuple[str, int, int, int | None, float, int]] = {
    "kaggle_2x2": ("criteo_kaggle", 2, 2, None, 0.001, 128),
    "kaggle_1x4_256mib": ("criteo_kaggle", 1, 4, GIB // 4, 0.001, 128),
    "rm3_2x2": ("deeprecsys_rm3", 2, 2, None, 0.002, 64),
    "rm1_1x4_1gib": ("deeprecsys_rm1", 1, 4, GIB, 0.002, 32),
    "dcnv2_2x2": ("criteo_dcnv2", 2, 2, None, 0.0002, 32),
    "dcnv2_2x2_16gib": ("criteo_dcnv2", 2, 2, 16 * GIB, 0.0002, 32),
}


def request(fixture: str, hosts: int, gpus: int, hbm: int | None) -> dict[str, Any]:
    model = json.loads((FIXTURES / f"{fixture}.json").read_text())
    for k in ("description", "provenance", "notes"):
        model.pop(k, None)
    hw = preset_dict("h100")
    hw.update(hosts=hosts, gpus_per_host=gpus)
    if hbm is not None:  # the whole card is this small: no reserve either
        hw["gpu"]["hbm_capacity_bytes"] = hbm
        hw["gpu"]["hbm_reserved_bytes"] = 0
    return {"model": model, "hardware": hw}


def run_plan(name: str) -> dict[str, Any]:
    fixture, hosts, gpus, hbm, scale, batch = PLANS[name]
    path = PLAN_DIR / f"{name}.plan.json"
    t0 = time.perf_counter()
    if path.exists():
        p = Plan.model_validate_json(path.read_text())
    else:
        p = plan(request(fixture, hosts, gpus, hbm))
        PLAN_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(p.model_dump_json(indent=1) + "\n")
    plan_s = time.perf_counter() - t0
    kinds = sorted({f"{t.sharding_type.value}/{t.tier.value}" for t in p.tables})
    t0 = time.perf_counter()
    rep = execute(p, RunOptions(steps=5, warmup_steps=2, collective_timeout_s=300),
                  scale_rows=scale, batch=batch, timeout_s=900, reference=False)
    run_s = time.perf_counter() - t0
    ranks = []
    for r in rep.ranks:
        pm = r["peak_memory"]
        ranks.append({
            "rank": r["rank"], "predicted": pm["predicted"],
            "measured": pm["measured_step_peak"], "ratio": pm["ratio"],
            "error": pm["error"], "predicted_held": pm["predicted_held"],
            "predicted_step_buffers": pm["predicted_step_buffers"],
            "measured_held_after_init": pm["held_after_init"],
            "plan_bound": pm["plan_bound"],
            "peak_phase": max(pm["phase_peak"], key=pm["phase_peak"].get),
            "buffer_terms": pm["predicted_buffer_terms"]})
    peak_check = next(c for c in rep.checks if c.name.startswith("memory peak"))
    return {"plan_file": str(path.relative_to(PLAN_DIR.parent.parent.parent)),
            "fixture": fixture, "hosts": hosts, "gpus_per_host": gpus, "hbm_bytes": hbm,
            "scale_rows": scale, "batch": batch, "plan_hash": p.plan_hash, "kinds": kinds,
            "plan_s": plan_s, "run_s": run_s, "ranks": ranks,
            "peak_check": {"ok": peak_check.ok, "detail": peak_check.detail},
            "other_checks_failed": [c.name for c in rep.checks
                                    if not c.ok and c is not peak_check]}


def memory_table(names: list[str] | None = None) -> dict[str, Any]:
    plans = {n: run_plan(n) for n in (names or list(PLANS))}
    ranks = [r for p in plans.values() for r in p["ranks"]]
    errors = [abs(r["error"]) for r in ranks]
    return {
        "plans": plans,
        "fixtures": sorted({p["fixture"] for p in plans.values()}),
        "rank_count": len(ranks),
        "measured_le_predicted_everywhere": all(r["measured"] <= r["predicted"]
                                                for r in ranks),
        "median_abs_error": statistics.median(errors),
        "max_abs_error": max(errors),
    }


def markdown(mem: dict[str, Any]) -> list[str]:
    lines = [
        "## Memory: the model's peak vs the allocator's, per rank", "",
        f"{len(mem['plans'])} plans of {len(mem['fixtures'])} fixtures "
        f"({', '.join(mem['fixtures'])}), planned at full size, run scaled down on 4 CPU "
        "ranks (gloo), 2 warm-up and 5 measured steps. Predicted: what the rank's pieces "
        "hold (weights, optimizer state, caches, their metadata and policy state; hbm + ddr, "
        "one memory on a CPU) plus the step buffers at the step's peak over its phases "
        "(`cost_models.memory.step_peak`). Measured: the peak of live bytes in torch's CPU "
        "allocator over the measured steps (torch.profiler memory events, "
        "`planner/executor/memprobe.py`). Neither counts the fixed HBM reserve, so the "
        "error, (predicted - measured) / measured, is the error above it. The plan's own "
        "per-GPU figure (the planner's bound: each piece's largest transient added) is "
        "beside them.", "",
        f"**Measured <= predicted on every rank: "
        f"{'yes' if mem['measured_le_predicted_everywhere'] else 'NO'}**; median |error| "
        f"**{mem['median_abs_error'] * 100:.1f}%** over {mem['rank_count']} ranks (largest "
        f"{mem['max_abs_error'] * 100:.1f}%).", "",
        "| plan | sharding/tier | rows x | batch | rank | predicted B | measured B | ratio | "
        "error | peak phase | plan bound B |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name, p in mem["plans"].items():
        for i, r in enumerate(p["ranks"]):
            head = (f"{name} | {', '.join(p['kinds'])} | {p['scale_rows']:g} | {p['batch']}"
                    if i == 0 else " | | |")
            lines.append(f"| {head} | {r['rank']} | {r['predicted']:,} | {r['measured']:,} | "
                         f"{r['ratio']:.3f} | {r['error'] * 100:+.1f}% | {r['peak_phase']} | "
                         f"{r['plan_bound']:,} |")
    lines += ["", "Run times (s): " + "; ".join(
        f"{n} plan {p['plan_s']:.1f}, execute {p['run_s']:.1f}" for n, p in
        mem["plans"].items()), ""]
    failed = {n: p["other_checks_failed"] for n, p in mem["plans"].items()
              if p["other_checks_failed"]}
    if failed:
        # 2 warm-up steps, not the caches' own warm-up (planner/executor/warmup.py): a cache's
        # hit rate is not yet its policy's steady state, which benchmarks/executor_matrix.py
        # and benchmarks/cache_hit.py check with the default warm-up.
        lines += ["Other checks failing in these runs (not memory; 2 warm-up steps, not the "
                  "caches' own warm-up, so a cache is not at its policy's steady state: the "
                  "hit rate is checked with the default warm-up by `executor_matrix` and "
                  "`cache_hit`): " + "; ".join(
                      f"{n}: {', '.join(c)}" for n, c in failed.items()), ""]
    return lines
