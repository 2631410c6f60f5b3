"""A hardware profile scored against the committed fidelity measurements, without running
the plans again.

`benchmarks/fidelity` calibrates and executes in one run, so a change to the calibration and
the machine's state on the day move its figures together (two runs of the same code gave
19-20% and 13-16% median error per phase here). This scores any number of profiles against
one fixed set of measured executions (benchmarks/results/fidelity.json, calibrated passes):
each kept plan layout is priced under the profile (planning.evaluate, then scaled as the run
scaled it) and its per-rank, per-phase prediction compared with what was measured, as
`planner execute --compare` compares them (compare.predicted_phases; collectives in wall
time). So calibrations, and calibration methods, can be compared on the same ground truth.

    PYTHONPATH=. python -m benchmarks.fidelity_rescore PROFILE.json [PROFILE.json ...]
    PYTHONPATH=. python -m benchmarks.fidelity_rescore --calibrations 4
    PYTHONPATH=. python -m benchmarks.fidelity_rescore --sessions S0.provenance.json ... \
        --group 3

The second form runs `planner calibrate` afresh that many times (about a minute each) and
writes benchmarks/results/fidelity_rescore.{md,json}: how far one calibration's figures
move from the next's against the same measurements. The third scores earlier calibration
sessions alone and the fit of each run of `--group` consecutive ones (`planner calibrate
--from`, each point the median, as benchmarks/fidelity calibrates), written to
benchmarks/results/fidelity_sessions_rescore.{md,json}.
"""

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import RESULTS, write_results
from benchmarks.fidelity import PHASES, PLAN_DIR, RANKS, request
from planner.executor.compare import TIE_REL, predicted_phases, spearman
from planner.executor.predict import predict, with_whole_calls
from planner.executor.scale import scaled_plan
from planner.plan_model import Plan, PlanLayout
from planner.planning import evaluate, resolve


def predictions(hardware: dict[str, Any], name: str, shape: tuple[float, int]
                ) -> tuple[list[dict[str, float]], list[float]]:
    """(per rank: predicted seconds per executor phase, and its predicted total as compare
    has it) of the kept layout of `name` priced under `hardware`, scaled to `shape`
    (scale_rows, batch per rank) as the fidelity run executed it."""
    kept = Plan.model_validate_json((PLAN_DIR / "calibrated" / f"{name}.plan.json").read_text())
    resolved = resolve(request(name, hardware))
    p = evaluate(PlanLayout(schema_version=kept.schema_version, request=resolved,
                            tables=kept.tables))
    scale, batch = shape
    s = scaled_plan(p, scale, batch)
    ranks, _ = predict(s)
    pipelined = s.request.model.pipelined
    out, steps = [], []
    for g, r in zip(sorted(s.gpus, key=lambda g: g.rank), ranks, strict=True):
        cost = g.cost.model_dump()
        whole = r.seconds["allreduce"] - cost["allreduce_s"]
        cost["allreduce_s"] += whole
        phases = predicted_phases(cost, r.bytes["output_fwd"], r.bytes["output_bwd"])
        out.append(phases)
        steps.append(with_whole_calls(g.cost, whole, pipelined,
                                      s.request.hardware.constants.pipeline_overlap)
                     if pipelined
                     else sum(phases.values()))
    return out, steps


