"""Shared launches of the executor: each start of 4 gloo ranks costs seconds, so every run
here checks all sharding types and tiers at once (planner.executor.demo) and several tests
read the same run."""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from planner.executor.demo import all_types_plan  # noqa: E402
from planner.executor.job import RunOptions  # noqa: E402
from planner.executor.run import ExecutionReport, execute  # noqa: E402

# The default warm-up: as many forward-only steps as the plan's caches need to reach their
# policy's steady state (planner/executor/warmup.py; 29 steps of 64 samples per rank here).
WARMUP = None
BATCH = 64


def _run(tmp: Path, fwd: str, bwd: str, warmup: int | None, batch: int = BATCH
         ) -> tuple[ExecutionReport, Path]:
    tmp.mkdir(parents=True, exist_ok=True)
    rep = execute(all_types_plan(fwd, bwd, batch), RunOptions(steps=5, warmup_steps=warmup,
                                                       collective_timeout_s=60),
                  run_dir=tmp, timeout_s=240)
    return rep, tmp


@pytest.fixture(scope="session")
def fp32_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExecutionReport, Path]:
    return _run(tmp_path_factory.mktemp("fp32a"), "fp32", "fp32", WARMUP)


@pytest.fixture(scope="session")
def fp32_rerun(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExecutionReport, Path]:
    return _run(tmp_path_factory.mktemp("fp32b"), "fp32", "fp32", WARMUP)


@pytest.fixture(scope="session", params=[("fp16", "int8"), ("int8", "bf16"), ("bf16", "fp16")],
                ids=lambda p: f"fwd_{p[0]}-bwd_{p[1]}")
def quantized_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                  ) -> tuple[ExecutionReport, Path, str, str]:
    fwd, bwd = request.param
    rep, path = _run(tmp_path_factory.mktemp(f"q_{fwd}_{bwd}"), fwd, bwd, 0, batch=16)
    return rep, path, fwd, bwd
