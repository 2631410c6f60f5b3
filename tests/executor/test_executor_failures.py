"""A rank that dies or hangs ends the run within the timeout, with an error naming that rank,
and leaves no process behind. The fault is injected by RunOptions.fault (test hook)."""

import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from planner.executor.demo import all_types_plan
from planner.executor.job import RunOptions
from planner.executor.launch import RankFailure
from planner.executor.run import execute


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _left_behind(run_dir: Path) -> list[int]:
    """Rank processes still alive: those the launcher recorded, and any process whose
    command line names the run directory (ranks started as subprocesses)."""
    started = [int(x) for x in (run_dir / "pids").read_text().split()]
    assert len(started) == 4
    return [p for p in started if _alive(p)] + _processes_mentioning(str(run_dir))


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if text.encode() in (p / "cmdline").read_bytes():
                pids.append(int(p.name))
        except OSError:
            continue
    return pids


@pytest.mark.parametrize(("fault", "rank", "word", "start"), [
    ("die:2:1", 2, "died", "subprocess"),  # fresh interpreters, as torchrun starts ranks
    ("hang:1:2", 1, "hung", "forkserver"),  # forked from a server with torch loaded
])
def test_failed_rank_is_named_and_nothing_is_left(tmp_path: Path, fault: str, rank: int,
                                                  word: str, start: str) -> None:
    run_dir = tmp_path / f"fault-{word}"
    run_dir.mkdir()
    # One warm-up step: the plan's caches would ask for 225 (warmup.py), which only delay
    # the fault (the suite's time).
    opts = RunOptions(steps=4, fault=fault, collective_timeout_s=2.0, warmup_steps=1)
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        execute(all_types_plan(batch=8), opts, run_dir=run_dir, timeout_s=90.0,
                reference=False, start=start)
    assert time.monotonic() - t0 < 90.0
    assert info.value.ranks == [rank]
    assert str(info.value).startswith(f"rank {rank} {word}")
    assert _left_behind(run_dir) == []


def test_whole_run_deadline_names_the_hung_rank(tmp_path: Path) -> None:
    """With collectives that would wait longer than the run may last, the launcher's own
    deadline ends it and names the rank with the least progress."""
    run_dir = tmp_path / "deadline"
    run_dir.mkdir()
    # One warm-up step (the plan's caches would ask for ~29) and a deadline that lets the
    # other ranks reach the hung step even on a loaded 2-core machine (at load 7 three
    # ranks were still starting at 8 s, and all three had "the least progress").
    opts = RunOptions(steps=4, fault="hang:3:1", collective_timeout_s=600.0, warmup_steps=1)
    with pytest.raises(RankFailure) as info:
        execute(all_types_plan(batch=8), opts, run_dir=run_dir, timeout_s=25.0,
                reference=False)
    assert info.value.ranks == [3]
    assert "hung" in str(info.value)
    assert _left_behind(run_dir) == []
