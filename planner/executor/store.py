"""Where a piece's rows live, by memory tier, as real mechanisms.

hbm: weights and optimizer state in device memory.
ddr: weights and state in host memory; lookups gather on the host and copy to the device.
hbm_cache: a software cache of `cache_rows` hot rows (weights only) in device memory in front
    of the whole piece in host memory; optimizer state stays in host memory (memory.py).
ssd: the piece in a memory-mapped file, behind a host-memory cache of weights and state.
Caches are write-back: a cached row is updated in the cache and written to its backing store
when it is evicted (or at flush). Each cache slot keeps the row it holds (int64) and its
position in the sorted lookup index (int64): the 16 bytes per slot the cost model counts.
Admission (LFU, the cost model's "ideal LFU"): after every step the cache holds the rows with
the highest access counts among those it held and those just looked up; ties go to the lower
row. The per-row access counters live in host memory (reported apart: the model omits them).
LRU is the alternative policy (last-use stamps instead of counts).
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cost_models import Tier, cache_rows
from cost_models.types import DataType
from planner.executor import kernels

UpdateFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
_DTYPES = {DataType.FP32: torch.float32, DataType.FP16: torch.float16,
           DataType.BF16: torch.bfloat16}


def torch_dtype(dt: DataType) -> torch.dtype:
    if dt not in _DTYPES:
        raise ValueError(f"the executor stores {', '.join(d.value for d in _DTYPES)} weights; "
                         f"{dt.value} (per-row quantized) storage is not implemented")
    return _DTYPES[dt]


@dataclass
class MemoryHeld:
    hbm: int = 0
    ddr: int = 0
    ssd: int = 0
    extra_ddr: int = 0  # executor bookkeeping the cost model does not count (LFU counters)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class RowStore:
    """Rows [0, rows) of a piece: weights [rows, cols] and optimizer state [rows, s]."""

    hits: int
    lookups: int

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
        return rows.to(self.device, torch.float32)

    def pool(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        self.lookups += int(ids.numel())
        if self.tier is Tier.HBM:
            self.hits += int(ids.numel())
        dev = self.w.device
        return kernels.pool_bags(self.w, ids.to(dev), offsets.to(dev)).to(self.device)

    def update(self, uniq: torch.Tensor, fn: UpdateFn) -> None:
        u = uniq.to(self.w.device)
        w, s = fn(self.w[u].to(self.device, torch.float32), self.s[u].to(self.device))
        self.w[u] = w.to(self.w.device, self.w.dtype)
        self.s[u] = s.to(self.s.device)

    def dump(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.w.float().cpu(), self.s.cpu()

    def memory(self) -> MemoryHeld:
        n = _nbytes(self.w) + _nbytes(self.s)
        return MemoryHeld(hbm=n) if self.tier is Tier.HBM else MemoryHeld(ddr=n)


class CachedStore(RowStore):
    """hbm_cache (cache on the device, state in host memory) or ssd (cache of weights and
    state in host memory, the piece in a memory-mapped file)."""

    def __init__(self, w: torch.Tensor, s: torch.Tensor, tier: Tier, cache_ratio: float,
                 device: torch.device, policy: str, ssd_path: Path | None = None) -> None:
        self.tier, self.device, self.policy = tier, device, policy
        rows = w.shape[0]
        self.rows = rows
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
        self.clock = 0
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
        out = torch.empty((ids.numel(), self.cw.shape[1]), dtype=torch.float32,
                          device=self.device)
        hd = hit.to(self.device)
        out[hd] = torch.index_select(self.cw, 0, slot[hit]).to(self.device, torch.float32)
        miss = ~hit.cpu()
        out[miss.to(self.device)] = torch.index_select(self.w, 0, ids_h[miss]).to(
            self.device, torch.float32)
        self._count(ids_h, hit)
        return out

    def pool(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Hits pooled from the cache, misses from the backing store, each fused (the other
        side's ids masked out), then added."""
        hit, slot = self._find(ids)
        ids_h = ids.cpu()
        cached = kernels.pool_bags(self.cw, slot, offsets.to(self.cache_device), hit)
        missed = kernels.pool_bags(self.w, ids_h, offsets.cpu(), ~hit.cpu())
        self._count(ids_h, hit)
        return cached.to(self.device) + missed.to(self.device)

    def _count(self, ids_h: torch.Tensor, hit: torch.Tensor) -> None:
        self.hits += int(hit.sum())
        self.lookups += int(ids_h.numel())
        self.clock += 1
        if self.policy == "lfu":
            self.score.index_add_(0, ids_h, torch.ones_like(ids_h))
        else:
            self.score[ids_h] = self.clock
        self.touched.append(ids_h)

    def update(self, uniq: torch.Tensor, fn: UpdateFn) -> None:
        hit, slot = self._find(uniq)
        u = uniq.cpu()
        hit_h = hit.cpu()
        w = torch.empty((u.numel(), self.cw.shape[1]), dtype=torch.float32, device=self.device)
        s = torch.empty((u.numel(), self.s.shape[1]), dtype=self.s.dtype, device=self.device)
        hd = hit.to(self.device)
        w[hd] = self.cw[slot[hit]].to(self.device, torch.float32)
        w[~hd] = self.w[u[~hit_h]].to(self.device, torch.float32)
        if self.cs is not None:
            s[hd] = self.cs[slot[hit]].to(self.device)
            s[~hd] = self.s[u[~hit_h]].to(self.device)
        else:
            s[:] = self.s[u].to(self.device)
        w, s = fn(w, s)
        self.cw[slot[hit]] = w[hd].to(self.cache_device, self.cw.dtype)
        self.w[u[~hit_h]] = w[~hd].to("cpu", self.w.dtype)
        if self.cs is not None:
            self.cs[slot[hit]] = s[hd].to(self.cache_device)
            self.s[u[~hit_h]] = s[~hd].cpu()
        else:
            self.s[u] = s.cpu()

    def end_step(self) -> None:
        """Re-admit: keep the `slots` best-scored rows among those held and those looked up."""
        if not self.touched:
            return
        held = self.keys[self.keys < self.rows].cpu()
        cand = torch.unique(torch.cat([held, *self.touched]))  # sorted: ties -> lower row
        self.touched = []
        order = torch.sort(self.score[cand], descending=True, stable=True).indices
        keep = torch.sort(cand[order[:self.slots]]).values
        old_keys = self.keys.cpu()
        old_slots = self.slot_of_key.cpu()
        valid = old_keys < self.rows
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
        slot_of_row = dict(zip(old_keys[stays].tolist(), old_slots[stays].tolist(), strict=True))
        new_rows = keep[~torch.isin(keep, old_keys[stays])]
        fill = free[:new_rows.numel()]
        if new_rows.numel():
            self.cw[fill.to(self.cache_device)] = self.w[new_rows].to(self.cache_device)
            if self.cs is not None:
                self.cs[fill] = self.s[new_rows]
        slot_of_row.update(zip(new_rows.tolist(), fill.tolist(), strict=True))
        n = keep.numel()
        keys = torch.full((self.slots,), self.rows, dtype=torch.int64)
        slot_of_key = torch.arange(self.slots, dtype=torch.int64)
        keys[:n] = keep
        slot_of_key[:n] = torch.tensor([slot_of_row[r] for r in keep.tolist()],
                                       dtype=torch.int64)
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
        return self.w.float().clone(), self.s.clone()

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
               device: torch.device, policy: str, ssd_path: Path | None) -> RowStore:
    if tier in (Tier.HBM, Tier.DDR):
        return DenseStore(w, s, tier, device)
    return CachedStore(w, s, tier, cache_ratio, device, policy, ssd_path)
