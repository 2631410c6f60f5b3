"""CP-SAT modes side by side: where the flat exact model, the hierarchical one (hosts, then
GPUs) and the re-pack help, from the same heuristic start with the same budget.

For each multi-host case (fixtures on 2, 4 and 16 hosts of the `h100` preset) this runs the
heuristic (`greedy` + local search, as `plan()` does), then each CP-SAT mode from that start
with a budget of BUDGET deterministic seconds: the step time of its plan and the lower bound
it proves (the simple bound where a mode proves none), all under the same cost model. The
policy in `planner.partition.pipeline.improve` is read off this table.

Usage (from the repo root):
    PYTHONPATH=. python -m benchmarks.solvers
Writes benchmarks/results/solvers.json and .md and prints the markdown.
"""

import json
import statistics
import sys
import time
from typing import Any

from benchmarks import write_results
from benchmarks.plan_time import machine
from planner.bounds import lower_bound
from planner.partition.cpsat import (
    EXACT_MAX_VARS,
    exact_model_size,
    makespan,
    repack,
    solve_exact,
)
from planner.partition.hierarchical import host_model_size, solve_hierarchical
from planner.partition.pipeline import best_start
from planner.planning import candidates_for, resolve
from planner.presets import fixture_text
from planner.problem import build_problem

COMMAND = "PYTHONPATH=. python -m benchmarks.solvers"
FIXTURES = ("criteo_kaggle", "criteo_dcnv2", "criteo_mlperf_v1", "deeprecsys_rm1",
            "deeprecsys_rm2", "deeprecsys_rm3", "hugectr_200")
HOSTS = (2, 4, 16)
BUDGET = 2.0  # deterministic seconds, the default time limit
MODES = ("flat", "hierarchical", "repack")


def run_case(fixture: str, hosts: int) -> dict[str, Any]:
    req = resolve({"model": json.loads(fixture_text(fixture)),
                   "hardware": {"preset": "h100", "hosts": hosts}})
    problem = build_problem(req)
    cands, _ = candidates_for(problem)
    bound = lower_bound(problem, cands)
    start = best_start(problem, cands, bound)
    start_s = makespan(problem, start.choices)
    row: dict[str, Any] = {"fixture": fixture, "hosts": hosts, "heuristic_s": start_s,
                           "simple_bound_s": bound.value_s,
                           "flat_vars": exact_model_size(problem, cands),
                           "host_vars": host_model_size(problem, cands)}
    for mode in MODES:
        t0 = time.perf_counter()
        if mode == "flat":
            if row["flat_vars"] > EXACT_MAX_VARS:
                row[mode] = None
                continue
            res = solve_exact(problem, cands, start, BUDGET, 0, bound.value_s)
        elif mode == "hierarchical":
            res = solve_hierarchical(problem, cands, start, BUDGET, 0)
        else:
            res = repack(problem, cands, start, BUDGET, 0)
        assert res is not None
        step = makespan(problem, res.assignment.choices)
        proved = max(bound.value_s, res.bound_s or 0.0)
        row[mode] = {"step_s": step, "bound_s": proved, "gap": step / proved - 1,
                     "status": res.status, "det_time": res.det_time,
                     "wall_s": time.perf_counter() - t0}
    return row


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.4g}"


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# CP-SAT modes",
        "",
        f"Same heuristic start, {BUDGET:g} deterministic s each; step and bound in ms "
        "(cost model), gap = step / the best bound that mode proves (or the simple bound) - 1. "
        "`-`: the flat model would exceed "
        f"{EXACT_MAX_VARS:,} variables. Machine: {meta['nproc']} CPUs, Python "
        f"{meta['python']}, commit {str(meta['git_head'])[:12]} (the working tree may hold "
        "uncommitted changes).",
        "",
        "| fixture | hosts | heuristic ms | simple LB ms | flat ms / LB / gap | "
        "hierarchical ms / LB / gap | re-pack ms / gap | flat vars | host vars |",
        "|---|---:|---:|---:|---|---|---|---:|---:|",
    ]

    def cell(r: dict[str, Any] | None, bound: bool = True) -> str:
        if r is None:
            return "-"
        parts = [_ms(r["step_s"])]
        if bound:
            parts.append(_ms(r["bound_s"]))
        parts.append(f"{r['gap']:.2%}")
        return " / ".join(parts)

    for r in rows:
        lines.append(f"| {r['fixture']} | {r['hosts']} | {_ms(r['heuristic_s'])} | "
                     f"{_ms(r['simple_bound_s'])} | {cell(r['flat'])} | "
                     f"{cell(r['hierarchical'])} | {cell(r['repack'], bound=False)} | "
                     f"{r['flat_vars']:,} | {r['host_vars']:,} |")
    lines += ["", "Summary (median gap over the cases where the mode ran; "
              "cases where it found a better plan than the heuristic, or a tighter bound):", ""]
    for mode in MODES:
        ran = [r[mode] for r in rows if r[mode] is not None]
        if not ran:
            continue
        better = sum(1 for r, m in zip(rows, [r[mode] for r in rows], strict=True)
                     if m is not None and m["step_s"] < r["heuristic_s"] * (1 - 1e-9))
        tighter = sum(1 for r, m in zip(rows, [r[mode] for r in rows], strict=True)
                      if m is not None and m["bound_s"] > r["simple_bound_s"] * (1 + 1e-9))
        lines.append(f"- {mode}: ran in {len(ran)}, median gap "
                     f"{statistics.median(m['gap'] for m in ran):.2%}, better plan in {better}, "
                     f"tighter bound in {tighter}")
    lines += ["", "Reproduce (from the repo root):", "", "```", COMMAND, "```", ""]
    return "\n".join(lines)


def main() -> int:
    rows = []
    for fixture in FIXTURES:
        for hosts in HOSTS:
            row = run_case(fixture, hosts)
            print(f"{fixture:<17} x{hosts:<3} heuristic {_ms(row['heuristic_s'])} ms",
                  file=sys.stderr, flush=True)
            rows.append(row)
    meta = {**machine(), "command": COMMAND, "budget_det_s": BUDGET}
    text = markdown(rows, meta)
    write_results("solvers", {"meta": meta, "cases": rows}, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
