"""Cache hit rates: the executor's caches measured against their policy's model.

Part 1, the store alone (planner/executor/store.py's CachedStore, fed the executor's synthetic
ids): a table of 20,000 rows, a cache of 10% (2,000 slots), batches of 4,096 lookups; the
warm-up planner/executor/warmup.py sizes, then 30 measured batches. Predicted: LFU's steady
state (the top rows' access share) or LRU by Che's approximation (cost_models/cache_policy.py).
Hit rate per lookup: ids looked up whose row the cache held when the batch started.
Part 2, `planner execute` end to end: the all-types demo plan (4 gloo ranks, batch 64, 5 steps,
default warm-up) under each policy; every cached piece's measured and predicted hit rate.

Usage (from the repo root):
    PYTHONPATH=. python -m benchmarks.cache_hit   # writes benchmarks/results/cache_hit.{json,md}
"""

import json
import math
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cost_models import AccessModel, CachePolicy, Tier, UniformAccess, ZipfAccess
from cost_models.cache_policy import policy_hit_rate
from planner.executor import synthetic
from planner.executor.store import CachedStore
from planner.executor.warmup import table_lookups

ROWS, RATIO, PER_STEP, STEPS = 20_000, 0.1, 4096, 30
ACCESSES: list[tuple[str, AccessModel]] = [
    ("uniform", UniformAccess()), ("zipf 0.8", ZipfAccess(0.8)), ("zipf 1.0", ZipfAccess(1.0)),
    ("zipf 1.2", ZipfAccess(1.2)), ("zipf 1.4", ZipfAccess(1.4))]
OUT = Path(__file__).parent / "results"


def store_case(access: AccessModel, policy: CachePolicy) -> dict[str, Any]:
    st = CachedStore(torch.zeros((ROWS, 1)), torch.zeros((ROWS, 0)), Tier.HBM_CACHE, RATIO,
                     torch.device("cpu"), policy)
    warm = math.ceil(table_lookups(access, policy, ROWS, st.slots) / PER_STEP)
    rng = np.random.default_rng(0)
    offsets = torch.arange(0, PER_STEP, 8)
    t0 = time.perf_counter()
    for i in range(warm + STEPS):
        if i == warm:
            st.hits = st.lookups = 0
        ranks = synthetic.popularity_ranks(access, ROWS, PER_STEP, rng)
        st.pool(torch.from_numpy(synthetic.rank_to_row(ranks, ROWS, 1)), offsets)
        st.end_step()
    measured = st.hits / st.lookups
    predicted = policy_hit_rate(access, policy, st.slots, ROWS)
    return {"policy": policy.value, "warmup_steps": warm, "lookups": st.lookups,
            "predicted": predicted, "measured": measured, "abs_error": abs(measured - predicted),
            "seconds": time.perf_counter() - t0}


def execute_cases() -> list[dict[str, Any]]:
    from planner.executor.demo import all_types_plan
    from planner.executor.job import RunOptions
    from planner.executor.run import execute

    out = []
    for policy in CachePolicy:
        t0 = time.perf_counter()
        rep = execute(all_types_plan(batch=64), RunOptions(steps=5, cache_policy=policy.value,
                                                           keep_outputs=False),
                      reference=False)
        check = next(c for c in rep.checks if c.name.startswith("cache hit rate"))
        for p in rep.pieces:
            h = p["hit_rate"]
            if h["predicted"] is None:
                continue
            out.append({"policy": policy.value, "table": p["table"], "piece": p["key"],
                        "tier": p["tier"], "warmup_steps": rep.warmup_steps,
                        "predicted": h["predicted"], "measured": h["measured"],
                        "abs_error": abs(h["measured"] - h["predicted"]),
                        "allowed": h["allowed"], "check_ok": check.ok,
                        "run_seconds": time.perf_counter() - t0})
    return out


def main() -> None:
    store = [{"distribution": name, **store_case(acc, pol)}
             for name, acc in ACCESSES for pol in CachePolicy]
    runs = execute_cases()
    body = {"machine": platform.platform(), "torch": torch.__version__,
            "store": {"rows": ROWS, "cache_ratio": RATIO, "lookups_per_step": PER_STEP,
                      "measured_steps": STEPS, "cases": store},
            "execute": runs}
    OUT.mkdir(exist_ok=True)
    (OUT / "cache_hit.json").write_text(json.dumps(body, indent=1) + "\n")
    lines = ["# Cache hit rate: measured vs the policy's model", "",
             "`PYTHONPATH=. python -m benchmarks.cache_hit` (see its docstring). Hit rate per "
             "lookup.", "",
             f"## The store alone: {ROWS:,} rows, cache {RATIO:g}, {PER_STEP:,} lookups a "
             f"batch, {STEPS} measured batches", "",
             "| policy | distribution | warm-up batches | predicted | measured | abs error |",
             "|---|---|---:|---:|---:|---:|"]
    for c in store:
        lines.append(f"| {c['policy']} | {c['distribution']} | {c['warmup_steps']} | "
                     f"{c['predicted']:.4f} | {c['measured']:.4f} | {c['abs_error']:.4f} |")
    worst = max(c["abs_error"] for c in store)
    lines += ["", f"Largest |error|: {worst * 100:.2f} points.", "",
              "## `planner execute`, all-types demo plan, 4 ranks, batch 64, 5 steps, default "
              "warm-up", "",
              "| policy | table | piece | tier | warm-up | predicted | measured | abs error | "
              "allowed |", "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for r in runs:
        lines.append(f"| {r['policy']} | {r['table']} | {r['piece']} | {r['tier']} | "
                     f"{r['warmup_steps']} | {r['predicted']:.4f} | {r['measured']:.4f} | "
                     f"{r['abs_error']:.4f} | {r['allowed']:.3f} |")
    ok = all(r["check_ok"] for r in runs)
    lines += ["", f"Hit-rate check of `planner execute`: {'passes' if ok else 'FAILS'} under "
              "both policies. `allowed`: max(2 points, 3 widened standard errors) "
              "(run.hit_allowance); small pieces see few lookups in 5 steps.", ""]
    (OUT / "cache_hit.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
