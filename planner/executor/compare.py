"""`planner execute --compare`: the plan's predicted seconds per rank and phase beside what the
ranks measured, with the errors, and for the plan: mean absolute error, Spearman over ranks,
and whether the predicted slowest rank is the measured slowest.

Measured (comm.Timer, per timed step; the median over them for compute, the lower quartile
for collectives, COLLECTIVE_QUANTILE):
- compute phases (lookup, cache_miss, backward): the rank thread's own CPU time, so another
  rank's load on a shared machine does not count as this rank's work;
- collective phases (input_a2a, output_a2a_fwd, output_a2a_bwd, allreduce): the wall time
  inside the collectives, each started after an untimed barrier (the exchange, not the wait
  for a slower peer); or, with collective_clock="cpu", the CPU time of the threads doing
  them (the caller and its process group's gloo threads, thread_clock.py), which the
  machine's other load does not stretch. The
  packing around them (routing ids, encoding, folding partial sums) and the loss are not in
  the cost model: reported as `unmodelled`, not compared.

Pipelined plans (the executor's input lane, input_lane.py): a rank's measured step is its
phases but input_a2a, which ran on the lane beside the previous step, plus input_wait (the
median wall time its step waited for the lane), against the predicted
comm + max(0, compute - overlap * input_a2a) (overlap: the profile's pipeline_overlap);
input_a2a is still compared phase by phase.

Predicted: the plan's per-GPU cost terms (plan_model.CostTerms) of the plan that ran (the
scaled plan, re-evaluated), mapped onto the executor's phases:
  input_a2a <- input_a2a_s; lookup <- lookup_s; cache_miss <- cache_miss_s;
  output_a2a_fwd / output_a2a_bwd <- output_a2a_s split by the model's forward and backward
  bytes of the rank; backward <- backward_s; allreduce <- allreduce_s;
  owner_a2a_s (the sample owner's side, which the executor's all-to-alls carry in the same
  calls) spread over the three all-to-all phases in proportion to their predicted seconds
  (equally when those are all zero). Any other `*_s` term (a later model's) is shown as
  `other`, predicted only.
"""

import math
import statistics
from collections.abc import Sequence
from typing import Any

from planner.executor.predict import whole_call_seconds, with_whole_calls
from planner.plan_model import Plan

PHASES = ("input_a2a", "lookup", "cache_miss", "output_a2a_fwd", "backward", "output_a2a_bwd",
          "allreduce")
COLLECTIVE_PHASES = ("input_a2a", "output_a2a_fwd", "output_a2a_bwd", "allreduce")
_A2A = ("input_a2a", "output_a2a_fwd", "output_a2a_bwd")
_MAPPED_TERMS = {"lookup_s", "backward_s", "cache_miss_s", "input_a2a_s", "output_a2a_s",
                 "owner_a2a_s", "allreduce_s", "compute_s", "comm_s", "total_s"}
# Predicted totals this close (relative) are a tie for the slowest rank.
TIE_REL = 1e-9


# How a collective phase is measured: "wall" (after a barrier) or "cpu" (the CPU time of the
# threads doing the collective, its group's gloo threads included: the exchange's own work, which
# other processes' load does not stretch; on a shared machine the steadier of the two).
COLLECTIVE_CLOCKS = {"wall": "coll_wall", "cpu": "coll_proc_cpu"}


# A collective's figure over the steps: their lower quartile. On a shared machine a
# collective's wall time is bimodal: the exchange itself, or that plus a scheduler's delay
# in waking a peer's thread (0.4-0.6 ms against 1.3-2.3 ms for the same 2-rank all-to-all,
# in a third to half of the steps of some runs, measured); the quartile keeps the exchange
# and is what `planner calibrate` fits (calibration/bench.py), so both sides use one rule.
COLLECTIVE_QUANTILE = 0.25


def collective_figure(values: list[float]) -> float:
    """The COLLECTIVE_QUANTILE of a collective's times over steps (0 for none)."""
    if not values:
        return 0.0
    v = sorted(values)
    at = COLLECTIVE_QUANTILE * (len(v) - 1)
    lo = int(at)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (at - lo)


