import json
from typing import Any

from planner.presets import fixture_text


def fixture_request(name: str, hosts: int, preset: str = "h100") -> dict[str, Any]:
    return {"model": json.loads(fixture_text(name)),
            "hardware": {"preset": preset, "hosts": hosts}}


def small_model(tables: list[dict[str, Any]], batch: int = 512) -> dict[str, Any]:
    return {"name": "small", "batch_size_per_gpu": batch, "tables": tables}
