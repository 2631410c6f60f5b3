"""A measured referee for benchmarks/vs_torchrec: our plan and TorchRec's, run side by side.

Both cost models are models; which plan is faster is settled here by running both. For each
case (a bundled fixture on a topology of this machine's cores), on a hardware profile
calibrated on this machine (`planner calibrate`, the one benchmarks/fidelity.py fits and
keeps), it
- scales the job down to what runs here (every table's rows times `scale_rows`, at least one;
  `batch` samples per rank) and plans that job with `planner.plan` (solver auto) and with
  TorchRec's EmbeddingShardingPlanner on the same tables and topology
  (planner/interop/torchrec_model.py maps the profile). Until this version both planned the
  full-size fixture and the plans were scaled down to run, which referees neither: at full
  size a table is priced by its bytes, scaled down by its launches, and our model priced our
  own scaled plan 18-58% over TorchRec's in 3 of 5 cases (13dffaa's calibration);
- imports TorchRec's plan (`layout_from_torchrec`) and scores it with our model
  (`evaluate`): the prediction beside the measurement;
- runs both plans with `planner execute` as planned (the same seed, so the same ids),
  measured as benchmarks/fidelity.py measures (`timed_execution`: timed steps after the
  measured ones, compute in the rank thread's CPU time, collectives in wall time after a
  barrier, their lower quartile), `RUNS` times each, alternating, and reports each plan's
  measured step time (the slowest rank's sum over the phases the model prices) and the
  ratio ours / TorchRec's; beside it the same executions with the collectives in their
  threads' CPU time (`compare_cpu`), the clock `planner calibrate` fits the all-to-all's
  call in on CPU and the steadier one on this shared machine.

A plan TorchRec's planner cannot make, or that our executor cannot run, is reported with
the reason, never dropped.

Usage (from the repo root; a few minutes):
    PYTHONPATH=. python -m benchmarks.vs_torchrec --referee-only
"""

import json
import statistics
import time
from typing import Any

# (fixture, hosts, GPUs per host, scale_rows, batch per rank): 2 ranks, one per core here.
CASES: tuple[tuple[str, int, int, float, int], ...] = (
    ("criteo_kaggle", 1, 2, 0.001, 256),
    ("criteo_kaggle", 2, 1, 0.001, 256),
    ("deeprecsys_rm3", 1, 2, 0.002, 64),
    ("deeprecsys_rm1", 2, 1, 0.001, 32),
    ("criteo_dcnv2", 1, 2, 0.0002, 32),
)
RUNS = 5  # per plan, the median kept: single runs of one plan spread by up to 50% here
# A predicted ratio within this of 1 names neither plan the faster: counted as a miss.
PREDICTED_TIE = 0.01


def _measure(plan: Any, batch: int) -> dict[str, Any]:
    from benchmarks.fidelity import timed_execution, warmup_for

    rep = timed_execution(plan, 1.0, batch, warmup_for(plan, 1.0, batch))
    pl = rep.compare["plan"]
    return {"measured_step_s": pl["measured_step_s"], "predicted_step_s": pl["predicted_step_s"],
            # The same execution, collectives in their threads' CPU time (the clock
            # `planner calibrate` fits the all-to-all's call in on CPU; steadier here).
            "measured_step_cpu_s": rep.compare_cpu["plan"]["measured_step_s"],
            "checks_failed": [c.name for c in rep.checks if not c.ok]}


def scaled_request(fixture: str, scale: float, batch: int) -> dict[str, Any]:
    """The fixture's model as the job that runs: every table's rows times `scale` (at least
    one), `batch` samples per rank."""
    from planner.presets import fixture_text

    model = json.loads(fixture_text(fixture))
    for t in model["tables"]:
        t["num_embeddings"] = max(1, round(t["num_embeddings"] * scale))
    model["batch_size_per_gpu"] = batch
    return model


def run_case(fixture: str, hosts: int, gpus: int, scale: float, batch: int,
             hardware: dict[str, Any]) -> dict[str, Any]:
    import planner
    from planner.interop import TorchRecProblem, export_from_sharding_plan, layout_from_torchrec
    from planner.planning import evaluate, resolve

    hw = json.loads(json.dumps(hardware))
    hw.update(hosts=hosts, gpus_per_host=gpus)
    row: dict[str, Any] = {"fixture": fixture, "hosts": hosts, "gpus_per_host": gpus,
                           "scale_rows": scale, "batch": batch}
    req = resolve({"model": scaled_request(fixture, scale, batch), "hardware": hw,
                   "options": {"solver": "auto"}})
    plans: dict[str, Any] = {"ours": planner.plan(req)}
    try:
        tr = export_from_sharding_plan(TorchRecProblem.of(req).plan(), hosts * gpus, gpus)
        plans["torchrec"] = evaluate(layout_from_torchrec(tr, req))
    except Exception as err:  # TorchRec's PlannerError, or a plan we cannot import
        row["torchrec_error"] = f"{type(err).__name__}: {str(err)[:300]}"
    for who, p in plans.items():
        row[f"{who}_types"] = sorted({f"{t.sharding_type.value}/{t.tier.value}"
                                      for t in p.tables})
        row[f"{who}_under_ours_s"] = p.summary.step_time_s
    runs: dict[str, list[dict[str, Any]]] = {who: [] for who in plans}
    for _ in range(RUNS):
        for who, p in plans.items():  # alternating, so drift in the machine hits both
            try:
                runs[who].append(_measure(p, batch))
            except Exception as err:
                row[f"{who}_run_error"] = f"{type(err).__name__}: {str(err)[:300]}"
                break
    for who, rs in runs.items():
        if rs:
            row[f"{who}_measured_s"] = [r["measured_step_s"] for r in rs]
            row[f"{who}_measured_cpu_s"] = [r["measured_step_cpu_s"] for r in rs]
            row[f"{who}_predicted_scaled_s"] = rs[0]["predicted_step_s"]
            row[f"{who}_checks_failed"] = sorted({c for r in rs for c in r["checks_failed"]})
    if row.get("ours_measured_s") and row.get("torchrec_measured_s"):
        o = statistics.median(row["ours_measured_s"])
        t = statistics.median(row["torchrec_measured_s"])
        row["measured_ratio"] = o / t  # ours / TorchRec's: below 1, ours ran faster
        row["measured_ratio_cpu"] = statistics.median(row["ours_measured_cpu_s"]) / \
            statistics.median(row["torchrec_measured_cpu_s"])
        row["predicted_ratio"] = row["ours_predicted_scaled_s"] / row[
            "torchrec_predicted_scaled_s"]
    return row


