"""Memory a rank really allocates, per phase of a step: measured by the allocator, not counted
from the shapes the memory model uses.

CUDA: the caching allocator's own statistics. Before each phase the device is synchronised and
the peak statistics reset (torch.cuda.reset_peak_memory_stats); after it, the phase's peak is
torch.cuda.max_memory_allocated (bytes in the blocks of live tensors), the peak of
requested_bytes (what the live tensors asked for: the figure compared with the model) and
max_memory_reserved (bytes the allocator held from the driver, fragmentation included).
Allocated exceeds requested by the allocator's rounding: 512 B per tensor, and a block of
over 1 MiB is not split when what would remain is 1 MiB or less, so such a tensor can hold
up to 1 MiB more than it asked for (CUDACachingAllocator.cpp). That is the executor's
tensor-per-piece layout, not the plan's (FBGEMM's TBE holds a group's tables in one buffer),
so the model is held to the requested bytes and the rounding is reported beside them.
Every step's GPU work runs inside some phase, so the step's peak is the largest phase peak.
What is alive at the peak (`peak_blocks`, a diagnostic) comes from the profiler's allocation
events, as on CPU below: the allocator's block sizes (rounded), the rank thread's own
allocations only (a pipelined rank's input lane is not seen), at the replay's own peak, which
can differ from the statistics' by the rounding.

CPU: torch.profiler with profile_memory=True records every allocation and free the c10 CPU
allocator makes (size, address, time); the probe replays them in time order, matching frees
to allocations by address, and takes the peak of live bytes inside each phase (a
record_function range). Frees made on another thread are not recorded: gloo's worker threads
now and then drop a collective's buffer last, even after comm.py's wait for their references
to go (bounded by SETTLE_S; a timeout is not told apart); about one output buffer in 250 was
still freed there, which put 4 of 82 ranks of three fidelity plans over the model by that
buffer, none of 240 since. So the probe watches the collectives' buffers (`watch`: a weak
reference to each storage) and, at every phase boundary and after every collective (`reap`),
marks in the profiler's timeline the ones that are gone; the replay frees such a block at
that mark when no free was recorded. A watched block freed unseen thus counts until the next
mark after its storage's last reference went: upwards by at most that span (and the memory
itself is released on that thread microseconds after the reference goes, which a mark may
precede by as much); `freed_unseen` counts such blocks per rank. Any other block freed on
another thread would still count until its address is reused. Memory not from torch's
allocator (numpy arrays, memory-mapped files) is not seen: the executor copies what it takes
from numpy into torch-owned tensors on every device. A CPU run keeps every tier in one
memory, so its peak is compared with the model's HBM plus DDR for the rank. The process's
resident-set high-water mark (VmHWM) is recorded beside it as a cross-check, not compared."""

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

# What the executor's own phases are called; "loss" is the targets and pooled gradients,
# between the forward output all-to-all and the backward one.
PHASES = ("input_a2a", "lookup", "output_a2a_fwd", "loss", "output_a2a_bwd", "backward",
          "allreduce")
_TAG = "mem::"


