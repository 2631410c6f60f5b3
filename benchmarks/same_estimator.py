"""Two planners under one cost model: ours searching with TorchRec's own shard estimators
(`options.estimator = torchrec`) against TorchRec's EmbeddingShardingPlanner, both plans
scored by TorchRec's scoring (`planner.interop.score_with_torchrec`: per rank the sum of its
shards' Perf.total, the plan its slowest rank), beside the lower bound on any plan under
those estimators (benchmarks/torchrec_bound.py) and our plan made under our own model and
scored by TorchRec's (what vs_torchrec compares).

vs_torchrec compares plans each planner made under its own model; a plan that wins under one
model may lose under the other, so neither figure says whose *search* is better. Here the
model is TorchRec's for everyone: a ratio below 1 means our search found a plan TorchRec's
estimators rate faster than TorchRec's own planner's plan. Our plan's figure is taken from
TorchRec's scoring of its export, and checked against the plan's own step time (they must
agree: the plan was priced by the same estimators).

Cases: every bundled fixture of at most BIG_TABLES tables on 1 and 2 hosts of `h100` (8 GPUs
each), and those of at most WIDE_TABLES tables on 16 hosts too, each in a subprocess with
CASE_LIMIT_S seconds.

Usage (from the repo root; about 15 minutes):
    PYTHONPATH=. python -m benchmarks.same_estimator [--only FIXTURE ...]
Writes benchmarks/results/same_estimator.json and .md.
"""

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from benchmarks import write_results

COMMAND = "PYTHONPATH=. python -m benchmarks.same_estimator"
PRESET = "h100"
HOSTS = (1, 2)
BIG_TABLES = 200
WIDE_HOSTS, WIDE_TABLES = 16, 32  # 128 GPUs for the small fixtures
CASE_LIMIT_S = 600


def run_case(fixture: str, hosts: int, out: Path) -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import planner
    from benchmarks.torchrec_bound import torchrec_lower_bound
    from planner.interop import (
        TorchRecProblem,
        export_from_sharding_plan,
        score_with_torchrec,
        to_torchrec,
    )
    from planner.planning import resolve
    from planner.presets import fixture_text

    row: dict[str, Any] = {"fixture": fixture, "hosts": hosts}
    save = lambda: out.write_text(json.dumps(row))  # noqa: E731
    model = json.loads(fixture_text(fixture))
    req = resolve({"model": model, "hardware": {"preset": PRESET, "hosts": hosts},
                   "options": {"estimator": "torchrec"}})
    g = req.hardware.gpus_per_host
    row.update(gpus=hosts * g, tables=len(req.model.tables))
    problem = TorchRecProblem.of(req)
    t0 = time.perf_counter()
    try:
        ours = planner.plan(req)
    except planner.PlannerError as e:
        row.update(ours_status=type(e).__name__, ours_reason=str(e)[:300])
        ours = None
    else:
        score = score_with_torchrec(problem, to_torchrec(ours))
        row.update(ours_plan_s=time.perf_counter() - t0, ours_status="ok",
                   ours_ms=score.step_ms, ours_own_step_ms=ours.summary.step_time_s * 1e3,
                   ours_bound_ms=ours.summary.lower_bound_s * 1e3,
                   ours_solver=ours.summary.solver, ours_note=ours.summary.status,
                   ours_max_hbm_gib=score.max_hbm_bytes / 2**30,
                   hbm_cap_gib=score.hbm_cap_bytes / 2**30)
    save()
    # Our plan made under our own model, scored by TorchRec (vs_torchrec's comparison).
    analytic = req.model_copy(update={"options": req.options.model_copy(
        update={"estimator": "analytic"})})
    try:
        mine = planner.plan(analytic)
        row["ours_analytic_ms"] = score_with_torchrec(problem, to_torchrec(mine)).step_ms
    except Exception as e:  # an inexpressible table, or no plan
        row["ours_analytic_note"] = f"{type(e).__name__}: {str(e)[:200]}"
    save()
    t0 = time.perf_counter()
    try:
        tr = export_from_sharding_plan(problem.plan(), hosts * g, g)
    except Exception as e:  # TorchRec's planner found no plan
        row.update(torchrec_status="failed", torchrec_reason=f"{type(e).__name__}: "
                   f"{str(e)[:300]}")
        save()
        return
    row.update(torchrec_plan_s=time.perf_counter() - t0, torchrec_status="ok",
               torchrec_ms=score_with_torchrec(problem, tr).step_ms)
    save()
    t0 = time.perf_counter()
    b = torchrec_lower_bound(problem)
    row.update(bound_ms=b.bound_ms, bound_s=time.perf_counter() - t0)
    save()