def run_all(hardware: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    rows = []
    for case in CASES:
        row = run_case(*case, hardware=hardware)
        rows.append(row)
        print("REFEREE " + json.dumps(row), flush=True)
    return {"cases": rows, "seconds": time.perf_counter() - t0, "runs": RUNS,
            "hardware": hardware.get("name"), **summary(rows, "measured_ratio"),
            **{f"{k}_cpu": v for k, v in summary(rows, "measured_ratio_cpu").items()}}


def summary(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The median measured ratio (`key`: collectives in wall or CPU time) and, over the
    cases whose two plans differ by more than 5% measured, in how many our model says which
    one is faster (a predicted ratio within PREDICTED_TIE of 1 says neither: a miss)."""
    ratios = [r[key] for r in rows if key in r]
    agree = [abs(r["predicted_ratio"] - 1) > PREDICTED_TIE
             and (r[key] < 1) == (r["predicted_ratio"] < 1) for r in rows
             if key in r and abs(r[key] - 1) > 0.05]
    return {"median_measured_ratio": statistics.median(ratios) if ratios else None,
            "model_picks_the_faster": (sum(agree), len(agree))}


def cpu_ratio(r: dict[str, Any]) -> str:
    """A case's ratio with CPU-time collectives ("-" in results from before it was kept)."""
    return f"{r['measured_ratio_cpu']:.3f}" if "measured_ratio_cpu" in r else "-"


def markdown(ref: dict[str, Any]) -> list[str]:
    lines = [
        "## Measured referee: both plans run", "",
        f"`{ref.get('command', 'PYTHONPATH=. python -m benchmarks.vs_torchrec --referee-only')}`"
        f" (benchmarks/referee.py): each case scaled down (every table's rows times the "
        f"scale, the batch per rank) and that job planned by both planners on the profile "
        f"`{ref['hardware']}` (calibrated on this machine), then both plans run as planned "
        f"with `planner execute`, {ref['runs']} runs each, "
        "alternating; step time = the slowest rank's sum over the priced phases (compute in "
        "CPU time, collectives in wall time, their lower quartile). Ratio = ours / TorchRec's "
        "(median of the runs): below 1, our plan ran faster.", "",
        (f"Median measured ratio {ref['median_measured_ratio']:.3f}"
         if ref["median_measured_ratio"] is not None else "No case ran both plans")
        + f"; our model named the faster plan in {ref['model_picks_the_faster'][0]} of the "
        f"{ref['model_picks_the_faster'][1]} cases whose plans differ by more than 5% "
        f"measured (a predicted ratio within {PREDICTED_TIE:.0%} of 1 names neither)" + (
            f"; collectives in their threads' CPU time (the clock calibrate fits the "
            f"all-to-all's call in): median {ref['median_measured_ratio_cpu']:.3f}, the "
            f"faster plan named in {ref['model_picks_the_faster_cpu'][0]} of "
            f"{ref['model_picks_the_faster_cpu'][1]}"
            if ref.get("median_measured_ratio_cpu") is not None else "")
        + f". {ref['seconds']:.0f} s.", "",
        "| case | scale, batch | ours: types | TorchRec: types | ours measured (ms) | "
        "TorchRec measured (ms) | measured ratio | measured ratio, CPU-time collectives | "
        "predicted ratio (our model) |",
        "|---|---|---|---|---|---|---|---|---|"]
    for r in ref["cases"]:
        def ms(key: str, r: dict[str, Any] = r) -> str:
            return ", ".join(f"{v * 1e3:.2f}" for v in r[key]) if r.get(key) else "-"

        tr_types = ", ".join(r.get("torchrec_types", [])) or r.get("torchrec_error", "-")
        lines.append(
            f"| {r['fixture']} {r['hosts']}x{r['gpus_per_host']} | {r['scale_rows']}, "
            f"{r['batch']} | {', '.join(r.get('ours_types', []))} | {tr_types} | "
            f"{ms('ours_measured_s')} | {ms('torchrec_measured_s')} | "
            f"{r['measured_ratio']:.3f} | {cpu_ratio(r)} | {r['predicted_ratio']:.3f} |"
            if "measured_ratio" in r else
            f"| {r['fixture']} {r['hosts']}x{r['gpus_per_host']} | {r['scale_rows']}, "
            f"{r['batch']} | {', '.join(r.get('ours_types', []))} | {tr_types} | "
            f"{ms('ours_measured_s')} | {ms('torchrec_measured_s')} | - | - | - |")
    return [*lines, ""]
