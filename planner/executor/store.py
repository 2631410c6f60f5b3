"""Where a piece's rows live, by memory tier, as real mechanisms.

hbm: weights and optimizer state in device memory.
ddr: weights and state in host memory; lookups gather on the host and copy to the device.
hbm_cache: a software cache of `cache_rows` hot rows (weights only) in device memory in front
    of the whole piece in host memory; optimizer state stays in host memory (memory.py).
ssd: the piece in a memory-mapped file, behind a host-memory cache of weights and state.
Caches are write-back: a cached row is updated in the cache and written to its backing store
when it is evicted (or at flush). Each cache slot keeps the row it holds (int64) and its
position in the sorted lookup index (int64): the 16 bytes per slot the cost model counts.
Filled on demand: a cache starts empty and admits only rows that were looked up.
Policies (cost_models.cache_policy.CachePolicy), FBGEMM's two, fully associative, the content
updated once per batch (as FBGEMM's prefetch does), after the step:
- LFU: a count per row over all time; the cache keeps the `slots` most-counted rows among
  those it holds and those the batch looked up. A looked-up row displaces a held one only
  with a strictly higher count (FBGEMM's admission), then lower rows first.
- LRU: a stamp per row, the position in the lookup stream of its last use; the cache keeps
  the `slots` most recently used rows: at every batch start it holds what a per-lookup LRU
  cache would.
A lookup hits when its row was cached at the batch's start: `hits / lookups` is the per-lookup
hit rate cache_policy.py predicts. The per-row counts and stamps live in host memory
(reported apart as extra_ddr: the cost model does not count them).

Rows are stored as stored.py says (int8: uint8 rows of codes, fp32 scale and bias): every
gather, scatter, cache slot and file moves stored rows as they are; reads, lookups and updates
convert through stored.py (fp32 out, the optimizer in fp32, stored rows back).
"""

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cost_models import Tier, cache_rows
from cost_models.cache_policy import CachePolicy
from planner.executor import stored

UpdateFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class MemoryHeld:
    hbm: int = 0
    ddr: int = 0
    ssd: int = 0
    extra_ddr: int = 0  # executor bookkeeping the cost model does not count (LFU counters)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class RowStore:
    """Rows [0, rows) of a piece: weights [rows, cols] and optimizer state [rows, s].

    `host_span`, when the rank sets it, times the work on host memory (the cost model's
    cache_miss term: every access of a ddr or ssd piece, and an hbm_cache's misses, write-backs
    and re-admission) as a phase of its own inside the lookup and the backward."""

    hits: int
    lookups: int
    host_span: Callable[[], AbstractContextManager[None]] = nullcontext

    def read(self, ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def pool(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Fused lookup and sum pooling of bags of rows: float32 [bags, cols]."""
        raise NotImplementedError

    def update(self, uniq: torch.Tensor, fn: UpdateFn) -> None:
        raise NotImplementedError

    def end_step(self) -> None:
        """After the optimizer: caches re-admit rows here."""

    def dump(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def memory(self) -> MemoryHeld:
        raise NotImplementedError


class DenseStore(RowStore):
    """hbm (weights on the device) or ddr (weights in host memory, read over PCIe)."""

    def __init__(self, w: torch.Tensor, s: torch.Tensor, tier: Tier, device: torch.device):
        self.tier, self.device = tier, device
        home = device if tier is Tier.HBM else torch.device("cpu")
        self.w, self.s = w.to(home), s.to(home)
        self.hits = self.lookups = 0

    def read(self, ids: torch.Tensor) -> torch.Tensor:
        self.lookups += int(ids.numel())
        if self.tier is Tier.HBM:
            self.hits += int(ids.numel())
        # index_select: a plain row gather, several times faster than advanced indexing.
        rows = torch.index_select(self.w, 0, ids.to(self.w.device))
        return stored.to_float(rows.to(self.device))

    def pool(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        self.lookups += int(ids.numel())
        if self.tier is Tier.HBM:
            self.hits += int(ids.numel())
        dev = self.w.device
        return stored.pool(self.w, ids.to(dev), offsets.to(dev)).to(self.device)

    def update(self, uniq: torch.Tensor, fn: UpdateFn) -> None:
        u = uniq.to(self.w.device)
        w, s = fn(stored.to_float(self.w[u].to(self.device)), self.s[u].to(self.device))
        self.w[u] = stored.to_stored(w, self.w.dtype).to(self.w.device)
        self.s[u] = s.to(self.s.device)

    def dump(self) -> tuple[torch.Tensor, torch.Tensor]:
        return stored.to_float(self.w).cpu(), self.s.cpu()

    def memory(self) -> MemoryHeld:
        n = _nbytes(self.w) + _nbytes(self.s)
        return MemoryHeld(hbm=n) if self.tier is Tier.HBM else MemoryHeld(ddr=n)


class CachedStore(RowStore):
    """hbm_cache (cache on the device, state in host memory) or ssd (cache of weights and
    state in host memory, the piece in a memory-mapped file)."""

    def __init__(self, w: torch.Tensor, s: torch.Tensor, tier: Tier, cache_ratio: float,
                 device: torch.device, policy: CachePolicy | str,
                 ssd_path: Path | None = None) -> None:
        self.tier, self.device, self.policy = tier, device, CachePolicy(policy)
        rows = w.shape[0]
        self.rows, self.cols = rows, stored.cols_of(w)
        if tier is Tier.SSD:
            assert ssd_path is not None
            self.cache_device = torch.device("cpu")
            self.w, self.s, self._files = _memmapped(ssd_path, w, s)
        else:
            self.cache_device = device
            self.w, self.s, self._files = w.clone(), s.clone(), []
        self.cache_state = tier is Tier.SSD
        slots = cache_rows(cache_ratio, rows)
        self.slots = slots
        self.cw = torch.zeros((slots, w.shape[1]), dtype=w.dtype, device=self.cache_device)
        self.cs = torch.zeros((slots, s.shape[1]), dtype=s.dtype, device=self.cache_device) \
            if self.cache_state else None
        # Slot metadata (16 bytes per slot): the rows held, sorted, and the slot of each.
        # Empty slots hold the key `rows`, larger than any id, so the keys stay sorted.
        self.keys = torch.full((slots,), rows, dtype=torch.int64, device=self.cache_device)
        self.slot_of_key = torch.arange(slots, dtype=torch.int64, device=self.cache_device)
        self.score = torch.zeros(rows, dtype=torch.int64)  # host: LFU counts / LRU stamps
        self.clock = 0  # lookups so far: LRU stamps count them
        self.touched: list[torch.Tensor] = []
        self.hits = self.lookups = 0

    def _find(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids = ids.to(self.cache_device)
        pos = torch.searchsorted(self.keys, ids).clamp(max=self.slots - 1)
        hit = self.keys[pos] == ids
        return hit, self.slot_of_key[pos]

    def read(self, ids: torch.Tensor) -> torch.Tensor:
        hit, slot = self._find(ids)
        ids_h = ids.cpu()
        out = torch.empty((ids.numel(), self.cols), dtype=torch.float32, device=self.device)
        hd = hit.to(self.device)
        out[hd] = stored.to_float(torch.index_select(self.cw, 0, slot[hit]).to(self.device))
        miss = ~hit.cpu()
        out[miss.to(self.device)] = stored.to_float(torch.index_select(
            self.w, 0, ids_h[miss]).to(self.device))
        self._count(ids_h, hit)
        return out

    def pool(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Hits pooled from the cache, misses from the backing store, each fused (the other
        side's ids masked out), then added."""
        hit, slot = self._find(ids)
        ids_h = ids.cpu()
        cached = stored.pool(self.cw, slot, offsets.to(self.cache_device), hit)
        with self.host_span():
            missed = stored.pool(self.w, ids_h, offsets.cpu(), ~hit.cpu())
        self._count(ids_h, hit)
        return cached.to(self.device) + missed.to(self.device)

    def _count(self, ids_h: torch.Tensor, hit: torch.Tensor) -> None:
        n = int(ids_h.numel())
        self.hits += int(hit.sum())
        self.lookups += n
        if self.policy is CachePolicy.LFU:
            self.score.index_add_(0, ids_h, torch.ones_like(ids_h))
        else:
            # A row's stamp: the stream position of its last lookup (amax over repeats).
            stamps = torch.arange(self.clock + 1, self.clock + n + 1, dtype=torch.int64)
            self.score.scatter_reduce_(0, ids_h, stamps, reduce="amax")
        self.clock += n
        self.touched.append(ids_h)

    def update(self, uniq: torch.Tensor, fn: UpdateFn) -> None:
        hit, slot = self._find(uniq)
        u = uniq.cpu()
        hit_h = hit.cpu()
        w = torch.empty((u.numel(), self.cols), dtype=torch.float32, device=self.device)
        s = torch.empty((u.numel(), self.s.shape[1]), dtype=self.s.dtype, device=self.device)
        hd = hit.to(self.device)
        w[hd] = stored.to_float(self.cw[slot[hit]].to(self.device))
        with self.host_span():  # the misses' rows, and the state where it stays in DDR
            w[~hd] = stored.to_float(self.w[u[~hit_h]].to(self.device))
            if self.cs is None:
                s[:] = self.s[u].to(self.device)
        if self.cs is not None:
            s[hd] = self.cs[slot[hit]].to(self.device)
            s[~hd] = self.s[u[~hit_h]].to(self.device)
        w, s = fn(w, s)
        self.cw[slot[hit]] = stored.to_stored(w[hd], self.cw.dtype).to(self.cache_device)
        with self.host_span():
            self.w[u[~hit_h]] = stored.to_stored(w[~hd], self.w.dtype).to("cpu")
            if self.cs is None:
                self.s[u] = s.cpu()
        if self.cs is not None:
            self.cs[slot[hit]] = s[hd].to(self.cache_device)
            self.s[u[~hit_h]] = s[~hd].cpu()

    def end_step(self) -> None:
        """The policy's new content: the `slots` best rows among those held and those the
        batch looked up; evicted rows are written back, admitted rows copied in."""
        if not self.touched:
            return
        old_keys = self.keys.cpu()
        old_slots = self.slot_of_key.cpu()
        valid = old_keys < self.rows
        held = old_keys[valid]
        cand = torch.unique(torch.cat([held, *self.touched]))  # sorted: ties -> lower row
        self.touched = []
        key = self.score[cand]
        if self.policy is CachePolicy.LFU:
            # Equal counts: the held row stays (a newcomer needs a strictly higher count).
            key = key * 2 + torch.isin(cand, held).to(torch.int64)
        order = torch.sort(key, descending=True, stable=True).indices
        keep = torch.sort(cand[order[:self.slots]]).values
        stays = torch.isin(old_keys, keep) & valid
        leaves = valid & ~stays
        # Write evicted rows back to their backing store.
        ev_rows, ev_slots = old_keys[leaves], old_slots[leaves]
        self.w[ev_rows] = self.cw[ev_slots.to(self.cache_device)].to("cpu")
        if self.cs is not None:
            self.s[ev_rows] = self.cs[ev_slots.to(self.cache_device)].cpu()
        used = torch.zeros(self.slots, dtype=torch.bool)
        used[old_slots[stays]] = True
        free = torch.nonzero(~used).reshape(-1)
        new_rows = keep[~torch.isin(keep, old_keys[stays])]
        fill = free[:new_rows.numel()]
        if new_rows.numel():
            self.cw[fill.to(self.cache_device)] = self.w[new_rows].to(self.cache_device)
            if self.cs is not None:
                self.cs[fill] = self.s[new_rows]
        # The new index: held and admitted rows sorted, each with its slot; then the empties.
        rows_in = torch.cat([old_keys[stays], new_rows])
        slots_in = torch.cat([old_slots[stays], fill])
        by_row = torch.sort(rows_in).indices
        n = keep.numel()
        keys = torch.full((self.slots,), self.rows, dtype=torch.int64)
        slot_of_key = torch.arange(self.slots, dtype=torch.int64)
        keys[:n] = rows_in[by_row]
        slot_of_key[:n] = slots_in[by_row]
        slot_of_key[n:] = free[new_rows.numel():]
        self.keys = keys.to(self.cache_device)
        self.slot_of_key = slot_of_key.to(self.cache_device)

    def flush(self) -> None:
        valid = self.keys < self.rows
        k = self.keys[valid].cpu()
        sl = self.slot_of_key[valid]
        self.w[k] = self.cw[sl].to("cpu")
        if self.cs is not None:
            self.s[k] = self.cs[sl].cpu()

    def dump(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.flush()
        return stored.to_float(self.w).clone(), self.s.clone()

    def memory(self) -> MemoryHeld:
        meta = _nbytes(self.keys) + _nbytes(self.slot_of_key)
        cache = _nbytes(self.cw) + (_nbytes(self.cs) if self.cs is not None else 0) + meta
        backing = _nbytes(self.w) + _nbytes(self.s)
        extra = _nbytes(self.score)
        if self.tier is Tier.SSD:
            return MemoryHeld(ddr=cache, ssd=backing, extra_ddr=extra)
        return MemoryHeld(hbm=cache, ddr=backing, extra_ddr=extra)


def _memmapped(path: Path, w: torch.Tensor, s: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, list[np.memmap]]:
    """The piece's weights and state in files on disk, mapped into memory."""
    files = []
    out = []
    for suffix, t in (("w", w), ("s", s)):
        arr = t.contiguous().view(torch.uint8).numpy()  # raw bytes: bf16 has no numpy type
        mm = np.memmap(path.with_suffix(f".{suffix}"), dtype=np.uint8, mode="w+",
                       shape=max(arr.size, 1))
        mm[:arr.size] = arr.reshape(-1)
        files.append(mm)
        out.append(torch.from_numpy(mm[:arr.size]).view(t.dtype).reshape(t.shape))
    return out[0], out[1], files


def make_store(w: torch.Tensor, s: torch.Tensor, tier: Tier, cache_ratio: float,
               device: torch.device, policy: CachePolicy | str, ssd_path: Path | None
               ) -> RowStore:
    if tier in (Tier.HBM, Tier.DDR):
        return DenseStore(w, s, tier, device)
    return CachedStore(w, s, tier, cache_ratio, device, policy, ssd_path)
