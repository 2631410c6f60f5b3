"""Head-to-head with TorchRec's planner (torchrec 1.8.0, EmbeddingShardingPlanner).

For every bundled fixture on 1, 2 and 16 hosts of the `h100` preset (8 GPUs per host), in
one run on one machine:
- plan with `planner.plan` and with TorchRec's EmbeddingShardingPlanner on the same tables
  and topology (model on the meta device, no process group), timing both;
- score both plans under both cost models: TorchRec's plan imported
  (`planner.interop.layout_from_torchrec`) and scored by `planner.planning.evaluate`; our
  plan exported (`planner.interop.to_torchrec`) and scored by TorchRec's own shard
  estimators (EmbeddingPerfEstimator + EmbeddingStorageEstimator, rated as its
  NoopPerfModel rates a plan: the slowest rank's summed Perf.total).
- for each case where TorchRec's planner returned a plan, a lower bound on the step time of
  any plan under TorchRec's estimators (`benchmarks/torchrec_bound.py` says why it holds),
  and best_possible_ratio = bound / TorchRec's plan under them: no plan, ours included,
  can have a smaller ratio under TorchRec's estimators. It runs in the case's process after
  both planners, and its time is reported on its own, in neither planning time.
TorchRec gets our bandwidths and capacities (planner/interop/torchrec_model.py says how each
maps to its Topology); its proposers, partitioner and constants are its defaults. Each case
runs in a subprocess; TorchRec's planner gets CASE_TIMEOUT_S seconds (then an alarm stops
it: TorchRec's own `timeout_seconds` would return its best plan so far, a weaker baseline)
and a case that runs past it is reported as timed out, with the time, never dropped.

Usage (from the repo root; about 40 minutes):
    PYTHONPATH=. python -m benchmarks.vs_torchrec
Writes benchmarks/results/vs_torchrec.json and .md.
"""

import argparse
import json
import logging
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks import write_results

COMMAND = "PYTHONPATH=. python -m benchmarks.vs_torchrec"
PRESET = "h100"
HOSTS = (1, 2, 16)
# TorchRec's planner needs minutes per case past 200 tables on 128 GPUs (about 230 s at 200
# tables on this machine), so the 510- and 1000-table fixtures run on 1 and 2 hosts only:
# that keeps one full run under about 40 minutes.
BIG_FIXTURE_TABLES = 200
BIG_FIXTURE_HOSTS = (1, 2)
CASE_TIMEOUT_S = 180  # TorchRec's planner, per case (SIGALRM in the case's process)
# The whole case process (imports, our plan and both scorings, TorchRec's planner): a safety
# net past which the case is killed and reported with what it had written.
CASE_PROCESS_LIMIT_S = 600
TARGET_SPEEDUP = 50.0  # at 200 tables on 16 GPUs
TARGET_MULTIHOST_GAIN = 0.10
AT_BOUND_TOLERANCE = 0.005  # TorchRec's plan within 0.5% of the bound counts as at the bound


def _fixtures() -> list[str]:
    from planner.presets import fixture_names

    return list(fixture_names())


def cases() -> list[tuple[str, int]]:
    """Small fixtures first, so the long TorchRec runs come last."""
    from planner.presets import fixture_text

    size = {f: len(json.loads(fixture_text(f))["tables"]) for f in _fixtures()}
    grid = [(f, h) for f in size
            for h in (HOSTS if size[f] <= BIG_FIXTURE_TABLES else BIG_FIXTURE_HOSTS)]
    return sorted(grid, key=lambda c: (size[c[0]], c[0], c[1]))


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)


def _by_type(layout_tables: Any) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for t in layout_tables:
        ps = t.parameter_sharding
        out[f"{ps.sharding_type}/{ps.compute_kernel}" if ps else t.status] += 1
    return dict(sorted(out.items()))


