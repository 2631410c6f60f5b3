"""A pipelined rank's input lane: the next step's input all-to-all, run beside this step's work.

TorchRec's sparse-dist train pipeline (TrainPipelineSparseDist) starts batch i+1's input
distribution before batch i's forward and waits for it at the start of step i+1; the cost
model prices that step as comm + max(0, compute - input_a2a) (cost_models/cost.step_time).
Here the lane is one worker thread with its own process group (so its all-to-alls never
interleave with the step's on the default group: every rank issues each group's collectives
in one order) and its own Timer (comm.Timer is one thread's stack of spans). The ids it
routes do not depend on the weights, so a pipelined step computes what the sequential one
does, bit for bit.

On CUDA the lane runs on a stream of its own (NCCL's work is ordered after the stream it is
called from) and its timer waits for that stream only; its result is complete when taken
(the span synchronized the stream), and every tensor of it is recorded on the taking
thread's stream, so the caching allocator does not hand its blocks to the lane again while
the step still reads them. No GPU was at hand to run this (README, Executor).
"""

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

import torch

from planner.executor.comm import Comm, PhaseTime, Timer

T = TypeVar("T")


class InputLane(Generic[T]):
    """At most one input exchange in flight: `start` it for a step, `take` it in that step."""

    def __init__(self, comm: Comm, device: torch.device,
                 tensors_of: Callable[[T], Iterable[torch.Tensor]]) -> None:
        """`tensors_of`: every tensor of a result (recorded on the taker's CUDA stream)."""
        self.comm = comm
        self.seconds: dict[str, float] = defaultdict(float)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.tensors_of = tensors_of
        self.timer = Timer(device, self.seconds, self.stream)
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
            if self.stream is None:
                with self.timer("input_a2a"):
                    return work(self.comm)
            torch.cuda.set_device(self.device)
            with torch.cuda.stream(self.stream), self.timer("input_a2a"):
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
        if self.stream is not None:
            taker = torch.cuda.current_stream(self.device)
            for t in self.tensors_of(out):
                t.record_stream(taker)
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
