"""Fidelity of the cost model: predicted against measured step time, per plan, rank and phase.

Plans of bundled fixtures (different solvers, host counts, and sharding types and tiers forced
by table constraints; four of them pipelined, `_pipe`), planned at full size on a hardware
profile with the plan's hosts x GPUs, then run by `planner execute` scaled down (fewer rows, a
smaller batch, same pieces) on CPU ranks (gloo) of this machine, measured as `planner execute
--compare` measures (planner/executor/compare.py): per rank and phase, compute as the rank
thread's own CPU time (one thread per rank, pinned), the median over the timed steps,
collectives as wall time after an untimed barrier, their lower quartile; each plan executed
EXECUTIONS times, in rounds that run every plan once (a slow spell of the machine falls on
all plans alike), each rank's figure of each phase the median over the executions. For each
plan: predicted and measured step time (the slowest rank's sum over the compared phases), the
per-rank/phase errors, Spearman over ranks, and whether the predicted slowest rank is the
measured slowest; across plans:
Spearman between predicted and measured step time, the median |error| per rank and phase, the
fraction of plans whose predicted slowest rank is the measured slowest. The whole set runs
twice: Spearman between the two runs' measured step times says whether the ranking is stable.
The same runs are also priced by TorchRec's estimator (`options.estimator` torchrec on the same
scaled layout and hardware, `torchrec_priced`) and summarized beside ours: a referee of the
two cost models against one set of measurements.

Before calibration: plans predicted on the h100 preset (GPU figures against a CPU: the
errors are the distance between the two machines, only the rankings mean anything). After
calibration: when `planner calibrate` exists, it is run on this machine every run (its own
microbenchmarks, never these plans) in sessions beside the passes, one before the first and
one after each (Sessions), and every plan is priced with `--hardware` the fit of all the
sessions (`planner calibrate --from`, each point their median; a kept plan's layout scored
again under it, the executions reported against that); otherwise the results say "not
available".

Usage (from the repo root):
    PYTHONPATH=. python -m benchmarks.fidelity [--only NAME ...] [--runs 2]
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import RESULTS, write_results
from planner.executor.compare import PHASES, spearman
from planner.executor.job import RunOptions
from planner.executor.run import ExecutionReport, execute
from planner.executor.scale import scaled_plan
from planner.plan_model import Plan, PlanLayout
from planner.planning import evaluate, plan, resolve
from planner.presets import preset_dict

COMMAND = "PYTHONPATH=. python -m benchmarks.fidelity"
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "models"
# The plans scored, kept: CP-SAT may place a table elsewhere on another machine, so the
# figures are tied to these files (delete one to plan it again).
PLAN_DIR = RESULTS / "fidelity_plans"
# The calibrated set's calibration sessions (Sessions), kept: the profile is their fit
# (`planner calibrate --from` them gives it again).
SESSIONS_DIR = RESULTS / "fidelity_sessions"
STEPS = 3  # measured steps per run: memory, bytes and cache hit rates
TIMED_STEPS = 11  # timed steps after them (no memory probe): their medians are compared
# Executions of each plan per run, each rank's phase figure the median over them: a rank's
# collectives sometimes run slow for a whole execution (each is its own process group, at a
# level of its own), which no statistic over that execution's steps removes.
EXECUTIONS = 5
# At most one rank per core: more ranks than cores time the scheduler's sharing of a core,
# which no cost model of a cluster prices. The plans here have 2 ranks; calibration measures the
# collectives at this many ranks.
RANKS = max(2, min(4, os.cpu_count() or 2))
TIE = 0.05  # plans whose measured step times are closer than this are a tie for stability
# Stability by the executions themselves: in a run, plan x is measurably faster than plan y
# when its EXECUTIONS steps sit below y's by a one-sided exact Mann-Whitney test at ALPHA
# (5 against 5: all five below all five gives p = 1/252). Two runs contradict each other on a
# pair only where each orders it measurably, and oppositely.
ALPHA = 0.05
MAX_WARMUP = 40  # forward-only steps at most (warmup.py sizes them for the caches)


# name: (fixture, hosts, GPUs per host, solver, forced constraint, tables it applies to
#        (the k largest; negative: the |k| smallest), scale_rows).
PLANS: dict[str, tuple[str, int, int, str, dict[str, Any] | None, int, float]] = {
    "kaggle_1x2_greedy": ("criteo_kaggle", 1, 2, "greedy", None, 0, 0.001),
    "kaggle_2x1_auto": ("criteo_kaggle", 2, 1, "auto", None, 0, 0.001),
    "kaggle_1x2_dp": ("criteo_kaggle", 1, 2, "greedy",
                      {"sharding_types": ["data_parallel"]}, -10, 0.001),
    "kaggle_2x1_rw": ("criteo_kaggle", 2, 1, "greedy",
                      {"sharding_types": ["row_wise"]}, 3, 0.001),
    "rm3_1x2_greedy": ("deeprecsys_rm3", 1, 2, "greedy", None, 0, 0.002),
    "rm3_2x1_ilp": ("deeprecsys_rm3", 2, 1, "ilp", None, 0, 0.002),
    "rm3_1x2_cache": ("deeprecsys_rm3", 1, 2, "greedy",
                      {"memory_tiers": ["hbm_cache"]}, 3, 0.002),
    "rm3_1x2_rw": ("deeprecsys_rm3", 1, 2, "greedy",
                   {"sharding_types": ["row_wise"]}, 2, 0.002),
    "dcnv2_2x1_cw": ("criteo_dcnv2", 2, 1, "greedy",
                     {"sharding_types": ["column_wise"]}, 4, 0.0002),
    "dcnv2_1x2_auto": ("criteo_dcnv2", 1, 2, "auto", None, 0, 0.0002),
    "dcnv2_2x1_ddr": ("criteo_dcnv2", 2, 1, "greedy", {"memory_tiers": ["ddr"]}, 2,
                      0.0002),
    "rm1_2x1_greedy": ("deeprecsys_rm1", 2, 1, "greedy", None, 0, 0.001),
    "rm1_1x2_ssd": ("deeprecsys_rm1", 1, 2, "greedy", {"memory_tiers": ["ssd"]}, 2,
                    0.001),
    "rm1_1x2_auto": ("deeprecsys_rm1", 1, 2, "auto", None, 0, 0.001),
    # Pipelined (model.pipelined): the executor runs each step's input all-to-all on its
    # input lane beside the previous step's work (planner/executor/input_lane.py).
    "kaggle_2x1_pipe": ("criteo_kaggle", 2, 1, "greedy", None, 0, 0.001),
    "rm3_1x2_pipe": ("deeprecsys_rm3", 1, 2, "greedy", None, 0, 0.002),
    "dcnv2_2x1_pipe": ("criteo_dcnv2", 2, 1, "greedy", {"sharding_types": ["row_wise"]}, 2,
                       0.0002),
    "rm1_1x2_pipe": ("deeprecsys_rm1", 1, 2, "auto", None, 0, 0.001),
}
# Samples per rank of each plan, per set (the preset's and the calibrated layouts are other
# plans): chosen so that each set's measured steps sit 5% or more apart, from a sweep of
# every plan at two batches on this machine (a1d231f's code: step against batch, a line
# each), then seven of them moved after 19047e5's run (its steps at these batches: two pairs
# had landed 0.2% and 2.2% apart, the lines' extrapolation off by up to 30%). Plans a few
# percent apart are ties no measurement on a shared machine orders alike twice (a1d231f's
# run: 5 such pairs swapped between the passes, 0.2-7% apart), and stability is the order
# of the plans' steps.
BATCHES: dict[str, dict[str, int]] = {
    "preset": {
        "kaggle_1x2_greedy": 192, "kaggle_2x1_auto": 432, "kaggle_1x2_dp": 784,
        "kaggle_2x1_rw": 56, "rm3_1x2_greedy": 32, "rm3_2x1_ilp": 256, "rm3_1x2_cache": 64,
        "rm3_1x2_rw": 688, "dcnv2_2x1_cw": 48, "dcnv2_1x2_auto": 112, "dcnv2_2x1_ddr": 120,
        "rm1_2x1_greedy": 52, "rm1_1x2_ssd": 64, "rm1_1x2_auto": 440, "kaggle_2x1_pipe": 256,
        "rm3_1x2_pipe": 552, "dcnv2_2x1_pipe": 96, "rm1_1x2_pipe": 48,
    },
    "calibrated": {
        "kaggle_1x2_greedy": 640, "kaggle_2x1_auto": 312, "kaggle_1x2_dp": 560,
        "kaggle_2x1_rw": 744, "rm3_1x2_greedy": 16, "rm3_2x1_ilp": 416, "rm3_1x2_cache": 512,
        "rm3_1x2_rw": 156, "dcnv2_2x1_cw": 104, "dcnv2_1x2_auto": 8, "dcnv2_2x1_ddr": 10,
        "rm1_2x1_greedy": 88, "rm1_1x2_ssd": 80, "rm1_1x2_auto": 216, "kaggle_2x1_pipe": 80,
        "rm3_1x2_pipe": 24, "dcnv2_2x1_pipe": 304, "rm1_1x2_pipe": 100,
    },
}


def shape(name: str, tag: str) -> tuple[float, int]:
    """(scale_rows, batch per rank) plan `name` of set `tag` runs at."""
    return PLANS[name][6], BATCHES[tag][name]


PIPELINED = {n for n in PLANS if n.endswith("_pipe")}


def request(name: str, hardware: dict[str, Any]) -> dict[str, Any]:
    fixture, hosts, gpus, solver, force, k, _ = PLANS[name]
    model = json.loads((FIXTURES / f"{fixture}.json").read_text())
    for key in ("description", "provenance", "notes"):
        model.pop(key, None)
    if force:
        by_rows = sorted(model["tables"], key=lambda t: t["num_embeddings"], reverse=k > 0)
        for t in by_rows[:abs(k)]:
            t["constraints"] = {**t.get("constraints", {}), **force}
    hw = json.loads(json.dumps(hardware))
    if "calibrated" in hw.get("name", ""):
        # A calibrated profile's SSD rate is its measured rate per rank times its own
        # gpus_per_host (the model shares a host's drive among its GPUs); here each rank
        # reads the page cache on a core of its own at that measured rate, however many
        # ranks a host has, so the host's rate scales with the plan's GPUs per host.
        hw["host"] = {**hw["host"], "ssd_bandwidth_gb_per_s":
                      float(hw["host"]["ssd_bandwidth_gb_per_s"]) * gpus
                      / int(hw["gpus_per_host"])}
    hw.update(hosts=hosts, gpus_per_host=gpus)
    model["pipelined"] = name in PIPELINED
    return {"model": model, "hardware": hw,
            "options": {"solver": solver, "time_limit_s": 1.0}}


def plan_for(name: str, hardware: dict[str, Any], tag: str) -> tuple[Plan, Path]:
    """The plan of `name` on `hardware`: its kept layout (PLAN_DIR), scored again by
    planning.evaluate when the kept file was made on other hardware (a fresh calibration),
    so the prediction is this machine's; planned (and kept) when there is none."""
    path = PLAN_DIR / tag / f"{name}.plan.json"
    req = request(name, hardware)
    if path.exists():
        kept = Plan.model_validate_json(path.read_text())
        resolved = resolve(req)
        if kept.request.hardware == resolved.hardware:
            return kept, path
        p = evaluate(PlanLayout(schema_version=kept.schema_version, request=resolved,
                                tables=kept.tables))
        path.write_text(p.model_dump_json(indent=1) + "\n")
        return p, path
    p = plan(req)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(p.model_dump_json(indent=1) + "\n")
    return p, path


