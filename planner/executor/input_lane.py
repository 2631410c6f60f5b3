"""A pipelined rank's input lane: the next step's input all-to-all, run beside this step's work.

TorchRec's sparse-dist train pipeline (TrainPipelineSparseDist) starts batch i+1's input
distribution before batch i's forward and waits for it at the start of step i+1; the cost
model prices that step as comm + max(0, compute - input_a2a) (cost_models/cost.step_time).
Here the lane is one worker thread with its own process group (so its all-to-alls never
interleave with the step's on the default group: every rank issues each group's collectives
in one order) and its own Timer (comm.Timer is one thread's stack of spans). The ids it
routes do not depend on the weights, so a pipelined step computes what the sequential one
does, bit for bit.

On CUDA the lane's copies run on the current stream of its thread; no GPU was at hand to
measure the overlap there (README, Executor).
"""

import contextlib
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

import torch

from planner.executor.comm import Comm, PhaseTime, Timer

T = TypeVar("T")


class InputLane(Generic[T]):
    """At most one input exchange in flight: `start` it for a step, `take` it in that step."""

    def __init__(self, comm: Comm, device: torch.device) -> None:
        self.comm = comm
        self.seconds: dict[str, float] = defaultdict(float)
        self.timer = Timer(device, self.seconds)
        comm.timer = self.timer
        self.device = device
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="input-lane")
        self._pending: tuple[int, Future[T]] | None = None

    def start(self, step: int, train: bool, work: Callable[[Comm], T]) -> None:
        """Run `work(lane comm)` for `step` on the lane thread, timed as its input_a2a."""
        if self._pending is not None:
            raise RuntimeError(f"input lane: step {self._pending[0]}'s exchange not taken")
        self.comm.step, self.comm.align = step, train
        self.timer.new_step()

        def run() -> T:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            with self.timer("input_a2a"):
                return work(self.comm)

        self._pending = (step, self._pool.submit(run))

    def take(self, step: int) -> tuple[T, PhaseTime] | None:
        """The exchange started for `step` (waiting for it), with its timing; None if none
        was started for it."""
        if self._pending is None:
            return None
        at, fut = self._pending
        if at != step:
            raise RuntimeError(f"input lane: holds step {at}'s exchange, step {step} ran")
        self._pending = None
        out = fut.result()
        return out, self.timer.steps[-1]["input_a2a"]

    def drain(self) -> None:
        """Wait for an exchange in flight and drop it (every rank drops the same one)."""
        if self._pending is not None:
            _, fut = self._pending
            self._pending = None
            fut.result()

    def reset(self) -> None:
        self.comm.reset()
        self.timer.reset()
        self.seconds.clear()

    def close(self) -> None:
        """Drain and stop the thread. An exchange that failed is dropped here: the rank is
        already ending, and the error that ended it (or its peer's) is the one reported."""
        with contextlib.suppress(Exception):
            self.drain()
        self._pool.shutdown(wait=True)
