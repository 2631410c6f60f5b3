import json
from typing import Any

from hypothesis import settings

from planner.presets import fixture_text

# Same examples on every run: a property test that fails, fails again on a re-run, and none
# keeps shrinking past the suite's timeout on a loaded machine (issue 18).
settings.register_profile("suite", derandomize=True, print_blob=True)
settings.load_profile("suite")


def cpu_hardware(name: str, hosts: int, gpus_per_host: int) -> dict[str, Any]:
    """A small CPU cluster (1 GiB "HBM" per rank): the hardware of the small planning,
    executor and DMP tests."""
    return {"name": name, "hosts": hosts, "gpus_per_host": gpus_per_host,
            "gpu": {"name": "cpu", "hbm_capacity_bytes": "1GiB",
                    "hbm_bandwidth_gb_per_s": 100.0},
            "host": {"ddr_capacity_bytes": "8GiB", "ddr_bandwidth_gb_per_s": 50.0},
            "links": {"nvlink_gb_per_s": 50.0, "nic_gb_per_s": 10.0, "pcie_gb_per_s": 16.0}}


# Two ranks on one host (gloo): the small executor and DMP runs.
TWO_CPU_RANKS = cpu_hardware("cpu2", 1, 2)


def fixture_request(name: str, hosts: int, preset: str = "h100") -> dict[str, Any]:
    return {"model": json.loads(fixture_text(name)),
            "hardware": {"preset": preset, "hosts": hosts}}


def small_model(tables: list[dict[str, Any]], batch: int = 512) -> dict[str, Any]:
    return {"name": "small", "batch_size_per_gpu": batch, "tables": tables}