def score(hardware: dict[str, Any], measured: dict[str, Any], clock: str = "wall"
          ) -> dict[str, Any]:
    """Per calibrated pass of `measured` (fidelity.json): the benchmark's summary figures
    for the profile's predictions, collectives measured in `clock` (wall or cpu)."""
    passes = []
    # Each run executed the same plans: each is priced once under the profile.
    priced: dict[str, tuple[list[dict[str, float]], list[float]]] = {}
    for run in measured["calibrated"]["runs"]:
        errs: dict[str, list[float]] = {ph: [] for ph in PHASES}
        pred_steps, meas_steps, slowest = [], [], []
        for name, res in sorted(run["plans"].items()):
            comp = res["by_clock"][clock]
            if name not in priced:
                # At the shape the run executed (kept with each plan's results).
                priced[name] = predictions(hardware, name,
                                           (res["scale_rows"], res["batch"]))
            pred, totals = priced[name]
            pred_steps.append(max(totals))
            meas_steps.append(comp["plan"]["measured_step_s"])
            for row in comp["ranks"]:
                p = pred[row["rank"]]
                for ph, v in row["phases"].items():
                    m = v["measured"]
                    if ph in errs and m:
                        errs[ph].append((p.get(ph, 0.0) - m) / m)
            top = max(totals)
            tied = [i for i, t in enumerate(totals) if t >= top * (1 - TIE_REL)]
            if len(tied) < len(totals):
                meas = max(comp["ranks"], key=lambda row: row["measured_total"])["rank"]
                slowest.append(1.0 if meas in tied else 0.0)
        every = [abs(e) for v in errs.values() for e in v]
        passes.append({
            "spearman_step": spearman(pred_steps, meas_steps),
            "median_abs_error": statistics.median(every),
            "median_error_by_phase": {ph: statistics.median(v) for ph, v in errs.items()
                                      if v},
            "slowest_match_fraction": statistics.fmean(slowest) if slowest else None})
    return {"passes": passes}


def _line(label: str, p: dict[str, Any]) -> str:
    by = ", ".join(f"{k} {v:+.1%}" for k, v in p["median_error_by_phase"].items())
    slow = p["slowest_match_fraction"]
    return (f"| {label} | {p['spearman_step']:.3f} | {p['median_abs_error']:.1%} | "
            f"{'-' if slow is None else f'{slow:.0%}'} | {by} |")


CLOCK_WORDS = {"wall": "wall time after a barrier", "cpu": "their threads' CPU time"}


def calibrations(n: int, clock: str = "wall") -> None:
    """`planner calibrate` n times, each scored against the committed measurements
    (collectives in `clock`); the results written (module docstring)."""
    measured = json.loads((RESULTS / "fidelity.json").read_text())
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            out = Path(tmp) / f"cal{i}.json"
            subprocess.run(["planner", "calibrate", "--device", "cpu", "--world-size",
                            str(RANKS), "--quiet", "-o", str(out)], check=True,
                           stdout=subprocess.DEVNULL)
            hw = json.loads(out.read_text())
            rows.append({"constants": hw["constants"], **score(hw, measured, clock)})
    committed = score(json.loads((RESULTS / "fidelity_profile.json").read_text()), measured,
                      clock)
    lines = ["# Calibrations scored against one set of measurements", "",
             "Command: `PYTHONPATH=. python -m benchmarks.fidelity_rescore --calibrations "
             f"{n} --clock {clock}`; {time.monotonic() - t0:.0f} s. Measurements: the "
             f"committed `fidelity.json` (code {measured['code']['commit'][:10]}), its "
             f"calibrated passes, collectives in {CLOCK_WORDS[clock]}. Each row is a fresh "
             "`planner calibrate` on this machine, its profile pricing the same kept "
             "layouts; the spread between rows is the calibration's own, with the "
             "executions held fixed.", "",
             "| profile, pass | Spearman(predicted, measured step) | median \\|error\\| "
             "per rank and phase | predicted slowest = measured | median signed error "
             "per phase |", "|---|---:|---:|---:|---|"]
    for i, p in enumerate(committed["passes"], 1):
        lines.append(_line(f"the run's own calibration, pass {i}", p))
    for k, r in enumerate(rows, 1):
        for i, p in enumerate(r["passes"], 1):
            lines.append(_line(f"calibration {k}, pass {i}", p))
    errs = [p["median_abs_error"] for r in rows for p in r["passes"]]
    lines += ["", f"Median |error| over the {n} calibrations' passes: {min(errs):.1%} to "
              f"{max(errs):.1%} (median {statistics.median(errs):.1%}).", ""]
    write_results("fidelity_rescore", {"measured_code": measured["code"], "clock": clock,
                                       "committed_profile": committed,
                                       "calibrations": rows}, "\n".join(lines))
    print("\n".join(lines))


