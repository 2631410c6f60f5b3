"""Live solver progress on the terminal (rich): incumbent, bound and elapsed time.

The line is redrawn every half second by a ticker thread, not only when CP-SAT reports an
improvement, so the elapsed time never freezes while a stage runs quietly."""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console

from planner.partition.cpsat import Progress, ProgressFn

_TICK_S = 0.5


@contextmanager
def solver_progress(console: Console, enabled: bool) -> Iterator[ProgressFn | None]:
    """A progress callback for `planner.plan()` that redraws one status line, or None when
    disabled (--quiet, or the console is not a terminal)."""
    if not enabled or not console.is_terminal:
        yield None
        return
    start = time.perf_counter()
    latest: list[str] = ["candidates, bound, heuristic start"]
    done = threading.Event()
    with console.status(f"planning: {latest[0]} ...") as status:

        def draw() -> None:
            status.update(f"planning: {latest[0]}, elapsed {time.perf_counter() - start:.1f} s")

        def tick() -> None:
            while not done.wait(_TICK_S):
                draw()

        def update(p: Progress) -> None:
            bound = f"{p.bound_s * 1e3:.4g} ms" if p.bound_s is not None else "-"
            latest[0] = f"CP-SAT incumbent {p.incumbent_s * 1e3:.4g} ms, bound {bound}"
            draw()

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield update
        finally:
            done.set()
            ticker.join()