def warmup_for(p: Plan, scale: float, batch: int) -> int:
    """Forward-only steps so the scaled plan's caches reach their steady state (at most
    MAX_WARMUP)."""
    from planner.executor.warmup import warmup_steps

    return min(MAX_WARMUP, warmup_steps(scaled_plan(p, scale, batch)))


def timed_execution(p: Plan, scale: float, batch: int, warm: int) -> ExecutionReport:
    """One `planner execute` of the plan scaled down, measured as this benchmark measures:
    STEPS checked steps, then TIMED_STEPS timed ones (no reference check)."""
    return execute(p, RunOptions(steps=STEPS, timed_steps=TIMED_STEPS, warmup_steps=warm,
                                 collective_timeout_s=300),
                   scale_rows=scale, batch=batch, timeout_s=900, reference=False)


def sequential_twin(p: Plan) -> Plan:
    """The same layout with the step not pipelined, scored by planning.evaluate: what the
    pipelined plan's measured gain is held to."""
    model = p.request.model.model_copy(update={"pipelined": False})
    request = p.request.model_copy(update={"model": model})
    return evaluate(PlanLayout(schema_version=p.schema_version, request=request,
                               tables=p.tables))


def torchrec_priced(p: Plan, name: str, tag: str) -> Plan | str:
    """The run's plan (scaled down as it runs) priced by TorchRec's estimator instead
    (options.estimator = torchrec, the same layout and hardware), or why it cannot be."""
    from planner.errors import PlannerError

    scale, batch = shape(name, tag)
    options = p.request.options.model_copy(update={"estimator": "torchrec"})
    request = p.request.model_copy(update={"options": options})
    try:
        full = evaluate(PlanLayout(schema_version=p.schema_version, request=request,
                                   tables=p.tables))
        return scaled_plan(full, scale, batch)
    except (PlannerError, ImportError) as e:
        return f"{type(e).__name__}: {e}"


