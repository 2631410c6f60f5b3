"""Benchmarks: plan quality against published baselines, and planning time.

Run from the repo root, e.g. `python -m benchmarks.plan_quality`; results go to
benchmarks/results/.
"""

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def write_results(name: str, payload: dict[str, Any], markdown: str) -> None:
    """Commit-ready results: results/NAME.json (sorted keys) and results/NAME.md."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, sort_keys=True, indent=1) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown)
