"""Plan quality: our plans against the lower bound and the ZionEX greedy baselines.

For every bundled fixture on 1, 2, 4 and 16 hosts of the `h100` preset, and on 16 hosts of
`zionex_a100` (the ZionEX paper's hardware), this plans with `planner.plan` twice: the
default solver (`auto`: heuristic, then CP-SAT when the gap is over 1%) and `greedy` (the
heuristic alone). The gap is to the plan's own lower bound (the simple bound over the
candidate space, or CP-SAT's proven bound where that is tighter); cases CP-SAT proved
optimal are marked. It also scores the three ZionEX baselines (`benchmarks.baselines`) with
the same cost model. Every step time is the cost model's
estimate of the slowest GPU (seconds per training step, sparse part), never a measurement.

Usage (from the repo root):
    PYTHONPATH=. python -m benchmarks.plan_quality

Writes benchmarks/results/plan_quality.json and .md and prints the markdown.
"""

import argparse
import json
import statistics
import sys
import time
from typing import Any

import planner
from benchmarks import write_results
from benchmarks.baselines import COSTS, run_all
from benchmarks.plan_time import machine
from planner.bounds import LowerBound, lower_bound
from planner.planning import candidates_for, resolve
from planner.presets import fixture_names, fixture_text
from planner.problem import build_problem

COMMAND = "PYTHONPATH=. python -m benchmarks.plan_quality"
H100_HOSTS = (1, 2, 4, 16)
ZIONEX_HOSTS = (16,)
TARGET_MEDIAN_GAP = 0.01
# "Worse than a baseline" means slower by more than this relative margin (float noise only).
WORSE_TOL = 1e-9


def cases() -> list[tuple[str, str, int]]:
    out = []
    for name in fixture_names():
        out += [(name, "h100", h) for h in H100_HOSTS]
        out += [(name, "zionex_a100", h) for h in ZIONEX_HOSTS]
    return out


def _no_bound() -> LowerBound:
    """Stand-in when our candidate space is empty (the case is infeasible for us)."""
    return LowerBound(value_s=0.0, average_s=0.0, largest_piece_s=0.0, balanced_s=0.0,
                      memory_priced=False, prices=(0.0, 0.0, 0.0))