@dataclass(frozen=True)
class Executed:
    """One plan's executions in a pass: their reports, the seconds they took, the warmup
    steps each ran."""

    reps: list[ExecutionReport]
    run_s: float
    warm: int


def executed_rounds(items: list[tuple[str, Plan, Plan | str | None]], tag: str
                    ) -> list[Executed]:
    """Every (name, plan, _) executed EXECUTIONS times, in rounds: each round runs every
    plan once, in order, so a slow spell of this shared machine (minutes long) falls on
    every plan alike instead of on the few that ran during it, and the plans' order is
    kept. Each plan at its shape in set `tag`."""
    warm = [warmup_for(p, *shape(n, tag)) for n, p, _ in items]
    reps: list[list[ExecutionReport]] = [[] for _ in items]
    took = [0.0] * len(items)
    for _ in range(EXECUTIONS):
        for i, (n, p, _) in enumerate(items):
            t0 = time.perf_counter()
            reps[i].append(timed_execution(p, *shape(n, tag), warm[i]))
            took[i] += time.perf_counter() - t0
    return [Executed(reps[i], took[i], warm[i]) for i in range(len(items))]


def reported_runs(items: list[tuple[str, Plan, Plan | str | None]], executed: list[Executed],
                  tag: str) -> list[dict[str, Any]]:
    """Each (name, plan, referee)'s executions reported against the plan's prediction (the
    plan priced under the profile the figures are held to: the same pieces as the plan
    that ran; what the executor runs reads no cost constant, and compare prices the plan it
    is given, the executor's whole all-reduce calls included)."""
    return [reported(scaled_plan(p, *shape(n, tag)), e.reps, e.run_s, e.warm, referee)
            for (n, p, referee), e in zip(items, executed, strict=True)]