class MemProbe:
    """Peak allocated bytes per phase, over the steps measured (after `start_measuring`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.measuring = False
        self.peak: dict[str, int] = defaultdict(int)  # phase -> peak allocated bytes
        self.reserved: dict[str, int] = defaultdict(int)  # phase -> peak reserved (CUDA)
        self.requested: dict[str, int] = defaultdict(int)  # phase -> peak requested (CUDA)
        # phase -> most bytes a phase allocated above what was allocated as it began
        self.transient: dict[str, int] = defaultdict(int)
        self.step_start = 0  # allocated as the first measured phase began
        self.init_bytes = 0  # allocated after the rank's tables were built
        self.init_peak = 0
        self.init_requested = 0  # CUDA: requested after the rank's tables were built
        self._prof: Any = None
        self.finished = False
        # Watched buffers not yet seen gone: (serial, data address, weak storage reference).
        self._watched: list[tuple[int, int, int]] = []
        self._serial = 0
        self.buffers_watched = 0
        self.freed_unseen = 0  # watched blocks the replay freed at their gone mark
        # Bytes alive at the step's peak, by "phase | operators" that allocated them
        self.peak_blocks: dict[str, dict[str, int]] = {}
        if self.cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        # The profiler's allocation events: the CPU's figures, and on either device what is
        # alive at the step's peak (the allocator's statistics give totals, not owners).
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()

    def mark_init(self) -> None:
        """After the rank's stores exist: what they hold, and the peak of building them."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.init_bytes = torch.cuda.memory_allocated(self.device)
            self.init_peak = torch.cuda.max_memory_allocated(self.device)
            self.init_requested = _requested(self.device, "current")
        with torch.profiler.record_function(_TAG + "init_mark"):
            pass

    def start_measuring(self) -> None:
        """Peaks before this (warm-up steps) are dropped."""
        self.measuring = True
        self.peak.clear()
        self.reserved.clear()
        self.requested.clear()
        self.transient.clear()
        self.step_start = -1
        with torch.profiler.record_function(_TAG + "measure_mark"):
            pass

    def watch(self, *tensors: torch.Tensor) -> None:
        """Buffers another thread may free last (a collective's): their storages' end is
        observed by `reap` (CPU, while the profiler records; CUDA's allocator sees every
        thread's frees)."""
        if self.cuda or self.finished:
            return
        for t in tensors:
            st = t.untyped_storage()
            if st.nbytes() == 0:
                continue
            self._serial += 1
            self.buffers_watched += 1
            ptr = st.data_ptr()
            with torch.profiler.record_function(f"{_TAG}watch:{ptr}:{self._serial}"):
                pass
            self._watched.append((self._serial, ptr, st._weak_ref()))

    def reap(self) -> None:
        """Mark in the profiler's timeline every watched buffer that is gone by now."""
        keep = []
        for serial, ptr, ref in self._watched:
            if torch.UntypedStorage._expired(ref):
                torch.UntypedStorage._free_weak_ref(ref)
                with torch.profiler.record_function(f"{_TAG}gone:{ptr}:{serial}"):
                    pass
            else:
                keep.append((serial, ptr, ref))
        self._watched = keep

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.finished:  # the timed steps: nothing probed, nothing added to their time
            yield
            return
        self.reap()
        # The profiler's range, whose allocations the replay assigns to the phase.
        span = torch.profiler.record_function(_TAG + ("m:" if self.measuring else "w:") + name)
        if not self.cuda:
            try:
                with span:
                    yield
            finally:
                self.reap()
            return
        torch.cuda.synchronize(self.device)
        start = torch.cuda.memory_allocated(self.device)
        if self.measuring and self.step_start < 0:
            self.step_start = start
        torch.cuda.reset_peak_memory_stats(self.device)
        try:
            with span:
                yield
        finally:
            torch.cuda.synchronize(self.device)
            if self.measuring:
                top = torch.cuda.max_memory_allocated(self.device)
                self.peak[name] = max(self.peak[name], top)
                self.transient[name] = max(self.transient[name], top - start)
                self.reserved[name] = max(self.reserved[name],
                                          torch.cuda.max_memory_reserved(self.device))
                self.requested[name] = max(self.requested[name],
                                           _requested(self.device, "peak"))

    def finish(self) -> dict[str, Any]:
        """Stop measuring; the figures as JSON."""
        self.reap()
        self.finished = True
        for _, _, ref in self._watched:
            torch.UntypedStorage._free_weak_ref(ref)
        self._watched = []
        self._prof.__exit__(None, None, None)
        self._replay()
        self._prof = None
        out: dict[str, Any] = {
            "how": ("torch.cuda caching allocator: max_memory_allocated per phase"
                    if self.cuda else "torch.profiler memory events (c10 CPU allocator)"),
            "phase_peak": dict(self.peak),
            "phase_transient": dict(self.transient),
            "step_start": self.step_start,
            "step_peak": max(self.peak.values(), default=0),
            "init_bytes": self.init_bytes,
            "init_peak": self.init_peak,
            "rss_hwm": _vm_hwm(),
        }
        out["peak_blocks"] = self.peak_blocks
        if not self.cuda:
            out["buffers_watched"] = self.buffers_watched
            out["freed_unseen"] = self.freed_unseen
        if self.cuda:
            out["phase_requested_peak"] = dict(self.requested)
            out["init_requested"] = self.init_requested
            out["phase_reserved_peak"] = dict(self.reserved)
            out["step_reserved_peak"] = max(self.reserved.values(), default=0)
            stats = torch.cuda.memory_stats(self.device)
            out["num_alloc_retries"] = int(stats.get("num_alloc_retries", 0))
            out["num_ooms"] = int(stats.get("num_ooms", 0))
        return out

    def _replay(self) -> None:
        """Live bytes over time from the profiler's allocation events; peaks per phase, and
        what was alive at the step's peak (by the phase and operator that allocated it)."""
        # (time, ptr, size, phase, operator chain below the phase)
        events: list[tuple[int, int, int, str | None, str]] = []

        def walk(node: Any, phase: str | None, ops: tuple[str, ...]) -> None:
            name = node.name
            if name.startswith(_TAG):
                phase = name[len(_TAG):]
                ops = ()
                events.append((node.start_time_ns, 0, 0, phase, ""))  # phase entry marker
            ef = node.extra_fields
            if type(ef).__name__ == "_ExtraFields_Allocation":
                if ef.device.type == self.device.type:
                    events.append((node.start_time_ns, int(ef.ptr), int(ef.alloc_size), phase,
                                   " > ".join(ops[:3])))
                return
            if not name.startswith(_TAG):
                ops = (*ops, name)
            for c in node.children:
                walk(c, phase, ops)

        for root in self._prof.profiler.kineto_results.experimental_event_tree():
            walk(root, None, ())
        events.sort(key=lambda e: e[0])
        r = replay_events(events)
        if not self.cuda:  # on CUDA the peaks are the allocator's own (phase()); not replaced
            self.peak, self.transient = r.peak, r.transient
            self.step_start, self.init_bytes, self.init_peak = (r.step_start, r.init_bytes,
                                                                r.init_peak)
        self.freed_unseen = r.freed_unseen
        if r.at_top >= 0:
            self._breakdown(events, r.at_top)

    def _breakdown(self, events: list[tuple[int, int, int, str | None, str]], upto: int
                   ) -> None:
        """Bytes alive at event `upto`, by (phase allocated in, operator chain): what the
        peak is made of, so an excess over the model can be traced to a buffer."""
        groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for size, at in replay_events(events, upto).live.values():
            _, _, _, phase, op = events[at]
            key = f"{phase or 'setup'} | {op or '-'}"
            groups[key][0] += size
            groups[key][1] += 1
        self.peak_blocks = {k: {"bytes": v[0], "blocks": v[1]} for k, v in
                            sorted(groups.items(), key=lambda kv: -kv[1][0])}


