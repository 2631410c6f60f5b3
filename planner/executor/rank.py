"""One rank of the executor: its pieces, and one training step over torch.distributed.

A step, per docs/DESIGN.md:
1. input all-to-all: every rank sends, for each piece, its samples' bag lengths (int32 by
   default) and the ids that piece serves (int64 by default): all ids for table-/column-wise
   pieces, the ids in the piece's row range for row-split pieces. The lengths go first, in an
   all-to-all whose sizes the layout fixes; the ids' sizes follow from the lengths.
2. lookup and sum pooling of every piece over the global batch B = b*W: one bag per sample
   and feature (a table read by k features has k bags per sample, laid out feature after
   feature; a feature of its own batch b_f has b_f bags per rank).
3. output all-to-all (forward): table-/column-/row-wise pieces send each owner its b vectors
   (one per bag)
   (row-wise: partial sums, summed by the owner in row order). Table-row-wise and grid pieces
   first reduce-scatter inside the host (the GPU of local index k gets the samples of every
   rank of local index k), then send each reduced vector to its owner on another host.
   A sequence table (pooling_mode "none") is not pooled: each id is its own bag of one, its
   piece returns one vector per id it got, ordered by sending rank, and sends each owner the
   vectors of that owner's ids (a row-wise piece: of those in its range, which the owner puts
   back at their places among its ids; both sides know the counts from the input exchange).
4. loss 0.5*|pooled - target|^2 on the owner; the backward all-to-alls mirror step 3 with the
   pooled gradients; every piece adds up its rows' gradients and applies the optimizer over
   the sorted unique ids; data-parallel replicas all-reduce their gradients (a ring per
   bucket of DDP's sizes, cost_models/buckets.py) instead.
Every exchange is at the plan's forward/backward communication precision.

Timing (comm.Timer), per step and phase: the thread's own CPU time for compute, the wall
time of each collective after an untimed barrier; work on host memory (ddr and ssd pieces,
an hbm_cache's misses and re-admission) is its own phase, cache_miss, as the cost model
has it.
"""

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from cost_models.buckets import bucket_assignment
from cost_models.types import CommPrecision, Tier
from planner.executor import kernels, quant, synthetic
from planner.executor.comm import Comm, Timer
from planner.executor.fbgemm import TbeGroup, TbeStore, group_pieces
from planner.executor.input_lane import InputLane
from planner.executor.job import RunOptions
from planner.executor.layout import WIRE_INTS, Chunk, ExecLayout, Piece, TableExec
from planner.executor.memprobe import MemProbe
from planner.executor.store import (
    CachedStore,
    DenseStore,
    RowStore,
    make_store,
)
from planner.executor.stored import storage_dtype, to_stored


@dataclass(frozen=True)
class Item:
    """One vector block on the wire: `rows` vectors of `piece`'s columns from src to dst."""

    src: int
    dst: int
    piece: Piece
    tag: int  # flat: the owner rank; host stage 1: the local index; host stage 2: the host
    rows: int


def stage_items(lay: ExecLayout) -> tuple[list[Item], list[Item]]:
    """(stage 1, stage 2) items of the forward output all-to-all, in wire order; the backward
    runs the same items with src and dst swapped, stage 2 first."""
    w, g = lay.world, lay.gpus_per_host
    first, second = [], []
    for t in lay.tables:
        if t.data_parallel:
            continue
        # One vector per bag (per sample and feature); a sequence table's one per id: the
        # ids a rank draws (a row-wise piece's share varies per step: RankExecutor._rows).
        b = t.outputs
        for p in t.pieces:
            if t.host_reduced:
                for k in range(g):
                    q = p.host * g + k
                    if q != p.rank:
                        first.append(Item(p.rank, q, p, k, lay.hosts * b))
            else:
                first.extend(Item(p.rank, o, p, o, b) for o in range(w) if o != p.rank)
        if t.host_reduced:
            for ch in t.chunks:
                for q in ch.pieces:
                    k = lay.local_of(q.rank)
                    for h in range(lay.hosts):
                        o = h * g + k
                        if o != q.rank:
                            second.append(Item(q.rank, o, q, h, b))
    return first, second


