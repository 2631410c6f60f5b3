"""A GPU calibration and its executions, scored: what `benchmarks/gpu_calibrate.sh` brought
back from a GPU machine, reported here on any machine.

For each executed plan (exec_NAME.json, `planner execute --device cuda --compare` of a fixture
planned on the calibrated profile with one GPU), the same scaled plan is priced again under
the base preset (before calibration) and under the calibrated profile, and each phase's
prediction is set beside what the GPU measured (the report's own measured medians; the
prediction is recomputed here, so the two profiles meet the same executions). Beside it,
field by field, the preset's constants and the fitted ones with their 95% intervals.

    PYTHONPATH=. python -m benchmarks.gpu_fidelity benchmarks/results/gpu_h200/run2
    PYTHONPATH=. python -m benchmarks.gpu_fidelity DIR OTHER/calibrated.json   (print only)

writes DIR/gpu_fidelity.{md,json}. DIR/FIXTURE.plan.json: the plans as executed
(`planner plan FIXTURE --hardware DIR/hw1.json -o ...` with the run's code; deterministic),
whose pieces must be the executed ones.
"""

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from planner.executor.compare import predicted_phases, spearman
from planner.executor.predict import predict
from planner.executor.scale import scaled_plan
from planner.plan_model import Plan, PlanLayout
from planner.planning import evaluate, resolve
from planner.presets import preset_dict
from planner.spec import HardwareSpec
from planner.validation import validate_model

# exec report name -> fixture (as benchmarks/gpu_calibrate.sh ran them)
RUNS = {"kaggle": "criteo_kaggle", "rm2": "deeprecsys_rm2", "dcnv2": "criteo_dcnv2",
        "rm1": "deeprecsys_rm1"}
PHASES = ("lookup", "backward", "input_a2a", "output_a2a_fwd", "output_a2a_bwd")


def priced(layout: Plan, hardware: dict[str, Any], scale: float, batch: int
           ) -> dict[str, float]:
    """Rank 0's predicted seconds per executor phase of `layout` priced under `hardware`,
    scaled as it ran."""
    req = layout.request.model_dump(mode="json")
    req["hardware"] = hardware
    p = evaluate(PlanLayout(schema_version=layout.schema_version, request=resolve(req),
                            tables=layout.tables))
    s = scaled_plan(p, scale, batch)
    (r, *_), _ = predict(s)
    g = min(s.gpus, key=lambda g: g.rank)
    cost = g.cost.model_dump()
    cost["allreduce_s"] = r.seconds["allreduce"]
    return predicted_phases(cost, r.bytes["output_fwd"], r.bytes["output_bwd"])


def main(argv: list[str] | None = None) -> None:
    args = argv or sys.argv[1:]
    d = Path(args[0])
    hw1 = json.loads((d / "hw1.json").read_text())
    if len(args) > 1:  # another run's profile scored on these executions: print only
        other = json.loads(Path(args[1]).read_text())
        body = score(d, {**other, "hosts": 1, "gpus_per_host": 1})
        print(f"{args[1]} on {d}'s executions: {json.dumps(body['summary'])}")
        return
    body = score(d, hw1)
    (d / "gpu_fidelity.json").write_text(json.dumps(body, indent=1) + "\n")
    (d / "gpu_fidelity.md").write_text(markdown(body))
    print(markdown(body))