def run_case(fixture: str, preset: str, hosts: int) -> dict[str, Any]:
    model = json.loads(fixture_text(fixture))
    request = {"model": model, "hardware": {"preset": preset, "hosts": hosts}}
    resolved = resolve(request)
    problem = build_problem(resolved)
    row: dict[str, Any] = {
        "fixture": fixture, "preset": preset, "hosts": hosts,
        "gpus": problem.hw.world_size, "tables": len(problem.tables),
    }

    reason = None
    t0 = time.perf_counter()
    try:
        plan = planner.plan(request)
    except planner.InfeasibleError as err:
        plan, reason = None, err.reason
    row["plan_time_s"] = time.perf_counter() - t0
    try:
        greedy = planner.plan({**request, "options": {"solver": "greedy"}})
        row["greedy_s"] = greedy.summary.step_time_s
    except planner.InfeasibleError:
        row["greedy_s"] = None

    try:
        cands, _ = candidates_for(problem)
        bound = lower_bound(problem, cands)
        row["simple_bound_s"] = bound.value_s
    except planner.InfeasibleError:
        bound = _no_bound()
        row["simple_bound_s"] = None

    if plan is None:
        row.update(ours_s=None, gap=None, solver=None, status="infeasible",
                   lower_bound_s=row["simple_bound_s"], proved_optimal=False,
                   infeasible_reason=reason)
    else:
        s = plan.summary
        row.update(ours_s=s.step_time_s, gap=s.gap, solver=s.solver, status=s.status,
                   lower_bound_s=s.lower_bound_s, proved_optimal=s.status == "optimal",
                   solver_det_time=s.solver_det_time,
                   imbalance=s.imbalance, infeasible_reason=None,
                   tables_per_type=s.tables_per_type, tables_per_tier=s.tables_per_tier)
        if row["simple_bound_s"] is not None and s.lower_bound_s < bound.value_s * (1 - 1e-12):
            row["note"] = (f"plan's own lower bound {s.lower_bound_s!r} is below the "
                           f"recomputed simple one {bound.value_s!r}")

    baselines = run_all(problem, bound)
    row["baselines"] = {
        name: ({"step_time_s": b.step_time_s, "imbalance": b.plan.summary.imbalance}
               if b.plan is not None else {"infeasible": b.reason})
        for name, b in baselines.items()
    }
    feasible = {n: b.step_time_s for n, b in baselines.items() if b.step_time_s is not None}
    if feasible:
        best_name = min(feasible, key=lambda n: (feasible[n], n))
        row["best_baseline"] = best_name
        row["best_baseline_s"] = feasible[best_name]
        row["ours_over_best"] = (row["ours_s"] / feasible[best_name]
                                 if row["ours_s"] is not None else None)
    else:
        row.update(best_baseline=None, best_baseline_s=None, ours_over_best=None)
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    gaps = [r["gap"] for r in rows if r["gap"] is not None]
    worse = [r for r in rows if r["ours_over_best"] is not None
             and r["ours_over_best"] > 1 + WORSE_TOL]
    # A case where some baseline is feasible but we are not counts as worse too.
    lost = [r for r in rows if r["ours_s"] is None and r["best_baseline_s"] is not None]
    compared = [r["ours_over_best"] for r in rows if r["ours_over_best"] is not None]
    worse_than_greedy = [r for r in rows if r["ours_s"] is not None and r["greedy_s"] is not None
                         and r["ours_s"] > r["greedy_s"] * (1 + WORSE_TOL)]
    return {
        "cases": len(rows),
        "ours_feasible": len(gaps),
        "ours_infeasible": [f"{r['fixture']}/{r['preset']}x{r['hosts']}" for r in rows
                            if r["ours_s"] is None],
        "median_gap": statistics.median(gaps) if gaps else None,
        "max_gap": max(gaps) if gaps else None,
        "cases_with_a_feasible_baseline": len(compared),
        "worse_than_best_baseline": len(worse) + len(lost),
        "worse_cases": [f"{r['fixture']}/{r['preset']}x{r['hosts']}" for r in worse + lost],
        "geomean_ours_over_best": (statistics.geometric_mean(compared) if compared else None),
        "min_ours_over_best": min(compared) if compared else None,
        "target_median_gap": TARGET_MEDIAN_GAP,
        "target_median_gap_holds": bool(gaps) and statistics.median(gaps) <= TARGET_MEDIAN_GAP,
        "target_never_worse_holds": not worse and not lost,
        "proved_optimal": sum(1 for r in rows if r["proved_optimal"]),
        "worse_than_greedy": [f"{r['fixture']}/{r['preset']}x{r['hosts']}"
                              for r in worse_than_greedy],
        "target_never_worse_than_greedy_holds": not worse_than_greedy,
    }


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.4g}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.2%}"