def _slowest_rank_mix(export: Any, score: Any) -> dict[str, float]:
    """ms per sharding type/kernel on the slowest rank under TorchRec's estimators."""
    kinds = {t.name: f"{t.parameter_sharding.sharding_type}/{t.parameter_sharding.compute_kernel}"
             for t in export.tables}
    return {k: round(v, 4) for k, v in sorted(score.slowest_rank_mix(kinds).items())}


class _OutOfTime(Exception):
    pass


def _out_of_time(signum: int, frame: Any) -> None:
    raise _OutOfTime


def run_case(fixture: str, hosts: int, out: Path, solver: str = "auto") -> None:
    """One case, in this process; writes what it has to `out` after each stage."""
    _quiet()
    import planner
    from planner.interop import (
        TorchRecProblem,
        export_from_sharding_plan,
        layout_from_torchrec,
        score_with_torchrec,
        to_torchrec,
    )
    from planner.planning import evaluate, resolve
    from planner.presets import fixture_text

    row: dict[str, Any] = {"fixture": fixture, "hosts": hosts, "ours_solver_option": solver}
    save = lambda: out.write_text(json.dumps(row))  # noqa: E731
    request = {"model": json.loads(fixture_text(fixture)),
               "hardware": {"preset": PRESET, "hosts": hosts}, "options": {"solver": solver}}
    req = resolve(request)
    g = req.hardware.gpus_per_host
    row.update(gpus=req.hardware.hosts * g, tables=len(req.model.tables))
    t0 = time.perf_counter()
    try:
        ours = planner.plan(req)
    except planner.InfeasibleError as err:
        row.update(ours_plan_time_s=time.perf_counter() - t0, ours_status="infeasible",
                   ours_reason=err.reason)
        ours = None
    else:
        row.update(ours_plan_time_s=time.perf_counter() - t0, ours_status="ok",
                   ours_solver=ours.summary.solver,
                   ours_under_ours_s=ours.summary.step_time_s)
    save()
    problem = TorchRecProblem.of(req)
    if ours is not None:
        exp = to_torchrec(ours)
        row["ours_export"] = {s: len(exp.by_status(s))
                              for s in ("exact", "adjusted", "inexpressible")}
        row["ours_types"] = _by_type(exp.tables)
        if not exp.by_status("inexpressible"):
            score = score_with_torchrec(problem, exp)
            row.update(ours_under_torchrec_ms=score.step_ms,
                       ours_torchrec_max_hbm_gib=score.max_hbm_bytes / 2**30,
                       torchrec_hbm_cap_gib=score.hbm_cap_bytes / 2**30,
                       ours_slowest_rank_mix_ms=_slowest_rank_mix(exp, score))
    save()
    t0 = time.perf_counter()
    signal.signal(signal.SIGALRM, _out_of_time)
    signal.alarm(CASE_TIMEOUT_S)
    try:
        tr_plan = problem.plan()
    except _OutOfTime:
        row.update(torchrec_plan_time_s=f">{time.perf_counter() - t0:.0f}",
                   torchrec_status="timed_out",
                   torchrec_reason=f"TorchRec's planner ran past {CASE_TIMEOUT_S} s")
        save()
        return
    except Exception as err:  # TorchRec's PlannerError: it found no plan that fits
        row.update(torchrec_plan_time_s=time.perf_counter() - t0, torchrec_status="failed",
                   torchrec_reason=f"{type(err).__name__}: {str(err)[:300]}")
        save()
        return
    signal.alarm(0)
    row.update(torchrec_plan_time_s=time.perf_counter() - t0, torchrec_status="ok")
    save()
    tr = export_from_sharding_plan(tr_plan, req.hardware.hosts * g, g)
    row["torchrec_types"] = _by_type(tr.tables)
    score = score_with_torchrec(problem, tr)
    row.update(torchrec_under_torchrec_ms=score.step_ms,
               torchrec_torchrec_max_hbm_gib=score.max_hbm_bytes / 2**30,
               torchrec_slowest_rank_mix_ms=_slowest_rank_mix(tr, score))
    scored = evaluate(layout_from_torchrec(tr, req))
    row.update(torchrec_under_ours_s=scored.summary.step_time_s,
               torchrec_under_ours_status=scored.summary.status,
               torchrec_under_ours_problems=scored.summary.warnings[:3])
    save()
    _bound(problem, row, score.step_ms, save)


