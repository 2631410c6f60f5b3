"""Collectives with their bytes counted, and a heartbeat the parent reads to name a hung rank.

The all-to-all is `torch.distributed.all_to_all_single` on uint8 buffers with uneven splits
(gloo and NCCL both implement it). A rank's own share never enters the buffer: it does not
cross a wire, and the cost model does not count it either. The data-parallel all-reduce is a
ring (reduce-scatter then all-gather over row chunks) written with point-to-point sends, so
its bytes are countable and it can quantize like the all-to-alls. Replicas' gradients are
all-reduced in DDP's buckets (cost_models/buckets.py: one ring per bucket, not one per table).

Timing (Timer): each collective starts after an untimed barrier when `align` is set, so its
wall time is the exchange itself, not the wait for a peer still computing; compute is timed
by the thread's CPU clock. See README, "Executor".
"""

import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from cost_models.types import CommPrecision
from planner.executor import quant
from planner.executor.memprobe import MemProbe
from planner.executor.thread_clock import GroupClock

# Longest wait for gloo's worker thread to let go of a finished collective's buffers.
SETTLE_S = 2.0


class CollectiveError(RuntimeError):
    """A collective failed: a symptom of another rank's death or hang, not this rank's fault."""


@dataclass
class ByteCount:
    sent: int = 0
    recv: int = 0