def score(d: Path, hw1: dict[str, Any]) -> dict[str, Any]:
    """The preset and `hw1` (a one-GPU profile) priced on DIR's executions."""
    prov = json.loads((d / "calibrated.provenance.json").read_text())
    base = prov["base_preset"]
    preset1 = {**preset_dict(base), "hosts": 1, "gpus_per_host": 1}
    rows, steps = [], {"measured": [], "preset": [], "calibrated": []}
    for name, fixture in RUNS.items():
        rep = json.loads((d / f"exec_{name}.json").read_text())
        laid = Plan.model_validate_json((d / f"{fixture}.plan.json").read_text())
        # The executed layout: every piece's table, tier and rank (the hash would also
        # take in the memory figures of the code that planned it).
        ran = sorted((x["table"], x["tier"], x["rank"]) for x in rep["pieces"])
        kept = sorted((t.name, str(t.tier), pc.rank) for t in laid.tables for pc in t.pieces)
        if ran != kept:
            raise SystemExit(f"{name}: {fixture}.plan.json is not the layout executed")
        meas = {ph: v["measured"] for ph, v in rep["compare"]["ranks"][0]["phases"].items()}
        pred = {k: priced(laid, h, rep["scale_rows"], rep["batch"])
                for k, h in (("preset", preset1), ("calibrated", hw1))}
        for ph in PHASES:
            m = meas.get(ph)
            if m:
                rows.append({"plan": name, "phase": ph, "measured": m,
                             **{k: pred[k].get(ph, 0.0) for k in pred}})
        steps["measured"].append(rep["compare"]["plan"]["measured_step_s"])
        for k in pred:
            steps[k].append(sum(pred[k].get(ph, 0.0) for ph in PHASES))
    summary = {}
    for k in ("preset", "calibrated"):
        errs = [(r[k] - r["measured"]) / r["measured"] for r in rows
                if r["phase"] in ("lookup", "backward")]
        summary[k] = {"median_abs_error_compute": statistics.median(abs(e) for e in errs),
                      "spearman_step": spearman(steps[k], steps["measured"])}
    consts = []
    pc = validate_model(HardwareSpec, preset_dict(base)).constants.model_dump()
    fitted = {**prov["fits"]["kernels"]["constants"],
              **((prov["fits"].get("host") or {}).get("constants") or {})}
    for n, v in json.loads((d / "calibrated.json").read_text())["constants"].items():
        f = fitted.get(n)
        consts.append({"name": n, "preset": pc.get(n), "profile": v,
                       "ci95": f["ci95"] if f else None})
    body = {"device": prov["device"], "torch": prov["torch"], "cuda": prov.get("cuda"),
            "date": prov["date"], "base_preset": base, "command": prov["command"],
            "rows": rows, "steps": steps, "summary": summary, "constants": consts,
            "effective_bandwidth_gb_per_s": prov["effective_bandwidth_gb_per_s"],
            "kernel_fit": {k: prov["fits"]["kernels"][k]
                           for k in ("rel_residual_median", "rel_residual_p90", "outliers")},
            "kept_from_preset": prov["kept_from_preset"]}
    return body


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def markdown(b: dict[str, Any]) -> str:
    out = [f"# GPU calibration scored: {b['cuda']}, torch {b['torch']}",
           "", f"Calibrated {b['date']} with `{b['command']}` (base preset {b['base_preset']});"
           " table made by `PYTHONPATH=. python -m benchmarks.gpu_fidelity DIR`.", "",
           "## Per plan and phase (rank 0 of one GPU; seconds; error = predicted / measured"
           " - 1)", "",
           "| plan | phase | measured | preset predicts | error | calibrated predicts | error |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for r in b["rows"]:
        m = r["measured"]
        out.append(f"| {r['plan']} | {r['phase']} | {m:.3g} | {r['preset']:.3g} | "
                   f"{r['preset'] / m - 1:+.1%} | {r['calibrated']:.3g} | "
                   f"{r['calibrated'] / m - 1:+.1%} |")
    s = b["summary"]
    out += ["", "| | preset | calibrated |", "|---|---:|---:|",
            f"| median \\|error\\|, lookup and backward | "
            f"{s['preset']['median_abs_error_compute']:.1%} | "
            f"{s['calibrated']['median_abs_error_compute']:.1%} |",
            f"| Spearman(predicted, measured step) over the plans | "
            f"{_g(s['preset']['spearman_step'])} | {_g(s['calibrated']['spearman_step'])} |",
            "", "## Constants, field by field", "",
            "Seconds, or a fraction of the link's nominal bandwidth (`*_efficiency`); the"
            " interval where the field is fitted (efficiencies come from fitted inverse"
            " bandwidths).", "",
            "| constant | preset | calibrated profile | 95% interval of the fit |",
            "|---|---:|---:|---|"]
    for c in b["constants"]:
        ci = f"{c['ci95'][0]:.3g} .. {c['ci95'][1]:.3g}" if c["ci95"] else "-"
        out.append(f"| {c['name']} | {_g(c['preset'])} | {_g(c['profile'])} | {ci} |")
    eff = ", ".join(f"{k} {_g(v)}" for k, v in b["effective_bandwidth_gb_per_s"].items())
    kf = b["kernel_fit"]
    out += ["", f"Effective bandwidths (GB/s): {eff}.", "",
            f"Kernel fit: median |relative residual| {kf['rel_residual_median']:.3f}, p90 "
            f"{kf['rel_residual_p90']:.3f}, {kf['outliers']} outliers.", "",
            "Kept from the preset (not measurable here): "
            + ", ".join(b["kept_from_preset"]) + ".", ""]
    return "\n".join(out)


if __name__ == "__main__":
    main()