def _bound(problem: Any, row: dict[str, Any], torchrec_ms: float, save: Any) -> None:
    """The lower bound under TorchRec's estimators, timed apart from both planners."""
    from benchmarks.torchrec_bound import torchrec_lower_bound

    row["torchrec_model_bound_status"] = "running"  # left so if the case process is killed
    save()
    t0 = time.perf_counter()
    try:
        b = torchrec_lower_bound(problem)
    except Exception as err:
        row.update(torchrec_model_bound_status="failed",
                   torchrec_model_bound_error=f"{type(err).__name__}: {str(err)[:300]}",
                   torchrec_model_bound_time_s=time.perf_counter() - t0)
        save()
        return
    row.update(torchrec_model_bound_status="ok", torchrec_model_bound_ms=b.bound_ms,
               torchrec_model_work_bound_ms=b.work_bound_ms,
               torchrec_model_piece_bound_ms=b.piece_bound_ms,
               torchrec_model_bound_how=b.how,
               torchrec_model_bound_time_s=time.perf_counter() - t0,
               best_possible_ratio=_ratio(b.bound_ms, torchrec_ms))
    # A scored plan below the bound would mean a plan outside the bound's options (or over
    # TorchRec's HBM cap): say so rather than report a wrong bound silently.
    below = [who for who, ms in (("ours", row.get("ours_under_torchrec_ms")),
                                 ("TorchRec's", torchrec_ms))
             if isinstance(ms, int | float) and ms < b.bound_ms * (1 - 1e-9)]
    if below:
        row["torchrec_model_bound_warning"] = (f"{' and '.join(below)} plan scores below the "
                                               f"bound: not covered by its options")
    save()


