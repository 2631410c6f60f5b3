"""Live solver progress on the terminal (rich): incumbent, bound and elapsed time."""

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console

from planner.partition.cpsat import Progress, ProgressFn


@contextmanager
def solver_progress(console: Console, enabled: bool) -> Iterator[ProgressFn | None]:
    """A progress callback for `planner.plan()` that redraws one status line, or None when
    disabled (--quiet, or the console is not a terminal)."""
    if not enabled or not console.is_terminal:
        yield None
        return
    start = time.perf_counter()
    with console.status("planning: candidates, bound, heuristic start ...") as status:

        def update(p: Progress) -> None:
            bound = f"{p.bound_s * 1e3:.4g} ms" if p.bound_s is not None else "-"
            status.update(f"CP-SAT: incumbent {p.incumbent_s * 1e3:.4g} ms, bound {bound}, "
                          f"elapsed {time.perf_counter() - start:.1f} s")

        yield update
