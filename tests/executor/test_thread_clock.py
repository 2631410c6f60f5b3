"""GroupClock charges a span the CPU time of the calling thread and the named threads only:
checked against each thread's own clock (time.thread_time, read inside the thread)."""

import threading
import time

import pytest

from planner.executor.thread_clock import GroupClock, thread_ids, threads_made_by

pytestmark = pytest.mark.skipif(thread_ids() is None, reason="threads cannot be listed here")


def _burner(go: threading.Event, done: threading.Event, spent: list[float],
            release: threading.Event) -> None:
    go.wait()
    t0 = time.thread_time()
    x = 0
    while time.thread_time() - t0 < 0.15:
        x += 1
    spent.append(time.thread_time() - t0)
    done.set()
    release.wait(10)  # alive until read


def _start(go: threading.Event, done: threading.Event, spent: list[float],
           release: threading.Event) -> threading.Thread:
    t = threading.Thread(target=_burner, args=(go, done, spent, release), daemon=True)
    t.start()
    return t


def test_group_clock_counts_its_threads_and_not_others() -> None:
    go, release = threading.Event(), threading.Event()
    mine_done, other_done = threading.Event(), threading.Event()
    mine_spent: list[float] = []
    other_spent: list[float] = []
    mine, tids = threads_made_by(lambda: _start(go, mine_done, mine_spent, release))
    assert tids is not None and len(tids) == 1
    other = _start(go, other_done, other_spent, release)
    group, process = GroupClock(tids), GroupClock(None)
    assert group.per_thread and not process.per_thread
    g0, p0 = group(), process()
    go.set()
    mine_done.wait(10)
    other_done.wait(10)
    g1, p1 = group(), process()
    release.set()
    mine.join()
    other.join()
    # The group's reading: its thread's 0.15 s (and this thread's waiting), not the other's.
    assert mine_spent[0] <= g1 - g0 <= mine_spent[0] + 0.05
    # The process clock counts both burners.
    assert p1 - p0 >= mine_spent[0] + other_spent[0] - 0.01
    # An ended thread keeps its last reading.
    assert group() >= g1


def test_no_threads_listed_means_process_clock() -> None:
    clock = GroupClock(None)
    a = time.process_time()
    b = clock()
    assert b >= a
