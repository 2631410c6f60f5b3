"""One rank: nothing leaves it, so the executor calls no collective (a one-GPU job has none,
and the model charges none), yet runs and checks the plan as on several ranks."""

import pytest

pytest.importorskip("torch")

from planner.calibration.executed import calibration_plan
from planner.executor.job import RunOptions
from planner.executor.run import execute
from planner.presets import preset_dict


def test_one_rank_runs_and_checks_its_plan() -> None:
    plan = calibration_plan(1, 1, preset_dict("h100"))  # 4 table-wise pieces on rank 0
    rep = execute(plan, RunOptions(steps=2, timed_steps=2, warmup_steps=0), timeout_s=300)
    assert rep.ok, [(c.name, c.detail) for c in rep.checks if not c.ok]
    (rank,) = rep.ranks
    assert all(c["sent"] == 0 and c["recv"] == 0 for c in rank["collectives"].values()), \
        rank["collectives"]


def test_one_rank_all_to_all_calls_no_collective(tmp_path) -> None:
    """No process group exists here: an all-to-all that called torch.distributed would
    raise; one rank's returns its only (own) entry, empty, without a call."""
    import torch

    from planner.executor.comm import Comm, Heartbeat

    comm = Comm(0, 1, torch.device("cpu"), Heartbeat(tmp_path / "hb.txt"))
    got = comm.alltoall("input_ids", [torch.ones(8, dtype=torch.uint8)], [8])
    assert got == [None]
    assert comm.counts["input_ids"].sent == 0
