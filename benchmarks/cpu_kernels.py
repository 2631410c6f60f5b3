"""The same plan whatever kernels the CPU picks: every fixture on 1, 2 and 4 h100 hosts planned
in a process as it is and in one with numpy's dispatched SIMD kernels and OpenBLAS's
CPU-specific kernels switched off (NPY_DISABLE_CPU_FEATURES, OPENBLAS_CORETYPE=Prescott),
plan hashes compared.

numpy picks its float64 exp, log and power kernels from the CPU (AVX-512 ones of its own,
elsewhere the C library's), and OpenBLAS its matrix kernels: before the cost model took its
transcendentals from cost_models/portable_math.py, 6 of these 30 plans changed between the
two runs on an AVX-512 machine. On a CPU without AVX-512 numpy has no kernels of its own for
them, so the comparison there shows little (the results say which features were switched
off).

    PYTHONPATH=. python -m benchmarks.cpu_kernels [--only FIXTURE ...]
Writes benchmarks/results/cpu_kernels.json and .md.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from benchmarks import write_results
from benchmarks.plan_time import machine

COMMAND = "PYTHONPATH=. python -m benchmarks.cpu_kernels"
HOSTS = (1, 2, 4)
PRESET = "h100"
CASE_LIMIT_S = 1800
# Each case (argv[1]) is planned in the worker on the preset argv[2]; its hash (or the
# error's type) is printed as JSON.
_WORKER = """
import json, sys
import planner
from planner.presets import fixture_text
out = {}
for name, hosts in json.loads(sys.argv[1]):
    req = {"model": json.loads(fixture_text(name)),
           "hardware": {"preset": sys.argv[2], "hosts": hosts}}
    try:
        out[f"{name} x{hosts}"] = planner.plan(req).plan_hash
    except planner.PlannerError as err:
        out[f"{name} x{hosts}"] = type(err).__name__
print(json.dumps(out))
"""


def dispatched() -> list[str]:
    """numpy's SIMD targets above its baseline that this CPU runs (numpy 1.x: np.core)."""
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    umath = getattr(core, "_multiarray_umath", None)
    found = getattr(umath, "__cpu_features__", {})
    return [f for f in getattr(umath, "__cpu_dispatch__", []) if found.get(f)]


def has_avx512(features: list[str]) -> bool:
    """Whether numpy runs float64 transcendental kernels of its own here (AVX-512 only)."""
    return any("512" in f or f == "X86_V4" for f in features)


def plan_hashes(cases: list[tuple[str, int]], kernels_off: bool,
                timeout_s: float = CASE_LIMIT_S) -> dict[str, str]:
    """Plan hashes of `cases` in a fresh interpreter, with the CPU-specific kernels on (as
    numpy and OpenBLAS pick them) or off. Neither run inherits the caller's settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NPY_DISABLE_CPU", "NPY_ENABLE_CPU", "OPENBLAS_CORETYPE"))}
    if kernels_off:
        env.update(NPY_DISABLE_CPU_FEATURES=" ".join(dispatched()),
                   OPENBLAS_CORETYPE="Prescott")
    r = subprocess.run([sys.executable, "-c", _WORKER, json.dumps(cases), PRESET],
                       capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"planning worker failed: {r.stderr[-2000:]}")
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def markdown(body: dict[str, Any]) -> str:
    rows = body["rows"]
    differ = [r for r in rows if r["as_is"] != r["kernels_off"]]
    m = body["machine"]
    lines = [
        "# The same plan whatever kernels the CPU picks", "",
        f"`{COMMAND}` ({body['seconds']:.0f} s). Machine: {m['cpu']}, numpy {m['numpy']}, "
        f"commit {str(m['git_head'])[:12]}. numpy's dispatched targets found: "
        f"{', '.join(body['features']) or 'none'}; switched off in the second run together "
        "with OPENBLAS_CORETYPE=Prescott."
        + ("" if body["avx512"] else " This CPU has no AVX-512: numpy runs the C library's "
           "exp, log and power either way, so the comparison shows little here."), "",
        "| case | as is | kernels off | same |", "|---|---|---|---|",
        *[f"| {r['case']} | {r['as_is'][:23]} | {r['kernels_off'][:23]} | "
          f"{'yes' if r['as_is'] == r['kernels_off'] else '**no**'} |" for r in rows], "",
        f"- plans equal with the kernels on and off: {len(rows) - len(differ)} of {len(rows)}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="fixtures to run (default: every one)")
    args = ap.parse_args(argv)
    from planner.presets import fixture_names

    names = args.only or fixture_names()
    cases = [(n, h) for n in names for h in HOSTS]
    t0 = time.perf_counter()
    as_is = plan_hashes(cases, kernels_off=False)
    off = plan_hashes(cases, kernels_off=True)
    features = dispatched()
    rows = [{"case": k, "as_is": as_is[k], "kernels_off": off[k]} for k in as_is]
    body = {"command": COMMAND, "machine": machine(), "features": features,
            "avx512": has_avx512(features), "rows": rows,
            "seconds": time.perf_counter() - t0,
            "equal": sum(r["as_is"] == r["kernels_off"] for r in rows), "cases": len(rows)}
    write_results("cpu_kernels", body, markdown(body))
    print(markdown(body))


if __name__ == "__main__":
    main()
