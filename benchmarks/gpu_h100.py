"""Run the 1-GPU plans of benchmarks/results/gpu_plans on a CUDA machine with
`planner execute --device cuda` (NCCL, world size 1) and gather the reports.

Each run: the plan scaled down (--scale-rows, so weights initialise in seconds), 2 forward-only
warm-up steps, 5 measured training steps; the report JSON (allocator peaks per phase, seconds
per phase, checks) is kept whole. Usage (repo root, on the GPU machine):

    python -m benchmarks.gpu_h100 OUTDIR [NAME ...]

writes OUTDIR/gpu_h100_runs.json (every report, with its command, exit code and wall time)
and OUTDIR/gpu_h100_runs.log (the commands' output).
"""

import json
import subprocess
import sys
import time
from pathlib import Path

PLANS = Path(__file__).parent / "results" / "gpu_plans"
# name: (plan file, scale_rows, batch or None for the plan's, reference check). With the
# step buffers in the memory model, rm2, dcnv2 and hugectr_200 no longer fit 1 GiB of HBM at
# their batch (planner plan answers infeasible, with the certificate), so only kaggle keeps a
# 1 GiB run.
RUNS = {
    "smoke_kaggle": ("criteo_kaggle__hw_h100x1", 0.001, 128, True),
    "kaggle_hbm": ("criteo_kaggle__hw_h100x1", 0.1, None, True),
    "kaggle_1gib": ("criteo_kaggle__hw_h100x1_1gib", 0.1, None, True),
    "rm2_hbm": ("deeprecsys_rm2__hw_h100x1", 0.05, None, True),
    "dcnv2_hbm": ("criteo_dcnv2__hw_h100x1", 0.005, None, True),
    "hugectr_hbm": ("hugectr_200__hw_h100x1", 0.001, None, False),
}


def command(name: str, out: Path) -> list[str]:
    plan, scale, batch, ref = RUNS[name]
    cmd = [sys.executable, "-m", "planner.cli", "execute", str(PLANS / f"{plan}.plan.json"),
           "--device", "cuda", "--scale-rows", str(scale), "--steps", "5",
           "--warmup-steps", "2", "--timeout", "400", "--format", "json",
           "-o", str(out / f"{name}.json")]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    if not ref:
        cmd.append("--no-reference")
    return cmd


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    names = sys.argv[2:] or list(RUNS)
    done = out / "gpu_h100_runs.json"
    results = json.loads(done.read_text()) if done.exists() else {}
    with open(out / "gpu_h100_runs.log", "a") as log:
        for name in names:
            cmd = command(name, out)
            shown = " ".join(["planner", *cmd[3:]]).replace(str(out) + "/", "OUT/")
            log.write(f"\n=== {name}: {shown}\n")
            log.flush()
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
            wall = time.perf_counter() - t0
            log.write(proc.stderr[-4000:])
            rep_file = out / f"{name}.json"
            rep = json.loads(rep_file.read_text()) if rep_file.exists() else None
            if rep_file.exists():
                rep_file.unlink()  # folded into the one JSON below
            results[name] = {"command": shown, "rc": proc.returncode, "wall_s": wall,
                             "stderr_tail": proc.stderr[-2000:], "report": rep}
            ok = rep["ok"] if rep else None
            log.write(f"--- rc {proc.returncode}, {wall:.1f} s, ok {ok}\n")
            log.flush()
            print(f"{name}: rc {proc.returncode} wall {wall:.1f}s ok {ok}", flush=True)
            if rep:
                for c in rep["checks"]:
                    if not c["ok"]:
                        print(f"   FAIL {c['name']}: {c['detail'][:300]}", flush=True)
            (out / "gpu_h100_runs.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