class Heartbeat:
    """One small file per rank holding 'progress step phase': how far the rank got."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.progress = 0
        # A pipelined rank marks from two threads (its input lane's collectives too).
        self._lock = threading.Lock()

    def mark(self, step: int, phase: str) -> None:
        with self._lock:
            self.progress += 1
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(f"{self.progress} {step} {phase}\n")
            os.replace(tmp, self.path)


@dataclass
class Comm:
    rank: int
    world: int
    device: torch.device
    heartbeat: Heartbeat
    step: int = 0
    counts: dict[str, ByteCount] = field(default_factory=lambda: defaultdict(ByteCount))
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    timer: "Timer | None" = None  # set by the rank: collectives' wall time per phase
    align: bool = True  # an untimed barrier before each timed collective
    # Wait for gloo to drop its buffers (_settle): only while the CPU memory probe records.
    settle: bool = True
    # The process group its collectives run on (None: the default one). A pipelined rank's
    # input lane has its own, so that its all-to-alls never interleave with the step's.
    group: "dist.ProcessGroup | None" = None
    # The CPU clock of its collectives' work: the calling thread and the group's threads
    # where they are known (thread_clock.py), else the whole process's.
    clock: GroupClock = field(default_factory=lambda: GroupClock(None))
    # The rank's memory probe, told of the buffers gloo's threads may free (MemProbe.watch).
    probe: MemProbe | None = None

    def reset(self) -> None:
        self.counts.clear()

    @contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        """The collective's span: after a barrier (not timed) when aligned, so a rank does not
        time its peers' compute as its own transfer."""
        t = self.timer
        if t is None:
            yield
            return
        if self.align:
            with t.excluded():
                try:
                    dist.barrier(group=self.group)
                except RuntimeError as exc:
                    raise CollectiveError(f"barrier before '{name}' at step {self.step}: "
                                          f"{exc}") from exc
        with t.collective(self.clock):
            yield

    def _guard(self, phase: str) -> None:
        self.heartbeat.mark(self.step, phase)

    def _settle(self, *tensors: torch.Tensor) -> None:
        """Wait (at most SETTLE_S) until this thread holds the only reference to each buffer
        of a finished collective. Gloo's worker thread drops its own a few microseconds
        after the collective returns; had it dropped the last one, the buffer would be freed
        on that thread, where the CPU memory probe (torch.profiler) records no free. Then
        hand the buffers to the probe to watch: about one in 250 was still freed on a gloo
        thread after this wait (measured), which the probe then marks when it sees it.
        CUDA's allocator records frees on any thread, and NCCL's work objects live on:
        there, nothing to wait for."""
        if self.device.type != "cpu" or not self.settle:
            return
        until = time.perf_counter() + SETTLE_S
        for t in tensors:
            # The collective's work holds the tensor itself; views hold its storage only.
            while t._use_count() > 1 and time.perf_counter() < until:
                time.sleep(0)
        if self.probe is not None:
            # Gloo's threads still free one now and then (memprobe.py): the probe watches
            # each buffer's storage until it is gone, and marks now what already is.
            self.probe.watch(*tensors)
            self.probe.reap()

    def alltoall(self, name: str, send: list[torch.Tensor | None],
                 recv_sizes: list[int]) -> list[torch.Tensor | None]:
        """Exchange uint8 buffers: send[d] goes to rank d; returns what each rank sent here.
        Entries for this rank are ignored (the caller keeps its own data)."""
        self._guard(name)
        if self.world == 1:
            # Nothing leaves the rank: no collective, as a one-GPU job has none (NCCL's empty
            # call cost 0.14-0.18 ms on an H200 where the model charges 0).
            return [None]
        me = self.rank
        empty = torch.empty(0, dtype=torch.uint8, device=self.device)
        parts = [empty if d == me or send[d] is None else send[d].to(self.device)
                 for d in range(self.world)]
        in_splits = [int(p.numel()) for p in parts]
        out_splits = [0 if s == me else recv_sizes[s] for s in range(self.world)]
        inp = torch.cat(parts) if sum(in_splits) else empty
        out = torch.empty(sum(out_splits), dtype=torch.uint8, device=self.device)
        try:
            with self._timed(name):
                dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.group)
        except RuntimeError as exc:
            raise CollectiveError(f"all-to-all '{name}' at step {self.step}: {exc}") from exc
        self._settle(inp, out)
        del inp
        c = self.counts[name]
        c.sent += sum(in_splits)
        c.recv += sum(out_splits)
        result: list[torch.Tensor | None] = []
        at = 0
        for s in range(self.world):
            result.append(None if s == me else out[at:at + out_splits[s]])
            at += out_splits[s]
        return result

    def ring_allreduce(self, name: str, xs: list[torch.Tensor],
                       precision: CommPrecision) -> None:
        """Sum every x [rows, cols] of `xs` (one bucket) over ranks in place, in one ring. Each
        x's rows are cut into `world` chunks; chunk c of every x travels in the same hop (the
        bucket's chunk c), so a bucket costs 2(W-1) messages whatever its tables, and each
        x is summed in the order c, c+1, ... (mod world), as the reference reproduces. Every
        hop sends its rows at `precision` (per row, as the model counts the bytes); the rank
        that finishes a chunk keeps the value it sends, so all replicas end bit-identical."""
        w, me = self.world, self.rank
        if w == 1 or not xs:
            return
        bounds = [chunk_bounds(x.shape[0], w) for x in xs]
        nxt, prv = (me + 1) % w, (me - 1) % w

        def rows_of(i: int, c: int) -> slice:
            return slice(bounds[i][c], bounds[i][c + 1])

        def wire(c: int) -> list[int]:
            return [quant.wire_bytes(precision, bounds[i][c + 1] - bounds[i][c], x.shape[1])
                    for i, x in enumerate(xs)]

        def hop(buf: torch.Tensor, recv_c: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
            sizes = wire(recv_c)
            rbuf = torch.empty(sum(sizes), dtype=torch.uint8, device=xs[0].device)
            # The hop as an all-to-all whose one block goes to the next rank and one comes
            # from the previous: gloo's point-to-point send and recv left a 2-rank ring
            # 3-7 ms slow in a third to a half of the steps on a 2-core machine with each
            # rank's threads on its core (waking a scheduler tick late), the all-to-all
            # hop about 0.2 ms (measured).
            ins, outs = [0] * w, [0] * w
            ins[nxt] += int(buf.numel())
            outs[prv] += int(rbuf.numel())
            try:
                dist.all_to_all_single(rbuf, buf, outs, ins, group=self.group)
            except RuntimeError as exc:
                raise CollectiveError(f"all-reduce '{name}' at step {self.step}: {exc}") from exc
            self._settle(buf, rbuf)
            c = self.counts[name]
            c.sent += int(buf.numel())
            c.recv += int(rbuf.numel())
            return rbuf, list(torch.split(rbuf, sizes))

        def encode(c: int) -> list[torch.Tensor]:
            return [quant.encode(x[rows_of(i, c)], precision) for i, x in enumerate(xs)]

        def cat(parts: list[torch.Tensor]) -> torch.Tensor:
            return torch.cat(parts) if len(parts) > 1 else parts[0]

        self._guard(name)
        with self._timed(name):
            for k in range(w - 1):  # reduce-scatter
                send_c, recv_c = (me - k) % w, (me - k - 1) % w
                _, got = hop(cat(encode(send_c)), recv_c)
                for i, x in enumerate(xs):
                    r = rows_of(i, recv_c)
                    x[r] = quant.decode(got[i], r.stop - r.start, x.shape[1], precision) + x[r]
            # All-gather: the finished chunk's bytes travel unchanged round the ring, and its
            # owner keeps what it sent, so every replica decodes the very same bytes.
            done_c = (me + 1) % w
            parts = encode(done_c)
            for i, x in enumerate(xs):
                d = rows_of(i, done_c)
                x[d] = quant.decode(parts[i], d.stop - d.start, x.shape[1], precision)
            buf = cat(parts)
            for k in range(w - 1):
                recv_c = (me - k) % w
                buf, got = hop(buf, recv_c)
                for i, x in enumerate(xs):
                    r = rows_of(i, recv_c)
                    x[r] = quant.decode(got[i], r.stop - r.start, x.shape[1], precision)
                # The views keep `buf` referenced (their _base): dropped before it is sent on,
                # or _settle would wait SETTLE_S for a reference that never goes.
                del got


def pin_rank(local_rank: int, world: int) -> None:
    """A CPU rank on a core of its own, when the machine has one per rank, so that one rank's
    compute never shares a core with another rank's threads. Called before the process
    group exists, so that gloo's threads (made at init) inherit the core: pinned after init,
    with gloo's threads free to run on the other rank's core, a rank's compute ran about 40%
    slower (thread CPU time) in a third of the executions, and its collectives took 0.37-0.66
    ms a call against 0.27-0.41 (measured, 2 ranks on 2 cores). The ring all-reduce's hops
    are all-to-alls because gloo's point-to-point calls stalled a scheduler tick when pinned
    so."""
    cores = sorted(os.sched_getaffinity(0))
    if world <= len(cores):
        os.sched_setaffinity(0, {cores[local_rank % len(cores)]})


def chunk_bounds(rows: int, world: int) -> list[int]:
    return [rows * i // world for i in range(world + 1)]


@dataclass
class PhaseTime:
    """One phase of one step on one rank. `cpu` is this thread's own CPU time in the phase
    (time.thread_time), less what nested spans took: work no other rank's load can inflate
    on a shared machine, as long as the rank runs one thread (worker.py sets
    torch.set_num_threads(1)). `coll_wall` is the wall time inside the phase's collectives,
    each started after an untimed barrier, so that it holds the transfer and not the wait
    for a slower peer; `coll_cpu` the thread's CPU time inside them; `coll_proc_cpu` the CPU
    time of the threads doing them: the calling thread and its process group's (gloo's
    worker threads do the transfer: on loopback, user and kernel CPU time of the copies and
    system calls, without the wait for peers to be scheduled), not a pipelined rank's other
    lane; the whole process's where threads cannot be told apart (thread_clock.py)."""

    cpu: float = 0.0
    wall: float = 0.0  # the whole phase, nested spans included
    coll_wall: float = 0.0
    coll_cpu: float = 0.0
    coll_proc_cpu: float = 0.0
    calls: int = 0  # collective calls (a ring all-reduce of one bucket is one call)
    lane: bool = False  # timed on a pipelined rank's input lane (input_lane.py)


@dataclass
class _Frame:
    name: str
    kind: str  # "phase", "collective" or "excluded"
    wall0: float
    cpu0: float
    proc0: float
    child_cpu: float = 0.0


class Timer:
    """Per step, per phase: wall time, the thread's own CPU time and the collectives' wall
    time (PhaseTime). Spans nest: a phase inside a phase (the cache's misses inside the
    lookup) takes its CPU time out of the outer one's; a collective's time is charged to the
    phase it runs in; an excluded span (the barrier before a collective) counts nowhere.
    Waits for the device at the end of a span so GPU time is not hidden in the next one."""

    def __init__(self, device: torch.device, into: dict[str, float],
                 stream: "torch.cuda.Stream | None" = None) -> None:
        """`stream`: on CUDA, a span waits for this stream only (an input lane's), else
        for the whole device."""
        self.device, self.into, self.stream = device, into, stream
        self.steps: list[dict[str, PhaseTime]] = []
        self._stack: list[_Frame] = []

    def new_step(self) -> None:
        self.steps.append(defaultdict(PhaseTime))

    def reset(self) -> None:
        self.steps.clear()

    def __call__(self, phase: str) -> "_Span":
        return _Span(self, phase, "phase")

    def collective(self, clock: Callable[[], float] = time.process_time) -> "_Span":
        """A collective's span; `clock` reads the CPU time of the threads doing its work
        (coll_proc_cpu)."""
        return _Span(self, "", "collective", clock)

    def excluded(self) -> "_Span":
        return _Span(self, "", "excluded")

    def _phase_of(self) -> str:
        """The innermost enclosing phase."""
        for f in reversed(self._stack):
            if f.kind == "phase":
                return f.name
        return "unphased"

    def _close(self, f: _Frame, wall: float, cpu: float, proc: float) -> None:
        if self._stack:
            self._stack[-1].child_cpu += cpu
        rec = self.steps[-1] if self.steps else None
        if f.kind == "phase":
            self.into[f.name] += wall
            if rec is not None:
                rec[f.name].cpu += cpu - f.child_cpu
                rec[f.name].wall += wall
        elif f.kind == "collective" and rec is not None:
            t = rec[self._phase_of()]
            t.coll_wall += wall
            t.coll_cpu += cpu
            t.coll_proc_cpu += proc
            t.calls += 1


class _Span:
    def __init__(self, timer: Timer, name: str, kind: str,
                 clock: Callable[[], float] = time.process_time) -> None:
        self.timer, self.name, self.kind, self.clock = timer, name, kind, clock

    def __enter__(self) -> None:
        self.timer._stack.append(_Frame(self.name, self.kind, time.perf_counter(),
                                        time.thread_time(), self.clock()))

    def __exit__(self, *exc: object) -> None:
        if self.timer.stream is not None:
            self.timer.stream.synchronize()
        elif self.timer.device.type == "cuda":
            torch.cuda.synchronize(self.timer.device)
        f = self.timer._stack.pop()
        self.timer._close(f, time.perf_counter() - f.wall0, time.thread_time() - f.cpu0,
                          self.clock() - f.proc0)