@dataclass(frozen=True)
class Routed:
    """One step's input all-to-all: (bag lengths, ids) per piece of this rank, and the sequence
    tables' indices (RankExecutor.seq_count, seq_start, seq_pos)."""

    pieces: dict[str, tuple[torch.Tensor, torch.Tensor]]
    seq: tuple[dict[tuple[str, int], int], dict[tuple[str, int], int], dict[str, torch.Tensor]]

    def tensors(self) -> list[torch.Tensor]:
        return [t for pair in self.pieces.values() for t in pair] + list(self.seq[2].values())


@dataclass
class PieceStats:
    ids_bytes: int = 0  # id bytes received from other ranks (input all-to-all)
    lengths_bytes: int = 0  # bag-length bytes received from other ranks
    own_ids: int = 0  # ids this rank's own samples sent its piece (no wire)
    out_fwd_bytes: int = 0  # vectors sent (forward output all-to-all, both stages)
    out_bwd_bytes: int = 0  # gradient vectors received (backward, both stages)


class RankExecutor:
    def __init__(self, lay: ExecLayout, rank: int, device: torch.device, comm: Comm,
                 opts: RunOptions, work_dir: Path, lane_comm: Comm | None = None) -> None:
        """`lane_comm`: a pipelined plan's input lane's collectives (their own group)."""
        self.lay, self.rank, self.device, self.comm, self.opts = lay, rank, device, comm, opts
        self.lane: InputLane[Routed] | None = (
            InputLane(lane_comm, device, Routed.tensors) if lane_comm is not None else None)
        self.optim = kernels.OptimConfig(lr=opts.lr, eps=opts.eps)
        self.b = lay.batch
        # First, so that on CPU the profiler sees the stores being built.
        self.mem = MemProbe(device)
        self.ballast = _ballast(opts.fault, rank)
        self.pieces = lay.pieces_on(rank)
        self.stores: dict[str, RowStore] = {}
        # --kernels fbgemm: FBGEMM's TBE for the pieces it serves, one per (optimizer, dtype)
        # group, lookups fused over the group; the others' reason to run on torch, by key.
        self.tbe_groups: list[TbeGroup] = []
        self.torch_why: dict[str, str] = {}
        if opts.kernels == "fbgemm":
            groups, self.torch_why = group_pieces(list(lay.tables), self.pieces, device)
            for ps in groups.values():
                init = [self._initial(lay.tables[p.table], p.row0, p.rows, p.col0, p.cols)
                        for p in ps]
                group = TbeGroup(ps, [lay.tables[p.table] for p in ps], init, self.optim,
                                 device)
                del init
                self.tbe_groups.append(group)
                for i, p in enumerate(ps):
                    self.stores[p.key] = TbeStore(group, i)
        for p in self.pieces:
            if p.key in self.stores:
                continue
            t = lay.tables[p.table]
            w, s = self._initial(t, p.row0, p.rows, p.col0, p.cols)
            self.stores[p.key] = make_store(w, s, t.tier, t.cache_ratio, device,
                                            t.cache_policy, work_dir / f"r{rank}_{p.key}")
        self.replicas: dict[int, DenseStore] = {}
        for t in lay.tables:
            if t.data_parallel:
                w, s = self._initial(t, 0, t.rows, 0, t.dim)
                self.replicas[t.index] = DenseStore(w, s, t.tier, device)
        self.items1, self.items2 = stage_items(lay)
        self.chunk_of: dict[str, Chunk] = {p.key: ch for t in lay.tables for ch in t.chunks
                                           for p in ch.pieces}
        g = lay.gpus_per_host
        # Bags of the ranks of local index k, host by host: what a host stage reduces
        # (cost_models.memory.host_reduce_index_bytes), one index per distinct count of
        # bags per rank among host-reduced tables; none without host-reduced tables.
        self.local_samples: dict[int, list[torch.Tensor]] = {
            nb: [torch.cat([torch.arange(o * nb, (o + 1) * nb) for o in range(k, lay.world, g)])
                 .to(device) for k in range(g)]
            for nb in sorted({t.bags for t in lay.tables if t.host_reduced})}
        # Sequence tables, per step: ids of owner o's samples that piece p serves, by
        # (p.key, o), for every piece or owner this rank is; where a piece's vectors for o
        # start among its outputs (rows ordered by sending rank); and, on the owner, where a
        # row-wise piece's ids sit among its own (the vectors come back in that order).
        self.seq_count: dict[tuple[str, int], int] = {}
        self.seq_start: dict[tuple[str, int], int] = {}
        self.seq_pos: dict[str, torch.Tensor] = {}
        self.stats: dict[str, PieceStats] = defaultdict(PieceStats)
        self.seconds: dict[str, float] = defaultdict(float)
        self.timer = Timer(device, self.seconds)
        comm.timer = self.timer
        comm.probe = self.mem
        for st in self.stores.values():
            st.host_span = self._host_span
        # Replicas' gradients in DDP's buckets: ready order (the backward reaches the last
        # table first), sized in the parameters' dtype as DDP sizes them.
        ready = sorted(self.replicas, reverse=True)
        sizes = [lay.tables[ti].rows * lay.tables[ti].dim
                 * torch.empty((), dtype=storage_dtype(lay.tables[ti].data_type)).element_size()
                 for ti in ready]
        self.buckets = [[ready[i] for i in b] for b in bucket_assignment(sizes)]
        self.mem.mark_init()

    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        """Timed and its allocator peak measured (the probe's reset and read outside the
        timer's span)."""
        with self.mem.phase(name), self.timer(name):
            yield

    def _host_span(self) -> AbstractContextManager[None]:
        return self.timer("cache_miss")

    def _on_host(self, p: Piece) -> AbstractContextManager[None]:
        """All of a ddr or ssd piece's row traffic is host memory (the model's cache_miss)."""
        t = self.lay.tables[p.table]
        return self._host_span() if t.tier in (Tier.DDR, Tier.SSD) else nullcontext()

    def _initial(self, t: TableExec, row0: int, rows: int, col0: int, cols: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        w = synthetic.init_weights(self.opts.seed, t.index, t.dim, row0, rows, col0, cols)
        # A copy: torch-owned memory, which the CPU memory probe sees (numpy's it does not);
        # int8 rows quantized per row of the piece's columns (stored.py).
        wt = to_stored(torch.from_numpy(w).clone(), storage_dtype(t.data_type))
        st = torch.zeros((rows, kernels.state_cols(t.optimizer, cols)), dtype=torch.float32)
        return wt, st

    def _piece_on(self, p: Piece, rank: int) -> Piece:
        return next(q for q in self.chunk_of[p.key].pieces if q.rank == rank)

    # -- the step --------------------------------------------------------------------------

    def _batches(self, step: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """This rank's samples' (bag lengths, ids) per table at `step`."""
        return {t.index: synthetic.id_batch(self.opts.seed, t.index, t.access, t.rows,
                                            t.pooling, step, self.rank, self.b, t.features)
                for t in self.lay.tables}

    def _routed(self, step: int, batches: dict[int, tuple[np.ndarray, np.ndarray]],
                train: bool, following: int | None) -> "Routed":
        """This step's input all-to-all: in turn, or (pipelined) taken from the input lane,
        where it ran during the previous step; the wait for it is the phase input_wait, the
        lane's own timing this step's input_a2a. Then the lane starts `following`'s."""
        lane = self.lane
        got = lane.take(step) if lane is not None else None
        if got is None:
            with self._phase("input_a2a"):
                routed = self._input_a2a(batches, self.comm)
        else:
            with self._phase("input_wait"):
                routed, lane_time = got
            self.timer.steps[-1]["input_a2a"] = replace(lane_time, lane=True)
            self.seconds["input_a2a"] += lane_time.wall
        if lane is not None and following is not None:
            lane.start(following, train,
                       lambda comm: self._input_a2a(self._batches(following), comm))
        return routed

    def step(self, step: int, train: bool, following: int | None = None
             ) -> dict[int, torch.Tensor]:
        """One step; returns this rank's pooled outputs per table, [bags, dim] each.
        `following`: the step that runs next (pipelined: its input all-to-all starts now)."""
        lay, me = self.lay, self.rank
        self.comm.step = step
        # Barriers before collectives only where time is measured: the forward-only warm-up
        # (up to hundreds of steps) need not pay for them.
        self.comm.align = train
        self.timer.new_step()
        batches = self._batches(step)
        got = self._routed(step, batches, train, following)
        self.seq_count, self.seq_start, self.seq_pos = got.seq
        routed = got.pieces
        with self._phase("lookup"):
            pooled, lookups = {}, {}
            # Test hook: bytes this rank allocates for nothing (the probe must see them).
            ballast = (torch.ones(self.ballast, dtype=torch.uint8, device=self.device)
                       if self.ballast and train else None)
            for p in self.pieces:
                st = self.stores[p.key]
                # A TBE piece's ids are read once more, into its group's one index tensor
                # (which the TBE keeps for its backward): not kept here beside it.
                lengths, ids = (routed.pop(p.key) if isinstance(st, TbeStore)
                                else routed[p.key])
                offsets = self._offsets(lay.tables[p.table], lengths, ids)
                # In place: the received ids are not read again (no second [ids] buffer).
                local = ids.sub_(p.row0) if p.row0 else ids
                lookups[p.key] = (local, offsets)
                if isinstance(st, TbeStore):
                    st.hits += int(local.numel())
                    st.lookups += int(local.numel())
                    continue
                with self._on_host(p):
                    pooled[p.key] = st.pool(local, offsets)
            for group in self.tbe_groups:  # one fused lookup per group
                keys = [p.key for p in group.pieces]
                for k, v in zip(keys, group.pool([lookups.pop(k) for k in keys], train),
                                strict=True):
                    pooled[k] = v
            for ti, rep in self.replicas.items():
                lengths, ids = (torch.from_numpy(a).to(self.device, copy=True)
                                for a in batches[ti])
                offsets = self._offsets(lay.tables[ti], lengths, ids)
                pooled[f"dp{ti}"] = rep.pool(ids, offsets)
                lookups[f"dp{ti}"] = (ids, offsets)
            del ballast
        with self._phase("output_a2a_fwd"):
            outs = self._output_fwd(pooled)
        if train:
            grads = {}
            with self._phase("loss"):
                for t in lay.tables:
                    target = synthetic.targets(self.opts.seed, t.index, step, me, t.outputs,
                                               t.dim)
                    grads[t.index] = outs[t.index] - torch.from_numpy(target).to(
                        self.device, copy=True)
            with self._phase("output_a2a_bwd"):
                full = self._output_bwd(grads)
            with self._phase("backward"):
                for group in self.tbe_groups:  # row gradients and optimizer fused
                    group.backward([full.pop(p.key) for p in group.pieces])
                for p in self.pieces:
                    if p.key in lookups:
                        self._update_piece(p, lookups[p.key], full[p.key], step)
                dense = {}
                for ti in sorted(self.replicas, reverse=True):  # DDP's ready order
                    ids, offsets = lookups[f"dp{ti}"]
                    t = lay.tables[ti]
                    uniq, g = kernels.row_grads_bags(ids, offsets, grads[ti])
                    dense[ti] = torch.zeros((t.rows, t.dim), dtype=torch.float32,
                                            device=self.device)
                    dense[ti][uniq] = g
                    del uniq, g  # not held into the next phases (one piece's at a time)
            with self._phase("allreduce"):
                for bucket in self.buckets:
                    self.comm.ring_allreduce("allreduce", [dense[ti] for ti in bucket],
                                             lay.bwd_precision)
            with self._phase("backward"):
                for ti, rep in self.replicas.items():
                    rep.update(torch.arange(lay.tables[ti].rows, device=self.device),
                               self._updater(lay.tables[ti], dense[ti], step))
        with self._phase("backward"):
            for st in self.stores.values():
                # Re-admission and write-back move rows between the cache and host memory.
                with st.host_span() if isinstance(st, CachedStore) else nullcontext():
                    st.end_step()
        return outs

    def _offsets(self, t: TableExec, lengths: torch.Tensor, ids: torch.Tensor
                 ) -> torch.Tensor:
        """Where each bag starts among the ids; a sequence table's ids are each their own
        bag of one (its lookup returns one vector per id, its row gradients one per id)."""
        if t.sequence:
            return torch.arange(ids.numel(), dtype=torch.int64, device=ids.device)
        return kernels.bag_offsets(lengths)

    def _rows(self, it: Item) -> int:
        """Vectors of an output all-to-all block: the layout's, or for a sequence table the
        ids of the owner's samples that the piece serves this step."""
        if self.lay.tables[it.piece.table].sequence:
            return self.seq_count[(it.piece.key, it.tag)]
        return it.rows

    def _update_piece(self, p: Piece, lookup: tuple[torch.Tensor, torch.Tensor],
                      grad: torch.Tensor, step: int) -> None:
        """One piece's backward: its row gradients, then its optimizer step; its temporaries
        are freed before the next piece's (the memory model counts one piece's at a time)."""
        local, offsets = lookup
        uniq, g = kernels.row_grads_bags(local, offsets, grad)
        with self._on_host(p):
            self.stores[p.key].update(uniq, self._updater(self.lay.tables[p.table], g, step))

    def _updater(self, t: TableExec, g: torch.Tensor, step: int
                 ) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        def fn(w: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return kernels.apply_optimizer(t.optimizer, self.optim, w, s, g, step + 1)
        return fn

    # -- input all-to-all ------------------------------------------------------------------

    def _input_a2a(self, batches: dict[int, tuple[np.ndarray, np.ndarray]], comm: Comm
                   ) -> "Routed":
        """Two all-to-alls on `comm`, as TorchRec's sparse-feature dist: first every piece's
        bag lengths (its table's bags per sending rank: sizes every rank knows from the
        layout), then the ids, whose sizes the receiver reads off the lengths it got. Writes
        nothing the step reads but its counters: the sequence tables' indices come back
        with the ids (a pipelined rank runs this beside the previous step)."""
        lay, me = self.lay, self.rank
        seq_count: dict[tuple[str, int], int] = {}
        seq_start: dict[tuple[str, int], int] = {}
        seq_pos: dict[str, torch.Tensor] = {}
        len_t, id_t = WIRE_INTS[lay.length_bytes], WIRE_INTS[lay.id_bytes]
        out_len: list[list[np.ndarray]] = [[] for _ in range(lay.world)]
        out_ids: list[list[np.ndarray]] = [[] for _ in range(lay.world)]
        mine: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        sample_of = {ti: np.repeat(np.arange(lengths.size), lengths) for ti, (lengths, _) in
                     batches.items()}
        for p in lay.sharded_pieces():
            t = lay.tables[p.table]
            lengths, ids = batches[t.index]
            if t.row_split:
                keep = (ids >= p.row0) & (ids < p.row0 + p.rows)
                lengths = np.bincount(sample_of[t.index][keep], minlength=t.bags)
                ids = ids[keep]
                if t.sequence:
                    seq_pos[p.key] = torch.from_numpy(np.flatnonzero(keep)).to(self.device)
            if t.sequence:
                seq_count[(p.key, me)] = int(ids.size)
            if p.rank == me:
                mine[p.key] = (lengths, ids)
                self.stats[p.key].own_ids += int(ids.size)
            else:
                out_len[p.rank].append(lengths.astype(len_t).view(np.uint8))
                out_ids[p.rank].append(ids.astype(id_t).view(np.uint8))

        def tensors(bufs: list[list[np.ndarray]]) -> list[torch.Tensor | None]:
            return [torch.from_numpy(np.concatenate(o)) if o else None for o in bufs]

        lbs = [lay.length_bytes * lay.tables[p.table].bags for p in self.pieces]
        got_len = comm.alltoall("input_lengths", tensors(out_len), [sum(lbs)] * lay.world)
        # Per source rank and piece of mine: the bag lengths and how many id bytes follow.
        received: list[list[tuple[np.ndarray, int]]] = [[] for _ in range(lay.world)]
        for src in range(lay.world):
            if src == me:
                continue
            raw = got_len[src].cpu().numpy()  # type: ignore[union-attr]  # src != me
            at = 0
            for p, lb in zip(self.pieces, lbs, strict=True):
                lengths = raw[at:at + lb].view(len_t).astype(np.int64)
                at += lb
                received[src].append((lengths, lay.id_bytes * int(lengths.sum())))
                self.stats[p.key].lengths_bytes += lb
                if lay.tables[p.table].sequence:
                    seq_count[(p.key, src)] = int(lengths.sum())
        for p in self.pieces:
            if lay.tables[p.table].sequence:
                at = 0
                for src in range(lay.world):
                    seq_start[(p.key, src)] = at
                    at += seq_count[(p.key, src)]
        got_ids = comm.alltoall("input_ids", tensors(out_ids),
                                [sum(n for _, n in r) for r in received])
        parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)
        for src in range(lay.world):
            if src == me:
                for p in self.pieces:
                    parts[p.key].append(mine[p.key])
                continue
            buf = got_ids[src].cpu().numpy()  # type: ignore[union-attr]  # src != me
            at = 0
            for p, (lengths, nbytes) in zip(self.pieces, received[src], strict=True):
                ids = buf[at:at + nbytes].copy().view(id_t).astype(np.int64)
                at += nbytes
                self.stats[p.key].ids_bytes += nbytes
                parts[p.key].append((lengths, ids))
        dev = self.device
        return Routed(
            {k: (torch.from_numpy(np.concatenate([x[0] for x in v])).to(dev, copy=True),
                 torch.from_numpy(np.concatenate([x[1] for x in v])).to(dev, copy=True))
             for k, v in parts.items()},
            (seq_count, seq_start, seq_pos))

    # -- output all-to-alls ----------------------------------------------------------------

    def _exchange(self, name: str, items: list[Item], payload: Callable[[Item], torch.Tensor],
                  precision: CommPrecision, backward: bool) -> dict[tuple[str, int], torch.Tensor]:
        """Send every item this rank sends (src, or dst when `backward`), receive the others,
        one all-to-all; returns the received blocks by (piece key, tag), dequantized."""
        me, w = self.rank, self.lay.world
        send: list[list[torch.Tensor]] = [[] for _ in range(w)]
        expect: list[list[Item]] = [[] for _ in range(w)]
        sizes = [0] * w
        for it in items:
            s, d = (it.dst, it.src) if backward else (it.src, it.dst)
            if s == me:
                buf = quant.encode(payload(it), precision)
                send[d].append(buf)
                if not backward:
                    self.stats[it.piece.key].out_fwd_bytes += int(buf.numel())
            if d == me:
                expect[s].append(it)
                sizes[s] += quant.wire_bytes(precision, self._rows(it), it.piece.cols)
        got = self.comm.alltoall(name, [torch.cat(x) if x else None for x in send], sizes)
        result = {}
        for s in range(w):
            at = 0
            for it in expect[s]:
                rows = self._rows(it)
                n = quant.wire_bytes(precision, rows, it.piece.cols)
                buf = got[s]
                assert buf is not None
                result[(it.piece.key, it.tag)] = quant.decode(buf[at:at + n], rows,
                                                              it.piece.cols, precision)
                if backward:
                    self.stats[it.piece.key].out_bwd_bytes += n
                at += n
        return result

    def _bags(self, p: Piece) -> int:
        return self.lay.tables[p.table].bags

    def _output_fwd(self, pooled: dict[str, torch.Tensor]) -> dict[int, torch.Tensor]:
        """This rank's pooled outputs per table, [bags, dim] (one row per bag: its samples
        of each feature, feature after feature)."""
        lay, me = self.lay, self.rank
        prec = lay.fwd_precision
        k_me, h_me = lay.local_of(me), lay.host_of(me)

        def first(it: Item) -> torch.Tensor:
            x = pooled[it.piece.key]
            if lay.tables[it.piece.table].sequence:
                return self._seq_block(it.piece, it.tag, x)
            b = self._bags(it.piece)
            if lay.tables[it.piece.table].host_reduced:
                return x[self.local_samples[b][it.tag]]
            return x[it.tag * b:(it.tag + 1) * b]

        def second(it: Item) -> torch.Tensor:
            b = self._bags(it.piece)
            return reduced[it.piece.key][it.tag * b:(it.tag + 1) * b]

        got1 = self._exchange("output_fwd", self.items1, first, prec, backward=False)
        reduced: dict[str, torch.Tensor] = {}
        for q in self.pieces:
            if lay.tables[q.table].host_reduced:
                idx = self.local_samples[self._bags(q)][k_me]
                reduced[q.key] = kernels.fold_sum([
                    pooled[p.key][idx] if p.rank == me
                    else got1[(p.key, k_me)] for p in self.chunk_of[q.key].pieces])
        got2 = self._exchange("output_fwd", self.items2, second, prec, backward=False)
        outs: dict[int, torch.Tensor] = {}
        for t in lay.tables:
            if t.data_parallel:
                outs[t.index] = pooled[f"dp{t.index}"]
                continue
            if t.sequence:
                outs[t.index] = self._seq_out(t, pooled, got1)
                continue
            b = t.bags
            out = torch.zeros((b, t.dim), dtype=torch.float32, device=self.device)
            for ch in t.chunks:
                if t.host_reduced:
                    q = next(p for p in ch.pieces if lay.local_of(p.rank) == k_me)
                    v = (reduced[q.key][h_me * b:(h_me + 1) * b] if q.rank == me
                         else got2[(q.key, h_me)])
                else:
                    v = kernels.fold_sum([
                        pooled[p.key][me * b:(me + 1) * b] if p.rank == me
                        else got1[(p.key, me)] for p in ch.pieces])
                out[:, ch.col0:ch.col0 + ch.cols] = v
            outs[t.index] = out
        return outs

    def _seq_block(self, p: Piece, owner: int, x: torch.Tensor) -> torch.Tensor:
        """A sequence piece's vectors for `owner`'s ids: its outputs are ordered by sending
        rank, each rank's ids in the order it sent them."""
        at = self.seq_start[(p.key, owner)]
        return x[at:at + self.seq_count[(p.key, owner)]]

    def _seq_out(self, t: TableExec, pooled: dict[str, torch.Tensor],
                 got: dict[tuple[str, int], torch.Tensor]) -> torch.Tensor:
        """This rank's outputs of a sequence table, one row per id it drew ([ids, dim], in
        draw order): each column band's vectors, a row-wise piece's at its ids' places."""
        me = self.rank
        out = torch.zeros((t.outputs, t.dim), dtype=torch.float32, device=self.device)
        for ch in t.chunks:
            for p in ch.pieces:
                v = (self._seq_block(p, me, pooled[p.key]) if p.rank == me
                     else got[(p.key, me)])
                if t.row_split:
                    out[self.seq_pos[p.key], ch.col0:ch.col0 + ch.cols] = v
                else:
                    out[:, ch.col0:ch.col0 + ch.cols] = v
        return out

    def _output_bwd(self, grads: dict[int, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The pooled gradients of all W x bags bags, [W x bags, cols], for every piece of
        this rank."""
        lay, me = self.lay, self.rank
        prec, g = lay.bwd_precision, lay.gpus_per_host
        k_me = lay.local_of(me)

        def cols_of(p: Piece, grad: torch.Tensor) -> torch.Tensor:
            t = lay.tables[p.table]
            if t.sequence and t.row_split:  # the gradients of the piece's own ids
                return grad[self.seq_pos[p.key], p.col0:p.col0 + p.cols]
            return grad[:, p.col0:p.col0 + p.cols]

        got2 = self._exchange("output_bwd", self.items2,
                              lambda it: cols_of(it.piece, grads[it.piece.table]), prec,
                              backward=True)
        gathered: dict[str, torch.Tensor] = {}
        for q in self.pieces:
            if lay.tables[q.table].host_reduced:
                gathered[q.key] = torch.cat([
                    cols_of(q, grads[q.table]) if h * g + k_me == me else got2[(q.key, h)]
                    for h in range(lay.hosts)])

        def first(it: Item) -> torch.Tensor:
            if lay.tables[it.piece.table].host_reduced:
                return gathered[self._piece_on(it.piece, me).key]
            return cols_of(it.piece, grads[it.piece.table])

        got1 = self._exchange("output_bwd", self.items1, first, prec, backward=True)
        full: dict[str, torch.Tensor] = {}
        for p in self.pieces:
            t = lay.tables[p.table]
            if t.host_reduced:
                x = torch.empty((t.bags * lay.world, p.cols), dtype=torch.float32,
                                device=self.device)
                for k in range(g):
                    q = p.host * g + k
                    x[self.local_samples[t.bags][k]] = (gathered[p.key] if q == me
                                                        else got1[(p.key, k)])
                full[p.key] = x
            else:
                full[p.key] = torch.cat([cols_of(p, grads[t.index]) if o == me
                                         else got1[(p.key, o)] for o in range(lay.world)])
        return full

    # -- what the rank reports -------------------------------------------------------------

    def reset_counters(self) -> None:
        self.mem.start_measuring()
        self.comm.reset()
        if self.lane is not None:
            self.lane.reset()
        self.stats.clear()
        self.seconds.clear()
        self.timer.reset()
        for st in [*self.stores.values(), *self.replicas.values()]:
            st.hits = st.lookups = 0

    def start_timing(self) -> None:
        """The timed steps begin: the memory probe is stopped (MemProbe.finish), the timings
        so far are dropped. Byte and cache counters keep the measured steps' figures."""
        self.seconds.clear()
        self.timer.reset()
        self.comm.settle = False
        if self.lane is not None:
            self.lane.timer.reset()
            self.lane.seconds.clear()
            self.lane.comm.settle = False

    def dump(self) -> dict[str, torch.Tensor]:
        out = {}
        for p in self.pieces:
            w, s = self.stores[p.key].dump()
            out[f"w{p.key}"], out[f"s{p.key}"] = w, s
        for ti, rep in self.replicas.items():
            w, s = rep.dump()
            out[f"wdp{ti}"], out[f"sdp{ti}"] = w, s
        return out


def _ballast(fault: str | None, rank: int) -> int:
    """Bytes the fault hook "alloc:RANK:BYTES" has `rank` allocate in each measured lookup."""
    if not fault or not fault.startswith("alloc:"):
        return 0
    _, r, n = fault.split(":")
    return int(n) if int(r) == rank else 0