@dataclass
class Replayed:
    """Live bytes replayed from allocation events: peaks per measured phase, and the index of
    the event at the step's peak (-1: none)."""

    peak: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    transient: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    step_start: int = -1
    init_bytes: int = 0
    init_peak: int = 0
    at_top: int = -1
    freed_unseen: int = 0  # blocks freed at their gone mark (their free was not recorded)
    # ptr -> (bytes, index of its allocation event) of the blocks alive where the replay
    # stopped
    live: dict[int, tuple[int, int]] = field(default_factory=dict)


def replay_events(events: list[tuple[int, int, int, str | None, str]],
                  upto: int | None = None) -> Replayed:
    """Peaks per phase from (time, ptr, size, phase, op) events in time order (size < 0 or a
    known ptr with size 0: a free; ptr 0 and size 0: a mark, whose `phase` names it: a phase
    or mark begins, or `watch:PTR:N` (the block at PTR is watched buffer N) and `gone:PTR:N`
    (buffer N is gone by now: the block is freed here if its free was not recorded). With
    `upto`, the replay stops after that event and `live` holds the blocks alive then."""
    r = Replayed()
    live: dict[int, tuple[int, int]] = {}  # ptr -> (bytes, index of its allocation event)
    watched: dict[str, int] = {}  # buffer -> index of its block's allocation event
    total = 0
    measuring = False
    init_done = False
    start = 0
    top = -1
    for i, (_, ptr, size, phase, _op) in enumerate(events):
        if upto is not None and i > upto:
            break
        if ptr == 0 and size == 0:  # a mark
            kind, _, rest = (phase or "").partition(":")
            if kind in ("watch", "gone"):
                at, serial = rest.split(":")
                block = live.get(int(at))
                if block is None:  # not allocated while recording, or its free was seen
                    continue
                if kind == "watch":
                    watched[serial] = block[1]
                elif watched.pop(serial, None) == block[1]:  # that very block, not a reuse
                    total -= block[0]
                    del live[int(at)]
                    r.freed_unseen += 1
            elif phase == "init_mark":
                r.init_bytes = total
                init_done = True
            elif phase == "measure_mark":
                measuring = True
            elif measuring and phase is not None and phase.startswith("m:"):
                start = total
                if r.step_start < 0:
                    r.step_start = total
                r.peak[phase[2:]] = max(r.peak[phase[2:]], total)
            continue
        if size > 0:
            # An address handed out again was freed, whether or not the profiler saw the
            # free (one made on another thread is not recorded).
            total += size - live.pop(ptr, (0, -1))[0]
            live[ptr] = (size, i)
        elif ptr in live:  # frees of memory allocated before profiling are not seen
            total -= live.pop(ptr)[0]
        if not init_done:
            r.init_peak = max(r.init_peak, total)
        if measuring and phase is not None and phase.startswith("m:"):
            p = phase[2:]
            r.peak[p] = max(r.peak[p], total)
            r.transient[p] = max(r.transient[p], total - start)
            if total > top:
                top, r.at_top = total, i
    r.live = live
    return r


def _vm_hwm() -> int | None:
    """The process's peak resident set (bytes), from /proc; None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _requested(device: torch.device, which: str) -> int:
    """The caching allocator's requested_bytes ("current" or "peak"): the bytes its live
    tensors asked for, before its rounding."""
    return int(torch.cuda.memory_stats(device).get(f"requested_bytes.all.{which}", 0))