def sessions_scored(paths: list[Path], group: int, clock: str = "wall") -> None:
    """Each calibration session (`planner calibrate`'s provenance file) scored alone, then
    the fit of each run of `group` consecutive sessions (`planner calibrate --from`, each
    point their median), against the committed measurements; the results written
    (fidelity_sessions_rescore): whether a median of sessions moves less than one."""
    measured = json.loads((RESULTS / "fidelity.json").read_text())
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        sets = [[i] for i in range(len(paths))]
        sets += [list(range(i, i + group)) for i in range(len(paths) - group + 1)]
        for k, idx in enumerate(sets):
            out = Path(tmp) / f"fit{k}.json"
            subprocess.run(["planner", "calibrate", "--quiet", "-o", str(out),
                            *[a for i in idx for a in ("--from", str(paths[i]))]],
                           check=True, stdout=subprocess.DEVNULL)
            hw = json.loads(out.read_text())
            rows.append({"sessions": idx, "constants": hw["constants"],
                         **score(hw, measured, clock)})
    name = " ".join(str(p) for p in paths)
    lines = ["# Calibration sessions, alone and as medians, scored against one set of "
             "measurements", "",
             f"Command: `PYTHONPATH=. python -m benchmarks.fidelity_rescore --clock {clock} "
             f"--group {group} --sessions {name}`; {time.monotonic() - t0:.0f} s. "
             f"Measurements: the committed `fidelity.json` (code "
             f"{measured['code']['commit'][:10]}), its calibrated passes, collectives in "
             f"{CLOCK_WORDS[clock]}. A row of one session is that `planner calibrate`'s "
             f"profile; a row of {group} is `planner calibrate --from` them (each point the "
             "median over the sessions), as benchmarks/fidelity calibrates.", "",
             r"| sessions, pass | Spearman(predicted, measured step) | median \|error\| "
             "per rank and phase | predicted slowest = measured | median signed error "
             "per phase |", "|---|---:|---:|---:|---|"]
    for r in rows:
        for i, p in enumerate(r["passes"], 1):
            lines.append(_line(f"{'+'.join(str(j) for j in r['sessions'])}, pass {i}", p))
    lines.append("")
    for size in sorted({len(r["sessions"]) for r in rows}):
        errs = [p["median_abs_error"] for r in rows if len(r["sessions"]) == size
                for p in r["passes"]]
        sp = [p["spearman_step"] for r in rows if len(r["sessions"]) == size
              for p in r["passes"]]
        lines.append(f"- {size} session(s) a profile: median |error| {min(errs):.1%} to "
                     f"{max(errs):.1%} (median {statistics.median(errs):.1%}), Spearman "
                     f"{min(sp):.3f} to {max(sp):.3f}.")
    lines.append("")
    write_results("fidelity_sessions_rescore",
                  {"measured_code": measured["code"], "clock": clock, "group": group,
                   "sessions": [str(p) for p in paths], "rows": rows}, "\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", nargs="*", help="hardware profile JSON files to score")
    ap.add_argument("--calibrations", type=int, default=0,
                    help="run planner calibrate this many times and score each")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="the collectives' measured clock to score against (fidelity.json "
                         "holds both)")
    ap.add_argument("--sessions", nargs="*", type=Path, default=None,
                    help="calibration sessions (provenance files) to score alone and as "
                         "medians of --group consecutive ones")
    ap.add_argument("--group", type=int, default=3)
    args = ap.parse_args()
    if args.group < 1:
        ap.error("--group must be at least 1")
    if args.sessions is not None and not args.sessions:
        ap.error("--sessions needs the sessions' provenance files")
    if args.sessions:
        sessions_scored(args.sessions, args.group, args.clock)
    if args.calibrations:
        calibrations(args.calibrations, args.clock)
    measured = json.loads((RESULTS / "fidelity.json").read_text())
    for path in args.profiles:
        out = score(json.loads(Path(path).read_text()), measured, args.clock)
        for i, p in enumerate(out["passes"], 1):
            print(_line(f"{path}, pass {i}", p))


if __name__ == "__main__":
    main()
