#!/usr/bin/env bash
# Installs the project with its dev tools. torch (only for the executor) is pinned to the CPU
# wheel this machine kind provides; on a CUDA cluster install your CUDA torch first and set
# PLANNER_SKIP_TORCH=1.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${PLANNER_SKIP_TORCH:-0}" != "1" ] && ! python -c "import torch" 2>/dev/null; then
  python -m pip install "torch==2.13.0" || echo "note: torch not installed (only the executor needs it)"
fi
python -m pip install -e ".[dev]"