def markdown(rows: list[dict[str, Any]], summary: dict[str, Any], meta: dict[str, Any]) -> str:
    names = list(COSTS)
    head = ["fixture", "preset", "hosts", "GPUs", "tables", "ours ms", "LB ms", "gap",
            "greedy ms", *[f"{n} ms" for n in names], "ours/best", "plan s", "solver",
            "status"]
    lines = [
        "# Plan quality",
        "",
        "Estimated step time of the sparse part (slowest GPU, cost model, milliseconds) of our "
        "plan (default solver `auto`), its lower bound over our candidate space (LB: the "
        "simple bound, or CP-SAT's proven bound where tighter; **optimal** = CP-SAT proved "
        "the plan optimal), the heuristic alone (`--solver greedy`), and the three ZionEX greedy "
        "table-wise baselines (Mudigere et al., ISCA 2022; see `benchmarks/baselines.py`), "
        "all scored by the same cost model. `inf.` = the baseline cannot place some table "
        "whole in HBM. ours/best = our step time over the best feasible baseline's. "
        "plan s = wall-clock time of `planner.plan` on this machine "
        f"({meta['nproc']} CPUs, Python {meta['python']}; commit {str(meta['git_head'])[:12]}, "
        "the working tree may hold uncommitted changes).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 4) + ["---"] * 2) + "|",
    ]
    for r in rows:
        bl = [_ms(r["baselines"][n].get("step_time_s")) if "infeasible" not in r["baselines"][n]
              else "inf." for n in names]
        ratio = "-" if r["ours_over_best"] is None else f"{r['ours_over_best']:.3f}"
        lines.append("| " + " | ".join([
            r["fixture"], r["preset"], str(r["hosts"]), str(r["gpus"]), str(r["tables"]),
            _ms(r["ours_s"]) if r["ours_s"] is not None else "infeasible",
            _ms(r["lower_bound_s"]), _pct(r["gap"]), _ms(r["greedy_s"]), *bl, ratio,
            f"{r['plan_time_s']:.2f}", r["solver"] or "-",
            "**optimal**" if r["proved_optimal"] else r["status"],
        ]) + " |")
    s = summary
    lines += [
        "",
        f"- cases: {s['cases']}; our plan feasible in {s['ours_feasible']}",
        f"- median gap to the lower bound: {_pct(s['median_gap'])}",
        f"- max gap to the lower bound: {_pct(s['max_gap'])}",
        f"- cases where ours is worse than the best feasible baseline: "
        f"{s['worse_than_best_baseline']} of {s['cases_with_a_feasible_baseline']} with a "
        "feasible baseline" + (f" ({', '.join(s['worse_cases'])})" if s["worse_cases"] else ""),
        f"- ours / best baseline: geometric mean {_ratio(s['geomean_ours_over_best'])}, "
        f"best case {_ratio(s['min_ours_over_best'])}",
        f"- target median gap <= {TARGET_MEDIAN_GAP:.0%}: "
        f"{'holds' if s['target_median_gap_holds'] else 'MISSED'}",
        f"- target never worse than the best feasible baseline: "
        f"{'holds' if s['target_never_worse_holds'] else 'MISSED'}",
        f"- cases CP-SAT proved optimal: {s['proved_optimal']} of {s['ours_feasible']}",
        f"- target never worse than greedy: "
        f"{'holds' if s['target_never_worse_than_greedy_holds'] else 'MISSED'}"
        + (f" ({', '.join(s['worse_than_greedy'])})" if s["worse_than_greedy"] else ""),
    ]
    infeasible = [r for r in rows if r["ours_s"] is None]
    if infeasible:
        lines += ["", "Infeasible for our planner (reason as reported):", ""]
        lines += [f"- {r['fixture']} on {r['hosts']} x {r['preset']}: {r['infeasible_reason']}"
                  for r in infeasible]
    notes = [r for r in rows if r.get("note")]
    if notes:
        lines += ["", "Notes:", ""]
        lines += [f"- {r['fixture']} on {r['hosts']} x {r['preset']}: {r['note']}" for r in notes]
    lines += ["", "Reproduce (from the repo root):", "", "```", COMMAND, "```", ""]
    return "\n".join(lines)


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture", action="append", help="only these fixtures (repeatable)")
    ap.add_argument("--no-write", action="store_true", help="print only; keep results files")
    args = ap.parse_args(argv)

    rows = []
    for fixture, preset, hosts in cases():
        if args.fixture and fixture not in args.fixture:
            continue
        row = run_case(fixture, preset, hosts)
        print(f"{fixture:<17} {preset:<12} x{hosts:<3} ours {_ms(row['ours_s']):>9} ms "
              f"gap {_pct(row['gap']):>7}  best baseline {_ms(row['best_baseline_s']):>9} ms  "
              f"plan {row['plan_time_s']:.2f} s", file=sys.stderr, flush=True)
        rows.append(row)
    summary = summarize(rows)
    meta = {**machine(), "command": COMMAND}
    text = markdown(rows, summary, meta)
    if not args.no_write and not args.fixture:
        write_results("plan_quality", {"meta": meta, "summary": summary, "cases": rows}, text)
    print(text)
    print(f"target median gap <= {TARGET_MEDIAN_GAP:.0%}: "
          f"{'HOLDS' if summary['target_median_gap_holds'] else 'MISSED'} "
          f"(median {_pct(summary['median_gap'])})")
    print("target never worse than greedy: "
          f"{'HOLDS' if summary['target_never_worse_than_greedy_holds'] else 'MISSED'}")
    print("target never worse than the best feasible baseline: "
          f"{'HOLDS' if summary['target_never_worse_holds'] else 'MISSED'} "
          f"({summary['worse_than_best_baseline']} worse)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
