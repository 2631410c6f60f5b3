import json
from typing import Any

from hypothesis import settings

from planner.presets import fixture_text

# Same examples on every run: a property test that fails, fails again on a re-run, and none
# keeps shrinking past the suite's timeout on a loaded machine (issue 18).
settings.register_profile("suite", derandomize=True, print_blob=True)
settings.load_profile("suite")


def fixture_request(name: str, hosts: int, preset: str = "h100") -> dict[str, Any]:
    return {"model": json.loads(fixture_text(name)),
            "hardware": {"preset": preset, "hosts": hosts}}


def small_model(tables: list[dict[str, Any]], batch: int = 512) -> dict[str, Any]:
    return {"name": "small", "batch_size_per_gpu": batch, "tables": tables}
