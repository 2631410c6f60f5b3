"""The CPU time of the threads that do one process group's collectives.

A gloo process group makes its own threads when it is created (its worker threads and its
transport's event loop: three per group, seen with torch 2.13), and they do the transfer
while the calling thread waits. The rank process's CPU time inside a collective counts them,
but also every other thread that runs meanwhile: on a pipelined rank, the input lane's
all-to-all (its own group's threads, its routing on its own thread) runs beside the step's
collectives, and the step's lookups beside the lane's. `GroupClock` reads only the calling
thread and the group's threads, so each collective is charged its own work.

Linux names a thread's CPU clock by its id (the kernel's per-thread CPUCLOCK_SCHED clock id,
`~tid << 3 | 6`), and lists a process's threads in /proc/self/task; where either is
missing, the clock is the whole process's (time.process_time), as before.
"""

import contextlib
import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_TASKS = "/proc/self/task"
# Linux's clock id of a thread's scheduled CPU time (include/linux/posix-timers.h:
# CPUCLOCK_PERTHREAD_MASK 4 | CPUCLOCK_SCHED 2, the id complemented into the high bits).
_PER_THREAD_SCHED = 6


def thread_ids() -> frozenset[int] | None:
    """This process's threads, or None where the OS does not list them."""
    try:
        return frozenset(int(name) for name in os.listdir(_TASKS))
    except (OSError, ValueError):
        return None


def thread_cpu_s(tid: int) -> float:
    """Seconds of CPU thread `tid` of this process has run (OSError if it cannot be read)."""
    return time.clock_gettime((~tid << 3) | _PER_THREAD_SCHED)


def threads_made_by(make: Callable[[], T]) -> tuple[T, frozenset[int] | None]:
    """`make()`'s result and the threads it started (None where they cannot be listed or
    their clocks read). Call it while no other thread starts threads."""
    before = thread_ids()
    out = make()
    after = thread_ids()
    if before is None or after is None:
        return out, None
    new = after - before
    try:
        for tid in new:
            thread_cpu_s(tid)
    except OSError:
        return out, None
    return out, frozenset(new)


class GroupClock:
    """CPU seconds of the calling thread plus `threads` (a process group's), or the whole
    process's where `threads` is None. A thread that has ended keeps its last reading: it
    runs no more."""

    def __init__(self, threads: frozenset[int] | None) -> None:
        self.threads = tuple(sorted(threads)) if threads is not None else None
        self._last: dict[int, float] = {}

    @property
    def per_thread(self) -> bool:
        return self.threads is not None

    def __call__(self) -> float:
        if self.threads is None:
            return time.process_time()
        total = time.thread_time()
        for tid in self.threads:
            with contextlib.suppress(OSError):  # ended: its last reading stands
                self._last[tid] = thread_cpu_s(tid)
            total += self._last.get(tid, 0.0)
        return total
