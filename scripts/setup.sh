#!/usr/bin/env bash
# Installs the project with its dev tools. torch (only for the executor) is pinned to the CPU
# wheel this machine kind provides; on a CUDA cluster install your CUDA torch first and set
# PLANNER_SKIP_TORCH=1.
set -euo pipefail
cd "$(dirname "$0")/.."
# Headless Chromium (Debian's package) for the HTML report's browser test; Playwright drives
# it and downloads no browser of its own. Without it that test is skipped.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
    || echo "note: chromium not installed (tests/test_report_html.py skips its browser test)"
fi
if [ "${PLANNER_SKIP_TORCH:-0}" != "1" ] && ! python -c "import torch" 2>/dev/null; then
  python -m pip install "torch==2.13.0" || echo "note: torch not installed (only the executor needs it)"
fi
# The torchrec extra is CPU FBGEMM; with PLANNER_SKIP_TORCH=1 (a CUDA cluster) install
# fbgemm-gpu==1.8.0 and torchrec==1.8.0 yourself (README, "TorchRec").
if [ "${PLANNER_SKIP_TORCH:-0}" != "1" ]; then
  python -m pip install -e ".[dev,torchrec]"
  # torchrec requires `fbgemm-gpu` (1.9 does not load with torch 2.13): its CPU build came
  # with the extra above, so torchrec itself goes in without dependencies.
  python -m pip install --no-deps "torchrec==1.8.0"
else
  python -m pip install -e ".[dev]"
fi
# Byte-compile the project's own code once. Where PYTHONDONTWRITEBYTECODE is set (this machine
# kind sets it), Python writes no .pyc, so every process (a CLI call, an executor rank, a
# service worker; the tests start hundreds) would compile it again: 0.2 s each here. (Not
# tests/: pytest compiles its test modules itself, with their asserts rewritten.)
python -m compileall -q planner cost_models benchmarks fixtures >/dev/null