def reported(run: Plan, reps: list[ExecutionReport], run_s: float, warm: int,
             referee: Plan | str | None = None) -> dict[str, Any]:
    """A plan's executions compared with the prediction of `run` (the plan as it ran,
    scaled), each rank's figure of each phase the median over the executions
    (compare.measured_over: each execution is its own process group, whose collectives run
    at a level of their own); the cache hit rate from the execution whose measured step is
    the median. `referee`: the same scaled plan priced by TorchRec's estimator
    (torchrec_priced), compared with the same measurements (no whole-call correction: that
    is the analytic model's, predict.whole_call_seconds)."""
    from planner.executor.compare import compare

    steps = [r.compare["plan"]["measured_step_s"] for r in reps]
    # Each execution's step in each clock, for the executions' own ordering of plans
    # (measurably_faster): execute's own comparison is in wall time (its default clock).
    each = {c: steps if c == "wall" else
            [compare(run, r.ranks, "cpu", collective_clock=c)["plan"]["measured_step_s"]
             for r in reps] for c in CLOCKS}
    rep = reps[sorted(range(len(reps)), key=lambda i: steps[i])[len(reps) // 2]]
    hit = next((ch for ch in rep.checks if ch.name.startswith("cache hit rate")), None)
    more = [r.ranks for r in reps if r is not rep]
    out: dict[str, Any] = {
        "run_s": run_s, "warmup_steps": warm,
        "executions_measured_step_s": steps,
        "executions_step_s_by_clock": each,
        "by_clock": {c: compare(run, rep.ranks, "cpu", collective_clock=c, repeats=more)
                     for c in CLOCKS},
        "hit_rate_check": None if hit is None else {"ok": hit.ok, "detail": hit.detail},
        "checks_failed": sorted({ch.name for r in reps for ch in r.checks if not ch.ok}),
        # Which of the executions failed which check, and its detail: enough to trace a
        # rare failure (a memory check over the model in one execution of five); for a
        # memory check, each rank's measurement too (what was alive at its peak, by phase
        # and operator; the blocks freed on a gloo thread the probe caught).
        "checks_failed_detail": [{"execution": i, "check": ch.name, "detail": ch.detail,
                                  **({"peak_memory": [rk.get("peak_memory") for rk in r.ranks]}
                                     if ch.name.startswith("memory peak") else {})}
                                 for i, r in enumerate(reps) for ch in r.checks
                                 if not ch.ok]}
    if isinstance(referee, Plan):
        out["torchrec_by_clock"] = {c: compare(referee, rep.ranks, "cpu", collective_clock=c,
                                               repeats=more) for c in CLOCKS}
    elif referee is not None:
        out["torchrec_not_priced"] = referee
    return out


CLOCKS = ("wall", "cpu")  # how collectives are measured (compare.COLLECTIVE_CLOCKS)


def measurably_faster(x: list[float], y: list[float]) -> bool:
    """Whether steps `x` sit below steps `y` beyond chance: a one-sided exact Mann-Whitney
    test (scipy) at ALPHA."""
    from scipy.stats import mannwhitneyu

    return bool(mannwhitneyu(x, y, alternative="less", method="exact").pvalue < ALPHA)


def ordered_pairs(plans: dict[str, dict[str, Any]], clock: str) -> dict[tuple[str, str], int]:
    """(x, y) -> -1 where x's executions are measurably faster than y's, +1 where slower;
    pairs the executions do not order are left out."""
    names = sorted(plans)
    out = {}
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            ex = plans[x]["executions_step_s_by_clock"][clock]
            ey = plans[y]["executions_step_s_by_clock"][clock]
            if measurably_faster(ex, ey):
                out[(x, y)] = -1
            elif measurably_faster(ey, ex):
                out[(x, y)] = 1
    return out


def stability(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]], c: str,
              names: list[str] | None = None) -> dict[str, Any]:
    """How two runs' plans (name -> `reported`) agree on the plans' order in clock `c`: by
    their measured steps (Spearman, pairs swapped, swapped beyond TIE) and, where each
    execution's step is kept, by the executions themselves (ordered_pairs). `names`: the
    plans in the order pairs are named (default sorted)."""
    names = sorted(a) if names is None else names

    def step(r: dict[str, Any], n: str) -> float:
        return float(r[n]["by_clock"][c]["plan"]["measured_step_s"])

    def apart(x: str, y: str, r: dict[str, Any]) -> float:
        return abs(step(r, x) / step(r, y) - 1)

    swaps = [(x, y) for i, x in enumerate(names) for y in names[i + 1:]
             if (step(a, x) - step(a, y)) * (step(b, x) - step(b, y)) < 0]
    out: dict[str, Any] = {
        "spearman": spearman([step(a, n) for n in names], [step(b, n) for n in names]),
        "same_order": not swaps,
        # Pairs the two runs order differently, and those of them more than TIE apart in
        # both runs (a near-tie's order is noise).
        "swapped": [list(s) for s in swaps],
        "swapped_beyond_tie": [list(s) for s in swaps if min(apart(*s, a), apart(*s, b)) > TIE]}
    if all("executions_step_s_by_clock" in r for r in (*a.values(), *b.values())):
        oa, ob = ordered_pairs(a, c), ordered_pairs(b, c)
        both = [k for k in oa if k in ob]
        out.update({
            # Pairs each run's executions order (Mann-Whitney, ALPHA), and of those ordered
            # by both, the ones ordered oppositely: what stability forbids.
            "ordered_in_run": [len(oa), len(ob)],
            "ordered_in_both": len(both),
            "contradicted": [list(k) for k in both if oa[k] != ob[k]],
            "pairs": len(names) * (len(names) - 1) // 2})
    return out


def summarize(all_plans: dict[str, dict[str, Any]], clock: str) -> dict[str, Any]:
    """Across plans: Spearman of step times, median |error| per rank and phase, slowest."""
    plans = {n: {**r["by_clock"][clock], "hit_rate_check": r["hit_rate_check"]}
             for n, r in all_plans.items()}
    names = sorted(plans)
    pred = [plans[n]["plan"]["predicted_step_s"] for n in names]
    meas = [plans[n]["plan"]["measured_step_s"] for n in names]
    errs: dict[str, list[float]] = {ph: [] for ph in PHASES}
    signed: dict[str, list[float]] = {ph: [] for ph in PHASES}
    for n in names:
        for r in plans[n]["ranks"]:
            for ph, v in r["phases"].items():
                if ph in errs and v["error"] is not None:
                    errs[ph].append(abs(v["error"]))
                    signed[ph].append(v["error"])
    every = [e for v in errs.values() for e in v]
    decided = [1.0 if plans[n]["plan"]["slowest_match"] else 0.0 for n in names
               if plans[n]["plan"]["slowest_match"] is not None]
    return {
        "spearman_step": spearman(pred, meas),
        "median_abs_error": statistics.median(every) if every else None,
        "median_abs_error_by_phase": {ph: statistics.median(v) if v else None
                                      for ph, v in errs.items()},
        # Which way each phase errs: below 0, predicted short of the measurement.
        "median_error_by_phase": {ph: statistics.median(v) if v else None
                                  for ph, v in signed.items()},
        # Over the plans that predict a slowest rank (not every rank alike).
        "slowest_match_fraction": statistics.fmean(decided) if decided else None,
        "slowest_undecided": len(names) - len(decided),
        "hit_rate_checks_passed": sum(1 for n in names if (plans[n]["hit_rate_check"] or {})
                                      .get("ok", True)),
        "plans": len(names),
        **model_on_ordered_pairs(all_plans, clock),
    }


def run_summaries(res: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A run's summaries per clock: every plan, the pipelined ones alone, and the same runs
    priced by TorchRec's estimator."""
    piped = {n: r for n, r in res.items() if n in PIPELINED}
    by_torchrec = {n: {**r, "by_clock": r["torchrec_by_clock"]} for n, r in res.items()
                   if "torchrec_by_clock" in r}
    return {"summary": {c: summarize(res, c) for c in CLOCKS},
            "summary_pipelined": ({c: summarize(piped, c) for c in CLOCKS}
                                  if piped else None),
            "summary_torchrec": ({c: summarize(by_torchrec, c) for c in CLOCKS}
                                 if by_torchrec else None)}


def model_on_ordered_pairs(all_plans: dict[str, dict[str, Any]], clock: str
                           ) -> dict[str, Any]:
    """Of the pairs of plans the executions order beyond chance (ordered_pairs), those the
    model's predicted steps order the other way: Spearman's misses that are not noise."""
    if not all("executions_step_s_by_clock" in r for r in all_plans.values()):
        return {}
    ordered = ordered_pairs(all_plans, clock)

    def pred(n: str) -> float:
        return float(all_plans[n]["by_clock"][clock]["plan"]["predicted_step_s"])

    against = [[x, y] for (x, y), o in ordered.items() if (pred(x) - pred(y)) * o < 0]
    return {"ordered_pairs": len(ordered), "model_orders_against": against}


def code_state() -> dict[str, Any]:
    """The commit, and which tracked files differ from it (the run measured those too)."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True,
                              cwd=RESULTS.parent.parent).stdout

    # Not stripped: a status line starts with a space (" M path").
    # What the run writes itself (its plans and profile under benchmarks/results/) is not
    # code that differs from the commit.
    return {"commit": git("rev-parse", "HEAD").strip(),
            "modified": [ln[3:] for ln in git("status", "--short", "--untracked-files=no")
                         .splitlines()
                         if ln.strip() and not ln[3:].startswith("benchmarks/results/")]}


def calibrate_available() -> bool:
    exe = shutil.which("planner")
    if exe is None:
        return False
    return subprocess.run([exe, "calibrate", "--help"], capture_output=True).returncode == 0


def made_here(profile: Path) -> bool:
    """Whether the profile's provenance names this machine's platform (kernel build
    included) and host name."""
    prov = profile.with_suffix(".provenance.json")
    if not prov.exists():
        return False
    got = json.loads(prov.read_text())
    return got.get("platform") == platform.platform() and got.get("host") == platform.node()


def calibrated_hardware(reuse: bool = False) -> dict[str, Any] | None:
    """`planner calibrate` on this machine (its microbenchmarks, not the plans scored; about
    70 s), as a hardware spec; None when the command does not exist. Run every time: a
    profile kept from another machine is not this one's (the kept profile of 11-24 was made
    on another kernel build, fc-v657, and this machine's kernel constants came out 0.5-1.5x
    of it). `reuse`: keep the profile there is, if it was made on this machine (made_here)."""
    if not calibrate_available():
        return None
    out = RESULTS / "fidelity_profile.json"
    if not (reuse and out.exists() and made_here(out)):
        calibrate(out)
    return json.loads(out.read_text())


def calibrate(out: Path, sessions: list[Path] | None = None) -> None:
    """`planner calibrate` writing `out`: a session on this machine, or with `sessions` the
    fit of those sessions' measurements (each point their median, `--from`)."""
    fit = [a for s in sessions or [] for a in ("--from", str(s))]
    measure = [] if sessions else ["--device", "cpu", "--world-size", str(RANKS)]
    subprocess.run(["planner", "calibrate", *measure, *fit, "--quiet", "-o", str(out)],
                   check=True)


class Sessions:
    """The calibrated set's calibration, measured beside the runs it is to predict: one
    session before the first pass, one after each (SESSIONS_DIR), and the profile the
    median of them all (`planner calibrate --from`). A single session here sat 25-34% off
    the executions it predicted when a slow spell fell on it (7f82960); three sessions
    spanning the passes put the machine's drift inside the median."""

    def __init__(self) -> None:
        shutil.rmtree(SESSIONS_DIR, ignore_errors=True)
        SESSIONS_DIR.mkdir(parents=True)
        self.paths: list[Path] = []

    def measure(self) -> dict[str, Any]:
        """One more session; the profile it alone fits (what the plans run under until
        the last: execution does not read the cost constants)."""
        path = SESSIONS_DIR / f"session{len(self.paths)}.json"
        calibrate(path)
        self.paths.append(path)
        return json.loads(path.read_text())

    def profile(self) -> dict[str, Any]:
        """The fit of every session so far, written as the run's profile."""
        out = RESULTS / "fidelity_profile.json"
        calibrate(out, [p.with_suffix(".provenance.json") for p in self.paths])
        return json.loads(out.read_text())

    def summary(self) -> dict[str, Any]:
        """When each session ran and how far each sat from the median (the profile's
        provenance: session_spread)."""
        prov = json.loads((RESULTS / "fidelity_profile.provenance.json").read_text())
        return {"dates": [s["date"] for s in prov["sessions"]],
                "files": [str(Path(s["file"]).relative_to(RESULTS.parent.parent))
                          for s in prov["sessions"]],
                "spread": prov["session_spread"]}


def run_set(hardware: dict[str, Any], tag: str, names: list[str], runs: int,
            sessions: Sessions | None = None) -> dict[str, Any]:
    """Every plan of `names` executed in `runs` passes (executed_rounds each) and compared with
    its prediction on `hardware`; with `sessions`, a calibration session after each pass
    and the predictions those of every session's median profile (out["profile"])."""
    plans = {n: plan_for(n, hardware, tag) for n in names}
    out: dict[str, Any] = {"runs": []}
    # One untimed run first: the launcher's first start (its forkserver importing torch)
    # overlapped the first plan's steps and slowed its collectives 2-3x (measured).
    executed_rounds([(names[0], plans[names[0]][0], None)], tag)

    def twins_of(plans: dict[str, tuple[Plan, Path]]) -> dict[str, Plan]:
        # Each pipelined plan runs beside its sequential twin (the same layout run in turn).
        return {n: sequential_twin(plans[n][0]) for n in names if n in PIPELINED}

    twins = twins_of(plans)
    items = [(n, plans[n][0], None) for n in names]
    items += [(n, twin, None) for n, twin in twins.items()]
    executed = []
    for _ in range(runs):
        executed.append(executed_rounds(items, tag))
        if sessions is not None:
            sessions.measure()
    if sessions is not None:
        hardware = sessions.profile()
        out["profile"] = "benchmarks/results/fidelity_profile.json"
        out["sessions"] = sessions.summary()
        plans = {n: plan_for(n, hardware, tag) for n in names}
        twins = twins_of(plans)
    # The same runs priced by TorchRec's estimator too: a referee of the two cost models.
    referees = {n: torchrec_priced(plans[n][0], n, tag) for n in names}
    priced = [(n, plans[n][0], referees[n]) for n in names]
    priced += [(n, twin, None) for n, twin in twins.items()]
    for i, ex in enumerate(executed):
        res = {}
        done = reported_runs(priced, ex, tag)
        by_name = dict(zip(names, done[:len(names)], strict=True))
        twin_of = dict(zip(twins, done[len(names):], strict=True))
        for n in names:
            p, path = plans[n]
            r = by_name[n]
            r.update(plan_file=str(path.relative_to(RESULTS.parent.parent)),
                     plan_hash=p.plan_hash,
                     kinds=sorted({f"{t.sharding_type.value}/{t.tier.value}"
                                   for t in p.tables}),
                     solver=PLANS[n][3], hosts=PLANS[n][1], gpus_per_host=PLANS[n][2],
                     scale_rows=PLANS[n][6], batch=BATCHES[tag][n], fixture=PLANS[n][0])
            if n in twins:
                twin = twin_of[n]
                r["sequential_twin"] = {c: {k: twin["by_clock"][c]["plan"][k] for k in
                                            ("predicted_step_s", "measured_step_s")}
                                        for c in CLOCKS}
            res[n] = r
            pw, pc = (r["by_clock"][c]["plan"] for c in CLOCKS)
            print(f"[{tag} run {i + 1}] {n}: predicted {pw['predicted_step_s']:.3g} s, "
                  f"measured {pw['measured_step_s']:.3g} s (collectives in CPU time: "
                  f"{pc['measured_step_s']:.3g} s), slowest "
                  f"{ {True: 'match', False: 'differ', None: 'tie'}[pw['slowest_match']]} "
                  f"({r['run_s']:.1f} s)", flush=True)
        out["runs"].append({"plans": res, **run_summaries(res)})
    if runs >= 2:
        a, b = (out["runs"][k]["plans"] for k in (0, 1))
        out["stability"] = {c: stability(a, b, c, names) for c in CLOCKS}
    return out


def _f(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x * 100:.1f}%" if pct else f"{x:.3g}"


def sessions_lines(got: dict[str, Any]) -> list[str]:
    """The calibration sessions' lines: when each ran and how far each sat from the
    median the profile fits."""
    spread = got["spread"]
    kinds = [k for k in ("lookup", "backward", "host", "step_alltoall", "alltoall",
                         "allreduce") if k in spread]
    return [f"Calibrated by {len(got['dates'])} `planner calibrate` sessions beside the "
            "passes (before the first, after each; "
            f"`{SESSIONS_DIR.relative_to(RESULTS.parent.parent)}/`), at "
            + ", ".join(got["dates"]) + "; the profile is their fit, each point the median "
            "over them (`planner calibrate --from`). Each session's median time over the "
            "median's, per kind of point: "
            + "; ".join(f"{k} " + " / ".join(_f(x) for x in spread[k]["session_over_median"])
                        for k in kinds) + ".", ""]


def markdown(body: dict[str, Any]) -> str:
    lines = [
        "# Fidelity: predicted against measured step time", "",
        f"Command: `{body['command']}`. Machine: {body['machine']}; load average "
        f"{body['load_before']} before, {body['load_after']} after; {body['seconds']:.0f} s.",
        "",
        f"Code: commit {body.get('code', {}).get('commit', '?')[:10]}"
        + (f" with uncommitted changes to {', '.join(body['code']['modified'])} (other "
           "sessions' work in progress: the cost model and `planner calibrate` as they "
           "stood then)" if body.get("code", {}).get("modified") else "") + "."
        + (f" Summaries and stability recomputed from the stored executions by "
           f"`{body['resummarized']['command']}` at commit "
           f"{body['resummarized']['code']['commit'][:10]} (no run)."
           if "resummarized" in body else ""), "",
        "Measured as `planner execute --compare` does (README, Executor): per rank and "
        "phase, compute as the rank thread's own CPU time (one thread per rank) and its "
        "median, collectives as wall time after an untimed barrier and their lower "
        f"quartile, over {TIMED_STEPS} timed steps (run after {STEPS} measured ones, the "
        "memory probe stopped), each rank pinned to a core of its own (gloo's threads "
        f"with it); each plan executed {EXECUTIONS} times per run, in rounds that run "
        "every plan (and each pipelined plan's sequential twin) once, each rank's "
        "figure of each phase the median over the executions (each its own process "
        "group); a plan's step time is its slowest "
        "rank's sum over the compared phases (a pipelined plan's, `_pipe`: its phases but "
        "the input all-to-all, which ran on the input lane beside the previous step, plus "
        "the step's wait for the lane; predicted: comm + max(0, compute - input all-to-all)"
        "). Error = predicted / measured - 1.", ""]
    for tag, title in (("preset", "Before calibration (h100 preset)"),
                       ("calibrated", "After calibration")):
        sec = body.get(tag)
        lines += [f"## {title}", ""]
        if sec is None:
            lines += [body.get("calibration_note", "not available"), ""]
            continue
        if sec.get("sessions"):
            lines += sessions_lines(sec["sessions"])
        if tag == "preset":
            lines += ["Predicted for H100s, measured on this CPU: the machine measured is "
                      "not the one predicted, so the errors only say how far apart the two "
                      "machines are; the rankings are the test.", ""]
        for clock, how in (("wall", "collectives in wall time after a barrier"),
                           ("cpu", "collectives in their threads' CPU time")):
            lines += [f"### {how}", ""]
            for i, run in enumerate(sec["runs"]):
                for key, which in (("summary", "plans"),
                                   ("summary_pipelined", "pipelined plans (`_pipe`) alone"),
                                   ("summary_torchrec", "the same runs priced by TorchRec's "
                                    "estimator (options.estimator torchrec, same hardware "
                                    "profile)")):
                    if not run.get(key):
                        continue
                    sm = run[key][clock]
                    lines += [
                        f"Run {i + 1}, {which}: Spearman(predicted, measured step) "
                        f"{_f(sm['spearman_step'])} over {sm['plans']} plans; median |error| "
                        f"per rank and phase {_f(sm['median_abs_error'], True)} ("
                        + ", ".join(f"{ph} {_f(v, True)}"
                                    for ph, v in sm["median_abs_error_by_phase"].items())
                        + f"); predicted slowest rank = measured slowest in "
                        f"{_f(sm['slowest_match_fraction'], True)} of the plans that predict "
                        f"one ({sm['slowest_undecided']} predict every rank alike); hit-rate "
                        f"checks passed in {sm['hit_rate_checks_passed']}/{sm['plans']}"
                        + (f"; of the {sm['ordered_pairs']} pairs of plans the executions "
                           f"order beyond chance, the model orders "
                           f"{len(sm['model_orders_against'])} the other way"
                           + (f" ({sm['model_orders_against']})"
                              if 0 < len(sm['model_orders_against']) <= 5 else "")
                           if "ordered_pairs" in sm else "")
                        + ("; median signed error per phase (below 0: predicted short) "
                           + ", ".join(f"{ph} {_f(v, True)}" for ph, v in
                                       sm["median_error_by_phase"].items())
                           if "median_error_by_phase" in sm else "") + ".", ""]
            if "stability" in sec:
                st = sec["stability"][clock]
                lines += [f"Stability: Spearman between the two runs' measured step times "
                          f"{_f(st['spearman'])}; same order of plans: {st['same_order']}"
                          + (f" (pairs swapped: {st['swapped']}; of them more than "
                             f"{TIE:.0%} apart in both runs: {st['swapped_beyond_tie']})"
                             if st.get("swapped") else "") + "."
                          + (f" By the executions themselves (a one-sided exact Mann-Whitney "
                             f"test at {ALPHA}, {EXECUTIONS} executions a plan in each run): "
                             f"of {st['pairs']} pairs, run 1 orders {st['ordered_in_run'][0]}, "
                             f"run 2 {st['ordered_in_run'][1]}, both "
                             f"{st['ordered_in_both']}; ordered oppositely by the two runs: "
                             f"{st['contradicted'] or 'none'}."
                             if "contradicted" in st else ""), ""]
            lines += ["| plan | fixture | hosts x GPUs | solver | sharding/tier | predicted "
                      "step | TorchRec's estimator | measured step (each run) | Spearman "
                      "ranks | slowest pred / meas | mean abs error |",
                      "|---|---|---|---|---|---|---|---|---|---|---|"]
            first = sec["runs"][0]["plans"]
            for n in sorted(first):
                r = first[n]
                pl = r["by_clock"][clock]["plan"]
                each = [run["plans"][n]["by_clock"][clock]["plan"]["measured_step_s"]
                        for run in sec["runs"]]
                trc = r.get("torchrec_by_clock", {}).get(clock, {}).get("plan", {})
                lines.append(
                    f"| {n} | {r['fixture']} | {r['hosts']}x{r['gpus_per_host']} | "
                    f"{r['solver']} | {', '.join(r['kinds'])} | {pl['predicted_step_s']:.3g} s "
                    f"| {_f(trc.get('predicted_step_s'))} s "
                    f"| {', '.join(f'{x:.3g}' for x in each)} s | {_f(pl['spearman_ranks'])} "
                    f"| {pl['predicted_slowest']} / {pl['measured_slowest']} | "
                    f"{_f(pl['mean_abs_rel_error'], True)} |")
            lines.append("")
            lines += twin_lines(sec, clock)
    return "\n".join(lines) + "\n"


def twin_lines(sec: dict[str, Any], clock: str) -> list[str]:
    """Each pipelined plan beside its sequential twin (the same layout, not pipelined):
    the step time pipelining saves, predicted and measured."""
    first = sec["runs"][0]["plans"]
    names = sorted(n for n in first if "sequential_twin" in first[n])
    if not names:
        return []
    out = ["Pipelining measured: each `_pipe` plan against the same layout run in turn "
           "(sequential twin, scored by `planning.evaluate`); saved = 1 - pipelined / "
           "sequential step.", "",
           "| plan | predicted pipelined / sequential | predicted saved | measured pipelined "
           "/ sequential (each run) | measured saved (each run) |", "|---|---|---|---|---|"]
    for n in names:
        pred = first[n]["by_clock"][clock]["plan"]["predicted_step_s"]
        tw = first[n]["sequential_twin"][clock]["predicted_step_s"]
        meas = [(run["plans"][n]["by_clock"][clock]["plan"]["measured_step_s"],
                 run["plans"][n]["sequential_twin"][clock]["measured_step_s"])
                for run in sec["runs"]]
        out.append(f"| {n} | {pred:.3g} / {tw:.3g} s | {_f(1 - pred / tw, True)} | "
                   + ", ".join(f"{a:.3g} / {b:.3g} s" for a, b in meas) + " | "
                   + ", ".join(_f(1 - a / b, True) for a, b in meas) + " |")
    return [*out, ""]


def resummarized(body: dict[str, Any]) -> dict[str, Any]:
    """`body` (a committed run) with every summary and the stability recomputed from its
    stored figures, and the code that recomputed them noted."""
    out = json.loads(json.dumps(body))
    for key in ("preset", "calibrated"):
        sec = out.get(key)
        if not sec:
            continue
        for run in sec["runs"]:
            run.update(run_summaries(run["plans"]))
        if len(sec["runs"]) >= 2:
            a, b = (sec["runs"][k]["plans"] for k in (0, 1))
            names = [n for n in PLANS if n in a]
            sec["stability"] = {c: stability(a, b, c, names) for c in CLOCKS}
    out["resummarized"] = {"command": COMMAND + " --resummarize", "code": code_state()}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="plan names (default: all)")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--no-write", action="store_true", help="print, do not write results")
    ap.add_argument("--resummarize", action="store_true",
                    help="recompute the summaries and stability of the committed results from "
                         "their stored executions (no run), and rewrite them")
    ap.add_argument("--reuse-profile", action="store_true",
                    help="keep benchmarks/results/fidelity_profile.json if it was made on "
                         "this machine (default: calibrate again)")
    args = ap.parse_args(argv)
    if args.resummarize:
        body = resummarized(json.loads((RESULTS / "fidelity.json").read_text()))
        write_results("fidelity", body, markdown(body))
        return
    names = args.only or list(PLANS)
    load_before = [round(x, 2) for x in os.getloadavg()]
    t0 = time.perf_counter()
    body: dict[str, Any] = {
        "command": COMMAND + (f" --only {' '.join(names)}" if args.only else "")
        + (f" --runs {args.runs}" if args.runs != 2 else ""),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "load_before": load_before, "steps": STEPS, "code": code_state(),
        "preset": run_set(preset_dict("h100"), "preset", names, args.runs),
    }
    if not calibrate_available():
        body["calibrated"] = None
        body["calibration_note"] = ("after calibration: not available (`planner calibrate` "
                                    "does not exist on this commit)")
    elif args.reuse_profile and made_here(RESULTS / "fidelity_profile.json"):
        hw = json.loads((RESULTS / "fidelity_profile.json").read_text())
        body["calibrated"] = run_set(hw, "calibrated", names, args.runs)
    else:
        # Calibrated beside the passes: a session before, one after each.
        sessions = Sessions()
        body["calibrated"] = run_set(sessions.measure(), "calibrated", names, args.runs,
                                     sessions)
    body["load_after"] = [round(x, 2) for x in os.getloadavg()]
    body["seconds"] = time.perf_counter() - t0
    text = markdown(body)
    if args.no_write:
        sys.stdout.write(text)
        return
    write_results("fidelity", body, text)
    sys.stdout.write(text)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        main()
