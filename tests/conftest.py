import json
from typing import Any

from hypothesis import settings

from planner.presets import fixture_text

# Same examples on every run: a property test that fails, fails again on a re-run, and none
# keeps shrinking past the suite's timeout on a loaded machine (issue 18).
settings.register_profile("suite", derandomize=True, print_blob=True)
settings.load_profile("suite")


# Two ranks on one host of a CPU (gloo): the hardware of the small executor and DMP runs.
TWO_CPU_RANKS: dict[str, Any] = {
    "name": "cpu2", "hosts": 1, "gpus_per_host": 2,
    "gpu": {"name": "cpu", "hbm_capacity_bytes": "1GiB", "hbm_bandwidth_gb_per_s": 100.0},
    "host": {"ddr_capacity_bytes": "8GiB", "ddr_bandwidth_gb_per_s": 50.0},
    "links": {"nvlink_gb_per_s": 50.0, "nic_gb_per_s": 10.0, "pcie_gb_per_s": 16.0}}


def fixture_request(name: str, hosts: int, preset: str = "h100") -> dict[str, Any]:
    return {"model": json.loads(fixture_text(name)),
            "hardware": {"preset": preset, "hosts": hosts}}


def small_model(tables: list[dict[str, Any]], batch: int = 512) -> dict[str, Any]:
    return {"name": "small", "batch_size_per_gpu": batch, "tables": tables}