def _spawn(fixture: str, hosts: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "row.json"
        cmd = [sys.executable, "-m", "benchmarks.same_estimator", "--case", fixture,
               str(hosts), "--out", str(out)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CASE_LIMIT_S)
            err = proc.stderr.strip().splitlines()[-1][:300] if proc.returncode else None
        except subprocess.TimeoutExpired:
            err = f"case ran past {CASE_LIMIT_S} s"
        row = json.loads(out.read_text()) if out.exists() else {"fixture": fixture,
                                                                 "hosts": hosts}
    row["case_s"] = round(time.perf_counter() - t0, 1)
    if err:
        row["error"] = err
    return row


def _ratio(a: Any, b: Any) -> float | None:
    ok = isinstance(a, int | float) and isinstance(b, int | float) and b > 0
    return a / b if ok else None


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    for r in rows:
        r["ratio"] = _ratio(r.get("ours_ms"), r.get("torchrec_ms"))
        r["ratio_analytic"] = _ratio(r.get("ours_analytic_ms"), r.get("torchrec_ms"))
        r["ours_gap"] = (_ratio(r.get("ours_ms"), r.get("bound_ms")) or 1.0) - 1.0 \
            if r.get("bound_ms") else None
        r["torchrec_gap"] = (_ratio(r.get("torchrec_ms"), r.get("bound_ms")) or 1.0) - 1.0 \
            if r.get("bound_ms") else None
        own, sc = r.get("ours_own_step_ms"), r.get("ours_ms")
        r["own_figure_agrees"] = (abs(own - sc) <= 1e-9 * max(abs(sc), 1e-12)
                                  if own is not None and sc is not None else None)
    both = [r for r in rows if r["ratio"] is not None]
    med = (lambda xs: statistics.median(xs) if xs else None)  # noqa: E731
    return {
        "cases": len(rows), "compared": len(both),
        "median_ratio": med([r["ratio"] for r in both]),
        "worst_ratio": max((r["ratio"] for r in both), default=None),
        "better": sum(1 for r in both if r["ratio"] < 1 - 1e-9),
        "tied": sum(1 for r in both if abs(r["ratio"] - 1) <= 1e-9),
        "worse": sum(1 for r in both if r["ratio"] > 1 + 1e-9),
        "median_ratio_analytic": med([r["ratio_analytic"] for r in both
                                      if r["ratio_analytic"] is not None]),
        "median_ours_gap": med([r["ours_gap"] for r in both if r["ours_gap"] is not None]),
        "median_torchrec_gap": med([r["torchrec_gap"] for r in both
                                    if r["torchrec_gap"] is not None]),
        "own_figures_agree": all(r["own_figure_agrees"] for r in rows
                                 if r["own_figure_agrees"] is not None),
    }


def _f(x: Any, pct: bool = False) -> str:
    if not isinstance(x, int | float):
        return "-" if x is None else str(x)
    return f"{x * 100:.2f}%" if pct else f"{x:.4g}"


def markdown(body: dict[str, Any]) -> str:
    s = body["summary"]
    lines = [
        "# Two planners under TorchRec's estimators", "",
        f"Command: `{body['command']}`; machine: {body['machine']}; commit "
        f"{body['commit'][:10]}; {body['seconds']:.0f} s.", "",
        "Both plans scored by TorchRec's scoring (`score_with_torchrec`: per rank the sum of "
        "its shards' Perf.total; the plan, its slowest rank), in ms. ours: `planner.plan` "
        "with `options.estimator = torchrec`; TorchRec: its EmbeddingShardingPlanner "
        "(defaults, our topology); ours (analytic): our default plan, made under our own "
        "model; bound: no plan under TorchRec's estimators scores below it "
        "(benchmarks/torchrec_bound.py). ratio = ours / TorchRec (below 1: our plan is "
        "faster under TorchRec's own model). ours' own figure = TorchRec's score of its "
        "export, in every case: " + str(s["own_figures_agree"]) + ".", "",
        f"- cases {s['cases']}, compared {s['compared']}: ours better in {s['better']}, tied "
        f"in {s['tied']}, worse in {s['worse']}; median ratio {_f(s['median_ratio'])}, "
        f"worst {_f(s['worst_ratio'])}; our plan made under our own model, median ratio "
        f"{_f(s['median_ratio_analytic'])}.",
        f"- median gap to the bound: ours {_f(s['median_ours_gap'], True)}, TorchRec's "
        f"{_f(s['median_torchrec_gap'], True)}.", "",
        "our bound: our plan's own lower bound, over our candidates under TorchRec's prices "
        "(no plan of our candidate space is faster; TorchRec's planner may use shapes outside "
        "it, so it does not bound TorchRec's plan).", "",
        "| fixture | hosts x GPUs | tables | ours ms | TorchRec ms | ratio | bound ms | ours gap "
        "| TorchRec gap | our bound ms | ours (analytic) ms | ours plan s | TorchRec plan s "
        "| our solver |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in body["rows"]:
        lines.append(
            f"| {r['fixture']} | {r['hosts']}x{(r.get('gpus') or 0) // r['hosts']} | "
            f"{r.get('tables', '-')} | {_f(r.get('ours_ms'))} | {_f(r.get('torchrec_ms'))} | "
            f"{_f(r.get('ratio'))} | {_f(r.get('bound_ms'))} | {_f(r.get('ours_gap'), True)} "
            f"| {_f(r.get('torchrec_gap'), True)} | {_f(r.get('ours_bound_ms'))} | "
            f"{_f(r.get('ours_analytic_ms'))} | "
            f"{_f(r.get('ours_plan_s'))} | {_f(r.get('torchrec_plan_s'))} | "
            f"{r.get('ours_solver', r.get('ours_status', '-'))}"
            + (f" ({r['error']})" if r.get("error") else "") + " |")
    return "\n".join(lines) + "\n"


def cases(only: list[str] | None) -> list[tuple[str, int]]:
    from planner.presets import fixture_names, fixture_text

    size = {f: len(json.loads(fixture_text(f))["tables"]) for f in fixture_names()}
    chosen = [f for f in size if size[f] <= BIG_TABLES and (not only or f in only)]
    grid = [(f, h) for f in chosen
            for h in (*HOSTS, *((WIDE_HOSTS,) if size[f] <= WIDE_TABLES else ()))]
    return sorted(grid, key=lambda c: (size[c[0]], c))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--case", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    if args.case:
        run_case(args.case[0], int(args.case[1]), args.out)
        return
    t0 = time.perf_counter()
    rows = []
    for fixture, hosts in cases(args.only):
        row = _spawn(fixture, hosts)
        rows.append(row)
        print(f"{fixture} x {hosts}: ours {_f(row.get('ours_ms'))} ms, TorchRec "
              f"{_f(row.get('torchrec_ms'))} ms, bound {_f(row.get('bound_ms'))} ms "
              f"({row['case_s']} s){' ' + row['error'] if row.get('error') else ''}",
              flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    body = {"command": COMMAND, "rows": rows, "summary": summarise(rows), "commit": commit,
            "machine": f"{platform.processor() or platform.machine()}, "
                       f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
            "seconds": time.perf_counter() - t0}
    md = markdown(body)
    if args.no_write:
        print(md)
    else:
        write_results("same_estimator", body, md)
        print(md)


if __name__ == "__main__":
    main()