def measured_phases(timing: list[dict[str, dict[str, float]]], collective_clock: str = "wall"
                    ) -> tuple[dict[str, float], dict[str, float]]:
    """(compared phases, unmodelled work) in seconds: compute phases the median over steps,
    collectives their lower quartile (collective_figure)."""
    def med(values: list[float]) -> float:
        return statistics.median(values) if values else 0.0

    out = {}
    for ph in PHASES:
        if ph in COLLECTIVE_PHASES:
            out[ph] = collective_figure([s.get(ph, {}).get(COLLECTIVE_CLOCKS[collective_clock],
                                                           0.0) for s in timing])
        else:
            out[ph] = med([s.get(ph, {}).get("cpu", 0.0) for s in timing])
    # Pipelined: the steps whose input came from the lane waited input_wait for it (wall).
    waits = [s["input_wait"].get("wall", 0.0) for s in timing if "input_wait" in s]
    unmodelled = {"loss_cpu": med([s.get("loss", {}).get("cpu", 0.0) for s in timing]),
                  "input_wait_wall": med(waits) if waits else None,
                  "packing_cpu": med([sum(s.get(ph, {}).get("cpu", 0.0)
                                          for ph in COLLECTIVE_PHASES) for s in timing]),
                  "step_wall": med([sum(t.get("wall", 0.0) for ph, t in s.items()
                                        if ph != "cache_miss") for s in timing]),
                  "collective_calls": med([sum(t.get("calls", 0) for t in s.values())
                                           for s in timing])}
    return out, unmodelled


def forward_share(fwd_bytes: float, bwd_bytes: float) -> float:
    """The share of the output all-to-all term (latency and bytes alike) predicted_phases
    puts on the forward phase: its share of the bytes, half where there are none."""
    both = fwd_bytes + bwd_bytes
    return fwd_bytes / both if both > 0 else 0.5