def _spawn(fixture: str, hosts: int, solver: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "row.json"
        cmd = [sys.executable, "-m", "benchmarks.vs_torchrec", "--case", fixture, str(hosts),
               "--out", str(out), "--solver", solver]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        try:
            _, stderr = proc.communicate(timeout=CASE_PROCESS_LIMIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            stderr = None
        wall = time.perf_counter() - t0
        row = json.loads(out.read_text()) if out.exists() else {"fixture": fixture,
                                                                 "hosts": hosts}
    row["case_wall_s"] = round(wall, 1)
    if stderr is None:
        stage = ("torchrec" if "ours_under_torchrec_ms" in row or "ours_export" in row
                 or row.get("ours_status") == "infeasible" else "ours")
        row.setdefault("torchrec_status", "timed_out")
        if stage == "torchrec" and row.get("torchrec_status") == "timed_out":
            started = row.get("ours_plan_time_s", 0.0)
            row["torchrec_plan_time_s"] = f">{wall - started:.0f}"
            row["torchrec_reason"] = (f"TorchRec's planner ran past the case limit; killed "
                                      f"after {wall:.0f} s of case time")
        else:
            row["ours_status"] = row.get("ours_status", "timed_out")
        if row.get("torchrec_model_bound_status") == "running":
            row["torchrec_model_bound_status"] = "timed_out"
    elif proc.returncode != 0:
        row["error"] = stderr.strip().splitlines()[-1][:300] if stderr.strip() else "failed"
    return row


def _ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, int | float) and isinstance(b, int | float) and b > 0:
        return a / b
    return None


def _time_floor(t: Any) -> float | None:
    """Seconds TorchRec's planner took at least: its time, or N where it ran past its limit
    and the row says ">N"."""
    if isinstance(t, int | float):
        return float(t)
    if isinstance(t, str) and t.startswith(">"):
        return float(t[1:])
    return None


def _main_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with our default solver; other solver options are a supplement."""
    return [r for r in rows if r.get("ours_solver_option", "auto") == "auto"]


def summarise(all_rows: list[dict[str, Any]]) -> dict[str, Any]:
    for r in all_rows:
        r["speedup"] = _ratio(r.get("torchrec_plan_time_s"), r.get("ours_plan_time_s"))
        # Where TorchRec ran past its limit the speedup is at least the limit over ours.
        r["speedup_floor"] = _ratio(_time_floor(r.get("torchrec_plan_time_s")),
                                    r.get("ours_plan_time_s"))
        # < 1: our plan's slowest GPU is faster than TorchRec's plan's, under that model.
        r["ratio_under_ours"] = _ratio(r.get("ours_under_ours_s"), r.get("torchrec_under_ours_s"))
        r["ratio_under_torchrec"] = _ratio(r.get("ours_under_torchrec_ms"),
                                           r.get("torchrec_under_torchrec_ms"))
    rows = _main_rows(all_rows)
    both = [r for r in rows if r["ratio_under_ours"] is not None
            and r["ratio_under_torchrec"] is not None]
    multi = [r for r in both if r["hosts"] > 1]
    med = (lambda xs: statistics.median(xs) if xs else None)  # noqa: E731
    key = [r for r in rows if r["fixture"] == "hugectr_200" and r["gpus"] == 16]
    # Per case no plan's ratio under TorchRec's estimators is below best_possible_ratio, so
    # over the same cases no median of achieved ratios is below the median of these.
    best = [r["best_possible_ratio"] for r in both
            if isinstance(r.get("best_possible_ratio"), int | float)]
    best_multi = [r["best_possible_ratio"] for r in multi
                  if isinstance(r.get("best_possible_ratio"), int | float)]
    return {
        "cases": len(rows), "compared": len(both),
        "median_ratio_under_ours": med([r["ratio_under_ours"] for r in both]),
        "median_ratio_under_torchrec": med([r["ratio_under_torchrec"] for r in both]),
        "median_ratio_under_torchrec_multihost": med([r["ratio_under_torchrec"]
                                                      for r in multi]),
        "median_ratio_under_ours_multihost": med([r["ratio_under_ours"] for r in multi]),
        "median_best_possible_ratio": med(best), "bounded": len(best),
        "median_best_possible_ratio_multihost": med(best_multi),
        "bounded_multihost": len(best_multi), "compared_multihost": len(multi),
        "speedup_200_tables_16_gpus": key[0]["speedup"] if key else None,
        "speedup_200_tables_16_gpus_floor": key[0]["speedup_floor"] if key else None,
        "median_speedup": med([r["speedup"] for r in rows if r["speedup"] is not None]),
        # A median of lower bounds is a lower bound of the median (it is monotone in each).
        "median_speedup_floor": med([r["speedup_floor"] for r in rows
                                     if r["speedup_floor"] is not None]),
        "speedup_floor_cases": sum(r["speedup_floor"] is not None for r in rows),
        "speedup_cases": sum(r["speedup"] is not None for r in rows),
        "supplement": [{k: r.get(k) for k in ("fixture", "gpus", "ours_solver_option",
                                              "ours_plan_time_s", "torchrec_plan_time_s",
                                              "speedup", "ratio_under_ours",
                                              "ratio_under_torchrec")}
                       for r in all_rows if r not in rows],
    }


def _loss_reasons(r: dict[str, Any]) -> list[str]:
    out = []
    if r.get("ratio_under_ours") is not None and r["ratio_under_ours"] > 1 + 1e-9:
        checker = ""
        if "fails" in str(r.get("torchrec_under_ours_status")):
            checker = (f"; TorchRec's plan is outside our plan space (our checker: "
                       f"{(r.get('torchrec_under_ours_problems') or ['?'])[0]})")
        out.append(f"under our model TorchRec's plan is {1 - 1 / r['ratio_under_ours']:.1%} "
                   f"faster (TorchRec's plan: {r.get('torchrec_types')}; ours: "
                   f"{r.get('ours_types')}){checker}")
    if r.get("ratio_under_torchrec") is not None and r["ratio_under_torchrec"] > 1 + 1e-9:
        out.append(f"under TorchRec's estimators our plan is {r['ratio_under_torchrec'] - 1:.1%}"
                   f" slower; its slowest rank spends (ms by type/kernel) "
                   f"{r.get('ours_slowest_rank_mix_ms')} vs TorchRec's plan's slowest rank "
                   f"{r.get('torchrec_slowest_rank_mix_ms')}{_at_bound(r)}")
    return out


def _at_bound(r: dict[str, Any]) -> str:
    best = r.get("best_possible_ratio")
    if not isinstance(best, int | float) or best <= 0:
        return ""
    above = 1 / best - 1  # TorchRec's plan over the bound
    if above <= AT_BOUND_TOLERANCE:
        return (f"; TorchRec's plan is at the lower bound under its estimators ({above:.2%} "
                f"above it): no plan can beat it by more than that")
    return (f"; TorchRec's plan is {above:.1%} above the lower bound under its estimators "
            f"(best possible ratio {best:.3f})")


def _status(r: dict[str, Any]) -> str:
    return "" if r.get("torchrec_status") == "ok" else str(r.get("torchrec_status", ""))


def _fmt(v: Any, spec: str) -> str:
    return format(v, spec) if isinstance(v, int | float) else ("-" if v is None else str(v))


def speed_cell(r: dict[str, Any]) -> str:
    if r.get("speedup") is not None or r.get("speedup_floor") is None:
        return _fmt(r.get("speedup"), ".1f")
    return f">{r['speedup_floor']:.0f}"


def speed_line(summary: dict[str, Any]) -> str:
    """The planning-time summary: measured where TorchRec finished, a floor (its limit over
    our time) where it ran past the limit, the target judged on what is known."""
    exact = summary.get("speedup_200_tables_16_gpus")
    floor = summary.get("speedup_200_tables_16_gpus_floor")
    if exact is not None:
        key = f"{exact:.1f}x"
        verdict = "holds" if exact >= TARGET_SPEEDUP else "MISSED"
    elif floor is not None:
        key = f"more than {floor:.0f}x (TorchRec's planner ran past its {CASE_TIMEOUT_S} s limit)"
        verdict = "holds" if floor >= TARGET_SPEEDUP else "unknown: the floor is under it"
    else:
        key, verdict = "-", "unknown"
    line = (f"- planning time, 200 tables on 16 GPUs (hugectr_200, 2 hosts): TorchRec / ours = "
            f"{key} (target {TARGET_SPEEDUP:g}x: {verdict}); median over the "
            f"{summary.get('speedup_cases', '-')} cases TorchRec finished "
            f"{_fmt(summary['median_speedup'], '.1f')}x")
    if summary.get("speedup_floor_cases", 0) > summary.get("speedup_cases", 0):
        line += (f", over all {summary['speedup_floor_cases']} (those past the limit at it) "
                 f"at least {summary['median_speedup_floor']:.1f}x")
    return line


def markdown(all_rows: list[dict[str, Any]], summary: dict[str, Any], meta: dict[str, Any],
             notes: str = "", referee: dict[str, Any] | None = None) -> str:
    rows = _main_rows(all_rows)
    lines = [
        "# Our planner vs TorchRec's EmbeddingShardingPlanner", "",
        f"Run `{COMMAND}` on {meta['machine']}, {meta['started']} to {meta['finished']} "
        f"(working tree at commit {meta['commit']}{' + local changes' if meta['dirty'] else ''}"
        f"), torchrec {meta['torchrec']}, torch {meta['torch']}."
        + (f" How it ran: {meta['runs']}." if meta.get("runs") else ""), "",
        "Hardware: `h100` preset (8x H100 80GB per host). Step times are cost-model "
        "estimates of the slowest GPU per training step (sparse part), never measurements: "
        "ours in ms from `planner evaluate`, TorchRec's in ms from its shard estimators. "
        "ratio = our plan / TorchRec's plan under that model (< 1: ours is faster).", "",
        "Baseline settings: TorchRec gets `Topology(world_size, compute_device='cuda', "
        "local_world_size=8, hbm_cap, ddr_cap, ssd_cap, hbm_mem_bw, ddr_mem_bw, ssd_mem_bw, "
        "hbm_to_ddr_mem_bw, intra_host_bw, inter_host_bw)` from our hardware profile "
        "(`planner/interop/torchrec_model.py`: HBM left after our 10 GiB reservation, "
        "host DDR/SSD per GPU, effective HBM, PCIe/DDR, SSD, NVLink and NIC rates in bytes/ms),"
        " `HeuristicalStorageReservation(percentage=0.0)` (our reservation is already "
        "subtracted), `ParameterConstraints(pooling_factors=[p])` per table, each table's "
        "fused optimizer applied to the meta model (for its storage estimate), and an "
        "`EmbeddingBagCollectionSharder` with our forward/backward all-to-all precisions as "
        "qcomm codecs. Everything else is its default: proposers (grid search, greedy x2, "
        "uniform), GreedyPerfPartitioner, NoopPerfModel, its kernel constants and "
        f"bwd_compute_multiplier, batch size per rank = ours. Per case TorchRec gets "
        f"{CASE_TIMEOUT_S} s.", "",
        "## Summary", "",
        f"- cases: {summary['cases']}, compared under both models: {summary['compared']}",
        speed_line(summary),
        f"- median ratio under our cost model: {_fmt(summary['median_ratio_under_ours'], '.3f')}"
        f" (multi-host {_fmt(summary['median_ratio_under_ours_multihost'], '.3f')})",
        f"- median ratio under TorchRec's estimators: "
        f"{_fmt(summary['median_ratio_under_torchrec'], '.3f')}; multi-host cases "
        f"{_fmt(summary['median_ratio_under_torchrec_multihost'], '.3f')} (target <= "
        f"{1 - TARGET_MULTIHOST_GAIN:.2f})",
        f"- best possible ratio under TorchRec's estimators (a lower bound on any plan's step "
        f"time there / TorchRec's plan; `benchmarks/torchrec_bound.py`), median over the "
        f"compared multi-host cases: "
        f"{_fmt(summary.get('median_best_possible_ratio_multihost'), '.3f')} "
        f"({summary.get('bounded_multihost', 0)} of {summary.get('compared_multihost', '-')} "
        f"bounded), over all compared cases "
        f"{_fmt(summary.get('median_best_possible_ratio'), '.3f')} "
        f"({summary.get('bounded', 0)} bounded): the target <= "
        f"{1 - TARGET_MULTIHOST_GAIN:.2f} needs the first at or below it", "",
        "## Cases", "",
        "| fixture | GPUs | tables | ours plan s | TorchRec plan s | speedup | ours/ours-model ms "
        "| TorchRec/ours-model ms | ratio | ours/TorchRec-model ms | TorchRec/TorchRec-model ms "
        "| ratio | bound, TorchRec-model ms | best possible ratio "
        "| export (exact/adjusted/inexpressible) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ms = lambda s: s * 1e3 if isinstance(s, int | float) else s  # noqa: E731
        exp = r.get("ours_export") or {}
        lines.append(
            f"| {r['fixture']} | {r.get('gpus', '-')} | {r.get('tables', '-')} "
            f"| {_fmt(r.get('ours_plan_time_s'), '.2f')} "
            f"| {_fmt(r.get('torchrec_plan_time_s'), '.1f')} {_status(r)} "
            f"| {speed_cell(r)} "
            f"| {_fmt(ms(r.get('ours_under_ours_s')), '.3f')} "
            f"| {_fmt(ms(r.get('torchrec_under_ours_s')), '.3f')} "
            f"| {_fmt(r.get('ratio_under_ours'), '.3f')} "
            f"| {_fmt(r.get('ours_under_torchrec_ms'), '.3f')} "
            f"| {_fmt(r.get('torchrec_under_torchrec_ms'), '.3f')} "
            f"| {_fmt(r.get('ratio_under_torchrec'), '.3f')} "
            f"| {_fmt(r.get('torchrec_model_bound_ms'), '.3f')} "
            f"| {_fmt(r.get('best_possible_ratio'), '.3f')} "
            f"| {exp.get('exact', '-')}/{exp.get('adjusted', '-')}/"
            f"{exp.get('inexpressible', '-')} |")
    if summary["supplement"]:
        lines += ["", "Supplement (same method, another solver option of ours, its own TorchRec "
                  "run in the same process):", ""]
        for x in summary["supplement"]:
            lines.append(f"- {x['fixture']} on {x['gpus']} GPUs, `solver={x['ours_solver_option']}`"
                         f": ours {_fmt(x['ours_plan_time_s'], '.2f')} s, TorchRec "
                         f"{_fmt(x['torchrec_plan_time_s'], '.1f')} s, speedup "
                         f"{_fmt(x['speedup'], '.1f')}x; ratio under ours "
                         f"{_fmt(x['ratio_under_ours'], '.3f')}, under TorchRec's "
                         f"{_fmt(x['ratio_under_torchrec'], '.3f')}")
    lines += ["", "## Where ours loses, and why", ""]
    for r in rows:
        for reason in _loss_reasons(r):
            lines.append(f"- {r['fixture']} on {r.get('gpus')} GPUs: {reason}")
    bound_notes = [f"- {r['fixture']} on {r.get('gpus')} GPUs: "
                   + (r.get("torchrec_model_bound_warning")
                      or f"{r['torchrec_model_bound_status']} "
                         f"{r.get('torchrec_model_bound_error', '')}".strip())
                   for r in rows if r.get("torchrec_model_bound_warning")
                   or r.get("torchrec_model_bound_status") not in (None, "ok")]
    if bound_notes:
        lines += ["", "## Lower bound not computed or not below every plan", "", *bound_notes]
    lines += ["", "## Cases not compared", ""]
    for r in rows:
        if r.get("ratio_under_ours") is None or r.get("ratio_under_torchrec") is None:
            why = [f"ours: {r.get('ours_status')} {r.get('ours_reason', '')}".strip(),
                   f"TorchRec: {r.get('torchrec_status')} {r.get('torchrec_reason', '')}".strip()]
            if r.get("error"):
                why.append(f"error: {r['error']}")
            if (r.get("ours_export") or {}).get("inexpressible"):
                why.append("our plan has tables TorchRec cannot express")
            lines.append(f"- {r['fixture']} on {r.get('gpus')} GPUs: " + "; ".join(why))
    if notes:
        lines += ["", notes.strip()]
    if referee:
        from benchmarks.referee import markdown as referee_markdown

        lines += ["", *referee_markdown(referee)]
    return "\n".join(lines) + "\n"


def _referee() -> dict[str, Any]:
    """benchmarks/referee.py on the profile benchmarks/fidelity.py calibrates (kept when
    made on this machine, else made again)."""
    from benchmarks.fidelity import calibrated_hardware
    from benchmarks.referee import run_all

    hw = calibrated_hardware(reuse=True)
    if hw is None:
        raise SystemExit("the referee needs `planner calibrate`")
    ref = run_all(hw)
    ref.update(command=COMMAND + " --referee-only", commit=_meta()["commit"],
               finished=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    return ref


def _referee_only() -> None:
    """Run the measured referee alone and put it into the committed results beside the
    planners' comparison from their last run (which it leaves as it was)."""
    from benchmarks import RESULTS

    payload = json.loads((RESULTS / "vs_torchrec.json").read_text())
    payload["referee"] = _referee()
    write_results("vs_torchrec", payload, markdown(
        payload["cases"], payload["summary"], payload["meta"], payload.get("notes", ""),
        payload["referee"]))


def _render() -> None:
    """The committed results summarised and written again by this code (no case runs)."""
    from benchmarks import RESULTS

    payload = json.loads((RESULTS / "vs_torchrec.json").read_text())
    payload["summary"] = summarise(payload["cases"])
    write_results("vs_torchrec", payload, markdown(
        payload["cases"], payload["summary"], payload["meta"], payload.get("notes", ""),
        payload.get("referee")))


def _meta() -> dict[str, Any]:
    import platform
    from importlib.metadata import version

    import torch
    import torchrec  # noqa: F401

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()

    return {"machine": f"{platform.processor() or platform.machine()}, "
                       f"{__import__('os').cpu_count()} CPUs (shared)",
            "commit": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain")),
            "torchrec": version("torchrec"), "torch": torch.__version__,
            "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def _from_log(log: Path, notes: str = "") -> None:
    meta: dict[str, Any] = {}
    rows = []
    for line in log.read_text().splitlines():
        if line.startswith("META "):
            meta = json.loads(line[5:])
        elif line.startswith("{"):
            rows.append(json.loads(line))
    meta.setdefault("finished", "(rebuilt from the log: "
                    + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(log.stat().st_mtime))
                    + ")")
    summary = summarise(rows)
    payload = {"command": COMMAND, "meta": meta, "summary": summary, "cases": rows,
               "case_timeout_s": CASE_TIMEOUT_S}
    write_results("vs_torchrec", payload, markdown(rows, summary, meta, notes))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", nargs=2, metavar=("FIXTURE", "HOSTS"))
    ap.add_argument("--out")
    ap.add_argument("--only", nargs="*", help="fixtures to run (default: all)")
    ap.add_argument("--hosts", nargs="*", type=int, help="host counts to run (default: all)")
    ap.add_argument("--solver", default="auto", help="our solver option (default auto)")
    ap.add_argument("--notes", help="markdown appended to the results (analysis of a run)")
    ap.add_argument("--from-log", help="rebuild the results from a run's printed rows (a run "
                                       "stopped before its end still printed each case)")
    ap.add_argument("--render", action="store_true",
                    help="summarise the committed results again and rewrite them (no run)")
    ap.add_argument("--referee-only", action="store_true",
                    help="run the measured referee (benchmarks/referee.py) alone, into the "
                         "committed results")
    args = ap.parse_args()
    if args.referee_only:
        _referee_only()
        return
    if args.render:
        _render()
        return
    if args.case:
        run_case(args.case[0], int(args.case[1]), Path(args.out), args.solver)
        return
    if args.from_log:
        _from_log(Path(args.from_log), Path(args.notes).read_text() if args.notes else "")
        return
    meta = _meta()
    print("META " + json.dumps(meta), flush=True)
    rows = []
    for fixture, hosts in cases():
        if (args.only and fixture not in args.only) or (args.hosts and hosts not in args.hosts):
            continue
        row = _spawn(fixture, hosts, args.solver)
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = summarise(rows)
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    referee = None if args.only or args.hosts else _referee()
    payload = {"command": COMMAND, "meta": meta, "summary": summary, "cases": rows,
               "case_timeout_s": CASE_TIMEOUT_S, "referee": referee}
    write_results("vs_torchrec", payload, markdown(rows, summary, meta, referee=referee))
    print(markdown(rows, summary, meta, referee=referee))


if __name__ == "__main__":
    main()
