#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (repo root): `planner calibrate --device cuda` there, then a
# few fixture plans, planned on the calibrated profile with one GPU, run by `planner execute
# --device cuda --compare` (each run's report kept, so the preset's prediction can be scored
# on the same executions afterwards: benchmarks/gpu_fidelity.py).
#
#   bash benchmarks/gpu_calibrate.sh OUTDIR [PRESET]
#
# Writes OUTDIR/calibrated.json (+ .provenance.json), OUTDIR/hw1.json (the profile with one
# host of one GPU), OUTDIR/FIXTURE.plan.json and OUTDIR/exec_NAME.json per plan,
# OUTDIR/gpu_workspace.json and OUTDIR/log.txt. PRESET: the base preset (default: h200 on an
# H200, else h100). Every command has its own timeout, so a failure leaves the others'
# output. TAR=FILE: also pack OUTDIR into FILE (the lent machine returns at most 8 files).
# WORKSPACE=0: skip the backward-workspace benchmark (its 144 points, run 3 of gpu_h200.md).
set -u
out=${1:?usage: gpu_calibrate.sh OUTDIR [PRESET]}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
exec > >(tee -a "$out/log.txt") 2>&1
dev=${DEVICE:-cuda}  # DEVICE=cpu CAL_ARGS=--smoke: a dry run of this script on a CPU
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
preset=${2:-$(case "$gpu" in *H200*) echo h200 ;; *) echo h100 ;; esac)}
echo "== $(date -u +%FT%TZ) $gpu; preset $preset"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null
$py -c "import torch, platform; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None, 'python', platform.python_version(),
'gpus', torch.cuda.device_count(), 'cpus', __import__('os').cpu_count())"

t0=$(date +%s)
echo "== planner calibrate --device $dev --preset $preset ${CAL_ARGS:-}"
timeout 330 $py -m planner.cli calibrate --device "$dev" --preset "$preset" ${CAL_ARGS:-} \
    -o "$out/calibrated.json"
echo "== calibrate rc $? in $(( $(date +%s) - t0 )) s"
[ -f "$out/calibrated.json" ] || exit 1

$py - "$out" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
hw = json.loads((out / "calibrated.json").read_text())
hw.update(name=hw["name"] + "_x1", hosts=1, gpus_per_host=1)
(out / "hw1.json").write_text(json.dumps(hw, indent=1) + "\n")
EOF
# name fixture scale_rows: rows scaled so weights initialise in seconds (the plan's batch)
for run in "kaggle criteo_kaggle 0.1" "rm2 deeprecsys_rm2 0.05" "dcnv2 criteo_dcnv2 0.005" \
           "rm1 deeprecsys_rm1 0.05"; do
    set -- $run
    t0=$(date +%s)
    echo "== $1: planner plan $2 --hardware hw1.json; planner execute --device $dev --compare"
    $py -m planner.cli plan "$2" --hardware "$out/hw1.json" -q -o "/tmp/$1.plan.json" \
        > /dev/null || { echo "plan $2 failed"; continue; }
    cp "/tmp/$1.plan.json" "$out/$2.plan.json"
    timeout 90 $py -m planner.cli execute "/tmp/$1.plan.json" --device "$dev" --compare \
        --scale-rows "$3" --steps 3 --timed-steps 9 --warmup-steps 2 --no-reference \
        --format json -o "$out/exec_$1.json" > /dev/null
    echo "== $1 rc $? in $(( $(date +%s) - t0 )) s"
done
# A piece's backward workspace against the memory model (benchmarks/gpu_workspace.py).
if [ "$dev" = cuda ] && [ "${WORKSPACE:-1}" != 0 ]; then
    timeout 120 $py -m benchmarks.gpu_workspace "$out/gpu_workspace.json"
    echo "== gpu_workspace rc $?"
fi
if [ -n "${TAR:-}" ]; then tar -czf "$TAR" -C "$out" .; fi