def predicted_phases(cost: dict[str, float], fwd_bytes: float, bwd_bytes: float
                     ) -> dict[str, float]:
    """The plan's cost terms of one GPU on the executor's phases (module docstring)."""
    out_a2a = cost.get("output_a2a_s", 0.0)
    f = forward_share(fwd_bytes, bwd_bytes)
    p = {"input_a2a": cost.get("input_a2a_s", 0.0), "lookup": cost.get("lookup_s", 0.0),
         "cache_miss": cost.get("cache_miss_s", 0.0), "output_a2a_fwd": out_a2a * f,
         "backward": cost.get("backward_s", 0.0), "output_a2a_bwd": out_a2a * (1 - f),
         "allreduce": cost.get("allreduce_s", 0.0)}
    owner = cost.get("owner_a2a_s", 0.0)
    if owner:
        side = sum(p[k] for k in _A2A)
        for k in _A2A:
            p[k] += owner * (p[k] / side if side > 0 else 1 / len(_A2A))
    other = sum(v for k, v in cost.items() if k.endswith("_s") and k not in _MAPPED_TERMS)
    if other:
        p["other"] = other
    return p


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rank correlation with average ranks for ties; None when either side is
    constant or has fewer than 2 values (undefined)."""
    if len(x) < 2 or len(x) != len(y):
        return None

    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def hardware_note(plan: Plan, device: str) -> tuple[bool, str]:
    """(whether the prediction is for the machine measured, a sentence saying so). A plan's
    figures are for the hardware of its request: a bundled GPU preset measured on this CPU
    is not the machine predicted, and its ratios mean nothing until calibration."""
    from planner.presets import preset_names

    hw = plan.request.hardware
    text = " ".join([hw.name, hw.description, *hw.sources, hw.gpu.name]).lower()
    calibrated = "calibrat" in text
    gpu_name = hw.gpu.name
    on_cpu = not device.startswith("cuda")
    if hw.name in preset_names() and not calibrated:
        return False, (f"predicted for the preset '{hw.name}' ({gpu_name}), measured on "
                       f"{device}: the machine measured is not the one predicted, so the "
                       f"ratios are meaningless until the plan is made with a profile "
                       f"calibrated on this machine (planner calibrate, then planner plan "
                       f"--hardware profile.json)")
    if on_cpu and not calibrated and "cpu" not in gpu_name.lower():
        return False, (f"predicted for '{hw.name}' ({gpu_name}), measured on {device}: not "
                       f"a profile of this CPU, so the ratios are not a test of the model")
    return True, f"predicted for '{hw.name}' ({gpu_name}), measured on {device}"


def measured_over(timings: list[list[dict[str, dict[str, float]]]],
                  collective_clock: str = "wall"
                  ) -> tuple[dict[str, float], dict[str, float | None]]:
    """measured_phases of one rank over several executions of a plan: each figure the
    median over the executions of its figure in each (each execution is its own process
    group, whose collectives run at their own level: a 64-byte all-to-all's figure ran
    127-196 us from one group to the next here, measured)."""
    each = [measured_phases(t, collective_clock) for t in timings]
    if len(each) == 1:
        return each[0]

    def med(values: list[float | None]) -> float | None:
        seen = [v for v in values if v is not None]
        return statistics.median(seen) if seen else None

    phases = {ph: med([m[ph] for m, _ in each]) or 0.0 for ph in each[0][0]}
    unmodelled = {k: med([u[k] for _, u in each]) for k in each[0][1]}
    return phases, unmodelled


def compare(plan: Plan, ranks: list[dict[str, Any]], device: str,
            collective_clock: str = "wall",
            repeats: Sequence[list[dict[str, Any]]] = ()) -> dict[str, Any]:
    """Per rank and phase: predicted, measured, error = (predicted - measured) / measured
    (None where nothing was measured); for the plan: the errors' summaries, Spearman over
    ranks of the totals, the slowest ranks. `ranks`: ExecutionReport.ranks (with timing);
    `repeats`: the ranks of further executions of the same plan, each rank's figures then
    the median over every execution (measured_over)."""
    gpus = {g.rank: g for g in plan.gpus}
    # The executor's whole all-reduce calls where the plan charges shares (predict.py), of
    # `plan` itself: the same executions compared with the layout priced under another
    # profile are held to that profile's calls, not to those of the plan that ran.
    wholes = whole_call_seconds(plan)
    rows = []
    for r in ranks:
        g = gpus[r["rank"]]
        cost = g.cost.model_dump()
        whole = wholes[r["rank"]]
        cost["allreduce_s"] += whole
        pred = predicted_phases(cost, r["bytes"]["output_fwd"]["predicted"],
                                r["bytes"]["output_bwd"]["predicted"])
        same = [next(q for q in rep if q["rank"] == r["rank"]) for rep in repeats]
        meas, unmodelled = measured_over([q.get("timing") or [] for q in (r, *same)],
                                         collective_clock)
        pipelined = plan.request.model.pipelined
        step_pred = with_whole_calls(g.cost, whole, pipelined,
                                     plan.request.hardware.constants.pipeline_overlap)
        phases = {}
        for ph in (*PHASES, *(k for k in pred if k not in PHASES)):
            p, m = pred.get(ph, 0.0), meas.get(ph) if ph in PHASES else None
            if p == 0.0 and not m:
                continue
            err = (p - m) / m if m else None
            phases[ph] = {"predicted": p, "measured": m, "error": err}
        wait = unmodelled["input_wait_wall"]
        rows.append({"rank": r["rank"], "phases": phases,
                     # Pipelined: the step as cost.step_time has it, and as it ran: the
                     # phases but the lane's input all-to-all, plus the wait for it.
                     "predicted_total": step_pred if pipelined else sum(pred.values()),
                     "predicted_step_s": step_pred,
                     "measured_total": (sum(v for k, v in meas.items() if k != "input_a2a")
                                        + wait if pipelined and wait is not None
                                        else sum(meas.values())),
                     "unmodelled": unmodelled})
    for row in rows:
        m = row["measured_total"]
        row["error"] = (row["predicted_total"] - m) / m if m else None
    pairs = [v for row in rows for v in row["phases"].values() if v["measured"] is not None]
    rel = [abs(v["error"]) for v in pairs if v["error"] is not None]
    pt = [row["predicted_total"] for row in rows]
    mt = [row["measured_total"] for row in rows]
    top = max(pt) if pt else 0.0
    pred_slowest = [row["rank"] for row in rows
                    if row["predicted_total"] >= top * (1 - TIE_REL)]
    meas_slowest = max(rows, key=lambda row: row["measured_total"])["rank"] if rows else None
    # Every rank predicted alike (a balanced plan): no predicted slowest rank to test.
    match = None if len(pred_slowest) == len(rows) else meas_slowest in pred_slowest
    same_machine, note = hardware_note(plan, device)
    return {
        "ranks": rows,
        "plan": {
            "mean_abs_error_s": statistics.fmean([abs(v["predicted"] - v["measured"])
                                                  for v in pairs]) if pairs else None,
            "mean_abs_rel_error": statistics.fmean(rel) if rel else None,
            "median_abs_rel_error": statistics.median(rel) if rel else None,
            "spearman_ranks": spearman(pt, mt),
            "predicted_step_s": max((row["predicted_step_s"] for row in rows), default=0.0),
            "measured_step_s": max(mt, default=0.0),
            "predicted_slowest": pred_slowest,
            "measured_slowest": meas_slowest,
            "slowest_match": match,
            "same_machine": same_machine,
            "hardware_note": note,
            "collective_clock": collective_clock,
        },
    }
