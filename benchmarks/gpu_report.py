"""Summarise what benchmarks/gpu_h100.py and benchmarks/gpu_lookup.py measured on the lent GPU
into benchmarks/results/gpu_h100.json, and print the tables of gpu_h100.md.

Per run: the memory model's per-GPU HBM (predicted), the allocator's peak (measured), and the
step buffers the model does not count, as the executor allocates them (formulas below, from
the scaled plan's shapes: n ids and B samples per table, c columns, u unique ids <= n),
beside the allocator's measured growth in each phase:
  ids_lengths    input all-to-all: ids (int64, 8n) and bag lengths (int64, 8B) on the device
  lookup_index   lookup: per-lookup sample index and local ids (int64, 8n each), kept for
                 the backward
  pooled         lookup: pooled outputs, fp32 [B, c], kept through the step
  gathered_rows  lookup: the rows gathered before pooling, fp32 [n, c] (one table at a time:
                 the largest table's)
  outputs_grads  output all-to-all and loss: per-table outputs [b, dim], targets and pooled
                 gradients (fp32, 3 x 4 b dim)
  pooled_grads   backward all-to-all: pooled gradients gathered for the pieces, fp32 [B, c]
  row_grads      backward: per-lookup gradients fp32 [n, c], summed per unique row [u, c],
                 plus the optimizer's gathered weights/state and temporaries (~4 x 4 u c),
                 one table at a time (the largest)
With world size 1 no all-to-all buffer crosses a wire (b = B).

Usage: python -m benchmarks.gpu_report RUNS.json LOOKUP.json ENV.txt > table.md
"""

import json
import sys
from pathlib import Path

from benchmarks.gpu_h100 import PLANS, RUNS
from planner.executor.layout import exec_layout
from planner.executor.scale import scaled_plan
from planner.plan_model import Plan


def terms(name: str) -> dict[str, int]:
    plan_file, scale, batch, _ = RUNS[name]
    plan = Plan.model_validate_json((PLANS / f"{plan_file}.plan.json").read_text())
    lay = exec_layout(scaled_plan(plan, scale, batch))
    big = {"B": lay.batch * lay.world}
    t = dict.fromkeys(("ids_lengths", "lookup_index", "pooled", "gathered_rows",
                       "outputs_grads", "pooled_grads", "row_grads"), 0)
    b = lay.batch
    for tb in lay.tables:
        n = round(b * tb.pooling) * lay.world
        u = min(n, tb.rows)
        c = tb.dim
        t["ids_lengths"] += 8 * n + 8 * big["B"]
        t["lookup_index"] += 16 * n
        t["pooled"] += 4 * big["B"] * c
        t["gathered_rows"] = max(t["gathered_rows"], 4 * n * c)
        t["outputs_grads"] += 3 * 4 * b * c
        t["pooled_grads"] += 4 * big["B"] * c
        t["row_grads"] = max(t["row_grads"], 4 * n * c + 4 * 4 * u * c)
    return t


def main() -> None:
    runs = json.loads(Path(sys.argv[1]).read_text())
    look = json.loads(Path(sys.argv[2]).read_text())
    env = Path(sys.argv[3]).read_text()
    summary = {"env": env, "runs": {}, "lookup": look}
    print("| run | plan | rows x | batch | tiers | model HBM (B) | measured peak (B) | ratio | "
          "reserved peak (B) | checks other than memory | measured step (s) | "
          "predicted step (s) | lookup+bwd measured / predicted (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in runs.items():
        rep = r["report"]
        plan_file, scale, _, ref = RUNS[name]
        plan = json.loads((PLANS / f"{plan_file}.plan.json").read_text())
        tiers = sorted({t["tier"] for t in plan["tables"]})
        if rep is None:
            print(f"| {name} | {plan_file} | {scale} | | {', '.join(tiers)} | | | | | "
                  f"no report (rc {r['rc']}) | | | |")
            continue
        rk = rep["ranks"][0]
        pm = rk["peak_memory"]
        sm, sp = rk["seconds_measured"], rk["seconds_predicted"]
        others = [c for c in rep["checks"] if not c["name"].startswith("memory peak")]
        bad = [c["name"] for c in others if not c["ok"]]
        lb_meas = sm.get("lookup", 0) + sm.get("backward", 0)
        lb_pred = sp["lookup"] + sp["backward"] + sp["cache_miss"]
        checks = ("all pass" if not bad else "FAIL: " + "; ".join(bad)) + (
            "" if ref else " (no reference check)")
        print(f"| {name} | {plan_file} | {scale} | {rep['batch']} | {', '.join(tiers)} | "
              f"{pm['predicted']:,} | {pm['measured_step_peak']:,} | {pm['ratio']:.3g} | "
              f"{pm['step_reserved_peak']:,} | {checks} | {sum(sm.values()):.4g} | "
              f"{sp['total']:.3g} | {lb_meas:.3g} / {lb_pred:.3g} |")
        summary["runs"][name] = {
            "command": r["command"], "rc": r["rc"], "wall_s": r["wall_s"],
            "batch": rep["batch"], "scale_rows": scale, "tiers": tiers,
            "peak_memory": pm, "seconds_measured": sm, "seconds_predicted": sp,
            "checks": rep["checks"], "errors": rep["errors"],
            "model_omitted_terms_bytes": terms(name)}
    print()
    print("| run | phase growth measured (B): input_a2a / lookup / output_a2a_fwd / loss / "
          "output_a2a_bwd / backward | terms by formula (B) |")
    print("|---|---|---|")
    for name, s in summary["runs"].items():
        tr = s["peak_memory"]["phase_transient"]
        ph = " / ".join(f"{tr.get(k, 0):,}" for k in ("input_a2a", "lookup", "output_a2a_fwd",
                                                      "loss", "output_a2a_bwd", "backward"))
        tm = ", ".join(f"{k} {v:,}" for k, v in s["model_omitted_terms_bytes"].items())
        print(f"| {name} | {ph} | {tm} |")
    Path("benchmarks/results/gpu_h100.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
