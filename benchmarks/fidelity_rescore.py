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
"""

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks import RESULTS
from benchmarks.fidelity import PHASES, PLAN_DIR, PLANS, request
from planner.executor.compare import TIE_REL, predicted_phases, spearman
from planner.executor.predict import predict, with_whole_calls
from planner.executor.scale import scaled_plan
from planner.plan_model import Plan, PlanLayout
from planner.planning import evaluate, resolve


def predictions(hardware: dict[str, Any], name: str
                ) -> tuple[list[dict[str, float]], list[float]]:
    """(per rank: predicted seconds per executor phase, and its predicted total as compare
    has it) of the kept layout of `name` priced under `hardware`, scaled as the fidelity
    run executed it."""
    kept = Plan.model_validate_json((PLAN_DIR / "calibrated" / f"{name}.plan.json").read_text())
    resolved = resolve(request(name, hardware))
    p = evaluate(PlanLayout(schema_version=kept.schema_version, request=resolved,
                            tables=kept.tables))
    _, _, _, _, _, _, scale, batch = PLANS[name]
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
        steps.append(with_whole_calls(g.cost, whole, pipelined) if pipelined
                     else sum(phases.values()))
    return out, steps


def score(hardware: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """Per calibrated pass of `measured` (fidelity.json): the benchmark's summary figures
    for the profile's predictions."""
    passes = []
    for run in measured["calibrated"]["runs"]:
        errs: dict[str, list[float]] = {ph: [] for ph in PHASES}
        pred_steps, meas_steps, slowest = [], [], []
        for name, res in sorted(run["plans"].items()):
            comp = res["by_clock"]["wall"]
            pred, totals = predictions(hardware, name)
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


def main(paths: list[str]) -> None:
    measured = json.loads((RESULTS / "fidelity.json").read_text())
    print(f"measurements: fidelity.json of {measured['code']['commit'][:10]}")
    for path in paths:
        out = score(json.loads(Path(path).read_text()), measured)
        for i, p in enumerate(out["passes"], 1):
            by = ", ".join(f"{k} {v:+.0%}" for k, v in p["median_error_by_phase"].items())
            print(f"{path} pass {i}: Spearman {p['spearman_step']:.3f}, median |error| "
                  f"{p['median_abs_error']:.1%}, slowest {p['slowest_match_fraction']:.0%}; "
                  f"signed: {by}")


if __name__ == "__main__":
    main(sys.argv[1:])
