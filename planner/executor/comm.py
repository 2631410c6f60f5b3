"""Collectives with their bytes counted, and a heartbeat the parent reads to name a hung rank.

The all-to-all is `torch.distributed.all_to_all_single` on uint8 buffers with uneven splits
(gloo and NCCL both implement it). A rank's own share never enters the buffer: it does not
cross a wire, and the cost model does not count it either. The data-parallel all-reduce is a
ring (reduce-scatter then all-gather over row chunks) written with point-to-point sends, so
its bytes are countable and it can quantize like the all-to-alls.
"""

import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from cost_models.types import CommPrecision
from planner.executor import quant

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

    def mark(self, step: int, phase: str) -> None:
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

    def reset(self) -> None:
        self.counts.clear()

    def _guard(self, phase: str) -> None:
        self.heartbeat.mark(self.step, phase)

    def _settle(self, *tensors: torch.Tensor) -> None:
        """Wait (at most SETTLE_S) until this thread holds the only reference to each buffer
        of a finished collective. Gloo's worker thread drops its own a few microseconds
        after the collective returns; had it dropped the last one, the buffer would be freed
        on that thread, where the CPU memory probe (torch.profiler) records no free, and
        counted as live until its address is reused. CUDA's allocator records frees on any
        thread, and NCCL's work objects live on: there, nothing to wait for."""
        if self.device.type != "cpu":
            return
        until = time.perf_counter() + SETTLE_S
        for t in tensors:
            # The collective's work holds the tensor itself; views hold its storage only.
            while t._use_count() > 1 and time.perf_counter() < until:
                time.sleep(0)

    def alltoall(self, name: str, send: list[torch.Tensor | None],
                 recv_sizes: list[int]) -> list[torch.Tensor | None]:
        """Exchange uint8 buffers: send[d] goes to rank d; returns what each rank sent here.
        Entries for this rank are ignored (the caller keeps its own data)."""
        self._guard(name)
        me = self.rank
        empty = torch.empty(0, dtype=torch.uint8, device=self.device)
        parts = [empty if d == me or send[d] is None else send[d].to(self.device)
                 for d in range(self.world)]
        in_splits = [int(p.numel()) for p in parts]
        out_splits = [0 if s == me else recv_sizes[s] for s in range(self.world)]
        inp = torch.cat(parts) if sum(in_splits) else empty
        out = torch.empty(sum(out_splits), dtype=torch.uint8, device=self.device)
        try:
            dist.all_to_all_single(out, inp, out_splits, in_splits)
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

    def ring_allreduce(self, name: str, x: torch.Tensor, precision: CommPrecision) -> None:
        """Sum x [rows, cols] over ranks in place. Rows are cut into `world` chunks; chunk c
        is summed in the order c, c+1, ... (mod world), which the reference reproduces.
        Every hop sends its rows at `precision`; the rank that finishes a chunk keeps the value
        it sends, so all replicas end bit-identical."""
        w, me = self.world, self.rank
        if w == 1:
            return
        bounds = chunk_bounds(x.shape[0], w)
        nxt, prv = (me + 1) % w, (me - 1) % w
        cols = x.shape[1]

        def hop(buf: torch.Tensor, recv_c: int) -> torch.Tensor:
            r0, r1 = bounds[recv_c], bounds[recv_c + 1]
            rbuf = torch.empty(quant.wire_bytes(precision, r1 - r0, cols), dtype=torch.uint8,
                               device=x.device)
            try:
                req = dist.isend(buf, nxt)
                dist.recv(rbuf, prv)
                req.wait()
            except RuntimeError as exc:
                raise CollectiveError(f"all-reduce '{name}' at step {self.step}: {exc}") from exc
            del req
            self._settle(buf, rbuf)
            c = self.counts[name]
            c.sent += int(buf.numel())
            c.recv += int(rbuf.numel())
            return rbuf

        def rows_of(c: int) -> slice:
            return slice(bounds[c], bounds[c + 1])

        self._guard(name)
        for k in range(w - 1):  # reduce-scatter
            send_c, recv_c = (me - k) % w, (me - k - 1) % w
            got = hop(quant.encode(x[rows_of(send_c)], precision), recv_c)
            r = rows_of(recv_c)
            x[r] = quant.decode(got, r.stop - r.start, cols, precision) + x[r]
        # All-gather: the finished chunk's bytes travel unchanged round the ring, and its
        # owner keeps what it sent, so every replica decodes the very same bytes.
        done = rows_of((me + 1) % w)
        buf = quant.encode(x[done], precision)
        x[done] = quant.decode(buf, done.stop - done.start, cols, precision)
        for k in range(w - 1):
            recv_c = (me - k) % w
            buf = hop(buf, recv_c)
            r = rows_of(recv_c)
            x[r] = quant.decode(buf, r.stop - r.start, cols, precision)


def chunk_bounds(rows: int, world: int) -> list[int]:
    return [rows * i // world for i in range(world + 1)]


class Timer:
    """Seconds per phase; waits for the device so GPU time is not hidden in the next phase."""

    def __init__(self, device: torch.device, into: dict[str, float]) -> None:
        self.device, self.into = device, into

    def __call__(self, phase: str) -> "_Span":
        return _Span(self, phase)


class _Span:
    def __init__(self, timer: Timer, phase: str) -> None:
        self.timer, self.phase = timer, phase

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        if self.timer.device.type == "cuda":
            torch.cuda.synchronize(self.timer.device)
        self.timer.into[self.phase] += time.perf_counter() - self.t0
