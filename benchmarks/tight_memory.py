"""Plans where memory is short: fixtures on h100 hosts with smaller GPUs and less DDR.

The fixture presets leave HBM to spare on most cases, so plan_quality says little about
the answers a user with tight memory gets: "it fits", "it takes X ms", "within Y% of the
best", "it cannot fit". Here each fixture runs on 2 and 4 hosts of 8 H100s whose HBM is cut
to 4, 8 or 16 GiB (1 GiB reserved) and whose DDR to 32 or 64 GiB (1 GiB reserved). Every
plan is checked by the independent checker (planner/check.py, no re-proofs), and every
"infeasible" must carry a certificate, recomputed from the request (verify_certificate).
Compared with the previous results file, when one is there.

    PYTHONPATH=. python -m benchmarks.tight_memory
"""

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks import write_results
from benchmarks.plan_time import machine
from planner import plan
from planner.check import check_plan
from planner.errors import InfeasibleError
from planner.infeasibility import InfeasibilityCertificate, verify_certificate
from planner.planning import resolve
from planner.presets import preset_dict
from planner.problem import build_problem

COMMAND = "PYTHONPATH=. python -m benchmarks.tight_memory"
MODELS = ("hugectr_200", "criteo_dcnv2", "synthetic_1000")
HOSTS = (2, 4)
MEMORY = (("4GiB", "64GiB"), ("8GiB", "32GiB"), ("16GiB", "64GiB"))
PREVIOUS = Path(__file__).resolve().parent / "results" / "tight_memory.json"


def request(model: str, hosts: int, hbm: str, ddr: str) -> dict[str, Any]:
    """An h100 cluster of `hosts` hosts with less HBM and DDR, so that memory binds."""
    hw = preset_dict("h100")
    hw["hosts"] = hosts
    hw["gpu"].update(hbm_capacity_bytes=hbm, hbm_reserved_bytes="1GiB")
    hw["host"].update(ddr_capacity_bytes=ddr, ddr_reserved_bytes="1GiB")
    return {"model": model, "hardware": hw}


def run_case(model: str, hosts: int, hbm: str, ddr: str) -> dict[str, Any]:
    key = f"{model} x{hosts} {hbm}/{ddr}"
    start = time.perf_counter()
    req = request(model, hosts, hbm, ddr)
    try:
        out = plan(req)
    except InfeasibleError as err:
        elapsed = time.perf_counter() - start
        # The certificate recomputed from the request alone (planner/infeasibility.py).
        verified = err.certificate is not None and not verify_certificate(
            build_problem(resolve(req)), InfeasibilityCertificate.model_validate(err.certificate))
        return {"case": key, "answer": "infeasible", "certificate": verified,
                "reason": str(err)[:160], "plan_s": round(elapsed, 2)}
    elapsed = time.perf_counter() - start
    s = out.summary
    report = check_plan(out, prove=False)
    return {"case": key, "answer": "plan", "step_ms": round(s.step_time_s * 1e3, 4),
            "bound_ms": round(s.lower_bound_s * 1e3, 4), "gap": round(s.gap, 6),
            "status": s.status, "checked": not report.errors,
            "errors": report.errors[:3], "plan_s": round(elapsed, 2)}


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any],
             previous: dict[str, dict[str, Any]]) -> str:
    lines = ["# Plans where memory is short", "",
             f"`{COMMAND}` (module docstring: what is drawn and checked). Machine: "
             f"{meta['machine'].get('cpu', '')}, commit {str(meta['machine'].get('git_head'))[:12]}"
             f" (the working tree may hold uncommitted changes); wall {meta['wall_s']} s.", "",
             "step and bound: the cost model's slowest GPU and the planner's lower bound (ms); "
             "checked: the independent checker found no error; previous: the step time in the "
             "results file this run replaced.", "",
             "| case | answer | step ms | bound ms | gap | checked | previous ms | plan s | "
             "status |", "|---|---|---:|---:|---:|---|---:|---:|---|"]
    for r in rows:
        prev = previous.get(r["case"], {})
        was = prev.get("step_ms", prev.get("answer", "-"))
        if r["answer"] == "plan":
            lines.append(f"| {r['case']} | plan | {r['step_ms']:.4g} | {r['bound_ms']:.4g} | "
                         f"{r['gap']:.2%} | {'yes' if r['checked'] else 'NO'} | {was} | "
                         f"{r['plan_s']} | {r['status']} |")
        else:
            cert = "certificate re-verified" if r["certificate"] else "NO VERIFIED CERTIFICATE"
            lines.append(f"| {r['case']} | infeasible ({cert}) | - | - | - | - | {was} | "
                         f"{r['plan_s']} | {r['reason']} |")
    plans = [r for r in rows if r["answer"] == "plan"]
    worse = [r["case"] for r in plans
             if isinstance(previous.get(r["case"], {}).get("step_ms"), float)
             and r["step_ms"] > previous[r["case"]]["step_ms"] * (1 + 1e-9)]
    lines += ["", f"- plans: {len(plans)} of {len(rows)}, checked clean: "
              f"{sum(r['checked'] for r in plans)}; infeasible with a certificate: "
              f"{sum(1 for r in rows if r['answer'] == 'infeasible' and r['certificate'])}",
              f"- worse than the previous results: {len(worse)} {worse if worse else ''}".rstrip()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    previous = {}
    if PREVIOUS.exists():
        previous = {r["case"]: r for r in json.loads(PREVIOUS.read_text())["rows"]}
    start = time.perf_counter()
    rows = []
    for model in MODELS:
        for hosts in HOSTS:
            for hbm, ddr in MEMORY:
                rows.append(run_case(model, hosts, hbm, ddr))
                print(json.dumps(rows[-1]), flush=True)
    meta = {"machine": machine(), "wall_s": round(time.perf_counter() - start, 1)}
    text = markdown(rows, meta, previous)
    print(text)
    if not args.no_write:
        write_results("tight_memory", {"rows": rows, **meta}, text)


if __name__ == "__main__":
    main()
