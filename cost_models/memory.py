"""Bytes a piece holds in each memory tier.

hbm: weights and optimizer state in HBM.
hbm_cache: an HBM cache of `cache_ratio` of the rows (weights and slot metadata) in front of
    the whole table and its optimizer state in host DDR.
ddr: weights and state in host DDR, read over PCIe.
ssd: weights and state on the host SSD behind a DDR cache of `cache_ratio` of the rows.
Data-parallel replicas live in HBM on every GPU.
A cache's eviction policy keeps one int64 per row of the piece in host DDR (LFU's access
count, LRU's last-use stamp; planner/executor/store.py).

Besides what a piece holds, a training step needs buffers (StepBuffers): counted per piece and
per sample owner from the executor's own tensors (planner/executor/rank.py, kernels.py), as a
bound on the step's peak over its phases (see StepBuffers).
"""

import functools
import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from cost_models import portable_math as pm
from cost_models.access import AccessModel, ZipfAccess, generalized_harmonic, zipf_powers
from cost_models.geometry import ModelGeom, TableGeom, cache_rows
from cost_models.hardware import HardwareProfile
from cost_models.sizes import comm_row_bytes, optimizer_state_row_bytes, weight_row_bytes
from cost_models.types import CommPrecision, Optimizer, ShardingType, Tier

# A cached piece's eviction-policy state: one int64 per row, in host memory.
POLICY_STATE_BYTES_PER_ROW = 8


@dataclass(frozen=True)
class MemoryFootprint:
    """Bytes per tier. HBM counts against the piece's GPU, DDR and SSD against its host."""

    hbm: int = 0
    ddr: int = 0
    ssd: int = 0

    def __add__(self, other: "MemoryFootprint") -> "MemoryFootprint":
        return MemoryFootprint(self.hbm + other.hbm, self.ddr + other.ddr, self.ssd + other.ssd)


def piece_memory(
    table: TableGeom,
    tier: Tier,
    cache_ratio: float,
    piece_rows: int,
    piece_cols: int,
    hw: HardwareProfile,
) -> MemoryFootprint:
    w_row = weight_row_bytes(table.data_type, piece_cols)
    s_row = optimizer_state_row_bytes(table.optimizer, piece_cols)
    full = piece_rows * (w_row + s_row)
    meta = hw.constants.cache_metadata_bytes_per_row
    policy = piece_rows * POLICY_STATE_BYTES_PER_ROW
    if tier is Tier.HBM:
        return MemoryFootprint(hbm=full)
    if tier is Tier.HBM_CACHE:
        slots = cache_rows(cache_ratio, piece_rows)
        return MemoryFootprint(hbm=slots * (w_row + meta), ddr=full + policy)
    if tier is Tier.DDR:
        return MemoryFootprint(ddr=full)
    slots = cache_rows(cache_ratio, piece_rows)
    return MemoryFootprint(ddr=slots * (w_row + s_row + meta) + policy, ssd=full)


# Ids, bag lengths and bag offsets live on the device as int64, as FBGEMM's table-batched
# embedding takes them (and the executor keeps them), whatever width they cross the wire at.
DEVICE_INDEX_BYTES = 8
# Pooled vectors, their gradients and the optimizer's arithmetic are fp32 on the device.
POOLED_BYTES = 4
# The backward's row gradients (kernels.row_grads_bags), arrays alive at its peak, measured by
# the allocator over its ids n, unique rows u and bags B (torch.unique's inverse and its own
# sort, the bags' sample of each id, the stable sort's order, the samples in that order):
# per allocator: 5 on CPU, 9.03 on CUDA (an H200, least squares over 144 points of
# benchmarks/gpu_workspace.py: unique's and sort's radix-sort buffers); the executor's
# prediction of a run's peak (one piece's workspace at a time) counts its device's. "plan":
# the plan's per-GPU figure, which sums every piece's workspace as if all were alive at once.
# There 5 per id: the sum covers CUDA's 9 on any GPU of two or more comparable pieces, and
# counting 9 in the sum made synthetic_10000 on 1,024 GPUs "infeasible" (its certificate
# 5.4% short), where one piece's workspace at a time fits (measured, 82ced5c). A GPU of one
# piece can be short by 32 B per id of that piece: not bounded yet.
GRAD_ARRAYS_PER_ID = {"cuda": 9, "cpu": 5, "plan": 5}
Allocator = Literal["cuda", "cpu", "plan"]
# unique rows, their counts, starts, and the prefix sum making the starts:
GRAD_ARRAYS_PER_ROW = 4
# bag lengths (diff), the appended end, the bags' arange:
GRAD_ARRAYS_PER_BAG = 3
# The optimizer step (kernels.apply_optimizer) on u rows of c fp32 columns: [u, c] arrays
# alive at its peak beside its inputs, the new weights and state included (SGD: lr*g and the
# result; row-wise Adagrad: the quotient and the result, plus two [u, 1]; Adagrad: new state,
# lr*g, sqrt+eps, the quotient; Adam: m, v, the bias-corrected pair, sqrt+eps, quotient and
# result, then [m, v] concatenated).
OPTIMIZER_TEMP_ARRAYS = {Optimizer.SGD: 2, Optimizer.ROWWISE_ADAGRAD: 2, Optimizer.ADAGRAD: 4,
                         Optimizer.ADAM: 7}
OPTIMIZER_TEMP_ROW_SCALARS = {Optimizer.ROWWISE_ADAGRAD: 2}
# A cached piece's optimizer step also holds, per updated row, its cache slot (int64, found by
# searching the held keys) and whether it was a hit (a bool): CachedStore.update. (Measured:
# deeprecsys_rm1 in hbm_cache on one GPU went 63,293 B over the model without them, on CPU
# and on an H200 alike; the gap is smaller than the 9 B per row since u is a bound.) An ssd
# piece's keys live in host memory, so on a GPU 8 of its 9 B are the host's: counted in its
# HBM all the same, a bound on the safe side.
CACHED_UPDATE_ROW_BYTES = DEVICE_INDEX_BYTES + 1
# A cache's re-admission after the step (planner/executor/store.py, CachedStore.end_step), in
# int64 arrays alive at its peak: per slot (the held keys and slots, the candidates' share of
# them, torch.isin's concatenations and sorts of held against candidates and kept, the kept
# rows' sort, the new key and slot arrays), per id looked up (their concatenation with the
# held rows and torch.unique's sort of it) and per distinct id (the candidates, their scores,
# keys and stable descending sort). Fitted as bounds on the store alone, full caches, LFU and
# LRU, 100-2603 ... 5000 slots, 100-20,000 ids: measured within 82-100% of 16/4/4 where slots
# dominate.
CACHE_ADMISSION_PER_SLOT = 16
CACHE_ADMISSION_PER_ID = 4
CACHE_ADMISSION_PER_DISTINCT = 4
# A row-split piece's id count is random; its buffers are sized for the hottest rows it could
# hold plus this many standard deviations, so a measured peak stays under the model's.
ID_COUNT_SIGMAS = 6.0


@dataclass(frozen=True)
class StepBuffers:
    """Bytes a step needs in HBM besides weights, optimizer state and caches, by term:
    - ids: ids, bag lengths and bag offsets (int64 on the device), held all step;
    - pooled: pooled vectors (or row-split partial sums), fp32, held all step;
    - grads: their gradients, fp32, from the loss (owner) or the backward all-to-all
      (pieces) to the step's end;
    - dense: the dense part's stand-in for the pooled vectors' consumer (the executor's
      previous step's outputs, which the caller holds while the next step runs), fp32;
    - dense_grad: a data-parallel replica's dense gradient, from the all-reduce on;
    - blocks_, send_, recv_, decoded_, kept_ fwd and bwd: the output all-to-all's staging
      (_staging): a sender's encoded blocks, the bytes it sends (held twice inside the
      collective: the concatenation per destination and the send buffer), the bytes a
      receiver gets, its decoded (or realigned) copies, and what it keeps after the
      exchange; pieces send forward and receive backward, sample owners the other way round;
    - workspace: the backward's transient arrays for one piece (its row gradients, then its
      optimizer step; a replica's ring all-reduce), alive only while that piece updates.
    `step_peak` takes a GPU's peak over the step's phases from these. Each piece's `total`
    adds its largest transient (an exchange's staging, or its workspace) to what it holds,
    so a GPU's sum of `total`s (the planner's figure) bounds that peak."""

    ids: int = 0
    pooled: int = 0
    grads: int = 0
    dense: int = 0
    dense_grad: int = 0
    blocks_fwd: int = 0
    send_fwd: int = 0
    recv_fwd: int = 0
    decoded_fwd: int = 0
    kept_fwd: int = 0
    blocks_bwd: int = 0
    send_bwd: int = 0
    recv_bwd: int = 0
    decoded_bwd: int = 0
    kept_bwd: int = 0
    workspace: int = 0

    @property
    def held(self) -> int:
        """Bytes alive from their phase to the step's end."""
        return self.ids + self.pooled + self.grads + self.dense + self.dense_grad

    def exchange(self, fwd: bool) -> int:
        """Staging at its largest in one direction's all-to-all: inside the collective (the
        blocks, the send side twice, the receive buffer), or while decoding after it."""
        blocks, send, recv, decoded = (
            (self.blocks_fwd, self.send_fwd, self.recv_fwd, self.decoded_fwd) if fwd else
            (self.blocks_bwd, self.send_bwd, self.recv_bwd, self.decoded_bwd))
        return blocks + recv + max(2 * send, decoded)

    @property
    def transient(self) -> int:
        return max(self.exchange(True), self.kept_fwd, self.exchange(False), self.kept_bwd,
                   self.workspace)

    @property
    def total(self) -> int:
        return self.held + self.transient

    def with_workspace(self, workspace: int) -> "StepBuffers":
        """These buffers with another workspace (dataclasses.replace, without its cost: the
        planner asks once per cached piece shape and cache ratio)."""
        return StepBuffers(
            self.ids, self.pooled, self.grads, self.dense, self.dense_grad, self.blocks_fwd,
            self.send_fwd, self.recv_fwd, self.decoded_fwd, self.kept_fwd, self.blocks_bwd,
            self.send_bwd, self.recv_bwd, self.decoded_bwd, self.kept_bwd, workspace)

    def __add__(self, other: "StepBuffers") -> "StepBuffers":
        # Term by term; a sum's `transient` is not the sum of transients (see step_peak).
        o = other
        return StepBuffers(
            self.ids + o.ids, self.pooled + o.pooled, self.grads + o.grads, self.dense + o.dense,
            self.dense_grad + o.dense_grad, self.blocks_fwd + o.blocks_fwd,
            self.send_fwd + o.send_fwd, self.recv_fwd + o.recv_fwd,
            self.decoded_fwd + o.decoded_fwd, self.kept_fwd + o.kept_fwd,
            self.blocks_bwd + o.blocks_bwd, self.send_bwd + o.send_bwd,
            self.recv_bwd + o.recv_bwd, self.decoded_bwd + o.decoded_bwd,
            self.kept_bwd + o.kept_bwd, self.workspace + o.workspace)


def _send_side(rows: int, cols: int, precision: CommPrecision) -> tuple[int, int]:
    """(blocks, send) bytes of a sender of `rows` vectors (see _staging)."""
    wire = rows * comm_row_bytes(precision, cols)
    return (wire if precision is not CommPrecision.FP32 else 0), wire


def _receive_side(rows: int, cols: int, precision: CommPrecision, block: int
                  ) -> tuple[int, int, int]:
    """(recv, decoded, kept) bytes of a receiver of `rows` vectors (see _staging)."""
    row = comm_row_bytes(precision, cols)
    wire = rows * row
    quantized = precision is not CommPrecision.FP32
    realign = wire if (block * row) % 8 else 0
    decoded = realign + (rows * cols * POOLED_BYTES if quantized else 0)
    kept = rows * cols * POOLED_BYTES if quantized else (realign or wire)
    return wire, decoded, kept


def _staging(rows: int, cols: int, precision: CommPrecision, block: int, send: bool,
             fwd: bool) -> StepBuffers:
    """One side of an all-to-all of `rows` vectors of `cols` columns (those that cross the
    wire) in blocks of `block` vectors. A sender encodes each block (at fp32, a view of the
    vectors; below, a new buffer), concatenates its blocks per destination, then into the
    send buffer. A receiver gets the buffer, then decodes each block: below fp32 an fp32
    copy, at fp32 a view (of a realigned copy where a block's bytes are not a multiple of 8:
    a dtype view needs an aligned start), and keeps what it decoded."""
    if send:
        blocks, wire = _send_side(rows, cols, precision)
        return (StepBuffers(blocks_fwd=blocks, send_fwd=wire) if fwd else
                StepBuffers(blocks_bwd=blocks, send_bwd=wire))
    wire, decoded, kept = _receive_side(rows, cols, precision, block)
    return (StepBuffers(recv_fwd=wire, decoded_fwd=decoded, kept_fwd=kept) if fwd else
            StepBuffers(recv_bwd=wire, decoded_bwd=decoded, kept_bwd=kept))


def bags_per_gpu(table: TableGeom, batch: int) -> int:
    """Bags a GPU's `batch` samples make in a table per step: one per feature and sample of
    that feature (sum_f b_f; `batch` for a table read by one feature). Each bag has its
    length and offset, its pooled vector and that vector's gradient."""
    return round(batch * table.bags)


def outputs_per_gpu(table: TableGeom, batch: int) -> int:
    """Output vectors a GPU's `batch` samples get from a table per step: one per bag
    (bags_per_gpu), or for a sequence table one per id (round(batch * pooling), the ids a
    rank draws)."""
    return round(batch * table.pooling) if table.sequence else bags_per_gpu(table, batch)


def _id_bound(table: TableGeom, batch: int, ranks: int, piece_rows: int) -> int:
    """Ids a piece of `piece_rows` rows receives per step from `ranks` ranks of `batch`
    samples each, at most (with high probability): the share of the hottest `piece_rows`
    rows (the largest share any row range can draw) plus ID_COUNT_SIGMAS binomial
    deviations. Each rank sends round(batch * pooling) ids of a table per step."""
    total = ranks * round(batch * table.pooling)
    if piece_rows >= table.rows:
        return total
    mean = total * table.access.hit_rate(piece_rows, table.rows)
    return min(total, math.ceil(mean + ID_COUNT_SIGMAS * math.sqrt(max(mean, 1.0))) + 1)


# Log-spaced row buckets over which distinct_rows_bound spreads a table's access curve.
_DISTINCT_BUCKETS = 64
_BUCKET_EXPONENTS = np.arange(_DISTINCT_BUCKETS + 1) / _DISTINCT_BUCKETS


def _shares(access: AccessModel, edges: list[int], rows: int) -> list[float]:
    """The access curve at each edge (ascending row counts), as access.hit_rate(k, rows)
    gives it; for a zipf curve all edges at once: the first _EM_HEAD terms summed exactly,
    beyond them the Euler-Maclaurin form access.py uses past its exact limit (relative error
    under 1e-12). 64 exact sums of up to 100,000 terms per table made candidates_for 4x
    slower."""
    if not isinstance(access, ZipfAccess):
        return [access.hit_rate(k, rows) for k in edges]
    a = access.alpha
    ks = np.asarray(edges, dtype=np.float64)
    head_n = int(min(edges[-1], _EM_HEAD))
    prefix = np.cumsum(zipf_powers(a)[:head_n])
    h = np.zeros(len(ks))
    small = ks <= head_n
    h[small] = prefix[ks[small].astype(np.int64) - 1]
    big = ~small
    if big.any():
        m, n = float(_EM_HEAD), ks[big]
        # n**-a once (portable_math: the same bits on every machine); n**(1-a) and
        # n**(-a-1) from it.
        n_a = pm.power(n, -a)
        m_a = pm.fpow(m, -a)
        integral = pm.log(n / m) if math.isclose(a, 1.0) else (n_a * n - m_a * m) / (1 - a)
        h[big] = (prefix[-1] - m_a + integral + (m_a + n_a) / 2
                  + a * (m_a / m - n_a / n) / 12)
    total = generalized_harmonic(rows, a)
    return np.clip(h / total, 0.0, 1.0).tolist()


_EM_HEAD = 1_000


# Called once per piece shape and tier with the same arguments (TableGeom is frozen).
@functools.lru_cache(maxsize=1 << 16)
def distinct_rows_bound(table: TableGeom, n_ids: int) -> int:
    """Distinct rows among `n_ids` ids drawn from the table's access curve, at most (with
    high probability): E[distinct] = sum over rows of 1 - (1 - p_row)^n, computed over
    log-spaced buckets of rows by popularity with each bucket's mean p (1 - (1 - p)^n is
    concave in p, so the mean over-counts), plus ID_COUNT_SIGMAS standard deviations (a sum
    of negatively correlated indicators: variance at most its mean)."""
    rows = table.rows
    if n_ids <= 0 or rows <= 0:
        return 0
    width, log_miss = _bucket_rates(table.access, rows)
    # Each of `width` rows is missed by all n ids with probability (1 - p)^n (p = 1: log1p
    # gives -inf, so the row is touched surely).
    expected = float(np.sum(width * -pm.expm1(n_ids * log_miss)))
    bound = math.ceil(expected + ID_COUNT_SIGMAS * math.sqrt(max(expected, 1.0)))
    return min(rows, n_ids, bound)


# A table is bounded for two id counts (its replica's and its sharded pieces'): the buckets
# and their mean rates' log1p(-p), which do not depend on the ids, are made once.
@functools.lru_cache(maxsize=1 << 12)
def _bucket_rates(access: AccessModel, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of each of distinct_rows_bound's buckets and log(1 - p) of its mean per-row
    probability p, as read-only arrays."""
    # rows ** (i / _DISTINCT_BUCKETS) rounded half to even, at most rows, with 0 and rows.
    powers = np.minimum(rows, np.round(pm.power(float(rows), _BUCKET_EXPONENTS)))
    edges = np.unique(np.concatenate([[0, rows], powers.astype(np.int64)]))
    shares = np.array([0.0, *_shares(access, edges[1:].tolist(), rows)])
    width = np.diff(edges)
    rate = np.minimum(np.maximum(np.diff(shares), 0.0) / width, 1.0)
    width = width.astype(np.float64)
    log_miss = pm.log1p(-rate)
    width.flags.writeable = False
    log_miss.flags.writeable = False
    return width, log_miss


def backward_workspace(optimizer: Optimizer, n_ids: int, bags: int, rows: int,
                       updated_rows: int, cols: int, touched: int | None = None,
                       allocator: Allocator = "plan", cached: bool = False) -> int:
    """A piece's backward transient: the row gradients of `n_ids` ids in `bags` bags over a
    piece of `rows` rows, then the optimizer step over `updated_rows` rows: whichever is
    larger. The gradient [u, cols] of the u touched rows (at most min(rows, ids), or
    `touched`) lives through both. `allocator`: whose arrays (GRAD_ARRAYS_PER_ID); `cached`:
    a cached piece's step (CACHED_UPDATE_ROW_BYTES)."""
    u = min(rows, n_ids, n_ids if touched is None else touched)
    g = u * cols * POOLED_BYTES
    grad = (GRAD_ARRAYS_PER_ID[allocator] * n_ids + GRAD_ARRAYS_PER_ROW * u
            + GRAD_ARRAYS_PER_BAG * bags) * DEVICE_INDEX_BYTES + g
    state = optimizer_state_row_bytes(optimizer, cols)
    v = updated_rows
    update = (v * DEVICE_INDEX_BYTES  # the rows updated
              + (g if v == u else v * cols * POOLED_BYTES + g)  # their gradient (dense: new)
              + v * (cols * POOLED_BYTES + state)  # their weights (widened) and state
              + (OPTIMIZER_TEMP_ARRAYS[optimizer] * cols
                 + OPTIMIZER_TEMP_ROW_SCALARS.get(optimizer, 0)) * v * POOLED_BYTES
              + (v * CACHED_UPDATE_ROW_BYTES if cached else 0))
    return max(grad, update)


def piece_buffers(table: TableGeom, data_parallel: bool, piece_rows: int, piece_cols: int,
                  world: int, model: ModelGeom, host_samples: int = 0,
                  cache_slots: int = 0, allocator: Allocator = "plan") -> StepBuffers:
    """A piece's own step buffers. A sharded piece serves all b*W samples: the ids it
    receives with their lengths and offsets, its pooled vectors and their gradients, its
    side of the output all-to-all, and its backward. A data-parallel replica's ids and
    vectors are its own samples', counted with the sample owner's (owner_buffers); the
    replica adds its dense gradient, the ring's staging, and its backward, which updates
    every row. `host_samples`: a table-row-wise or grid piece's hosts x b samples, whose
    gradients it gathers from its host's peers (a second gradient array beside the B
    samples'). `cache_slots`: a cached piece's slots, whose re-admission after the step is
    one more backward transient."""
    if data_parallel:
        b = model.batch_per_gpu
        n_local = round(b * table.pooling)
        # A sequence replica's backward has one "bag" per id (each id its own output).
        nb = n_local if table.sequence else bags_per_gpu(table, b)
        # The ring sends and receives one chunk of rows per hop.
        chunk = -(-piece_rows // world)
        hop = (_staging(chunk, piece_cols, model.bwd_precision, chunk, True, False)
               + _staging(chunk, piece_cols, model.bwd_precision, chunk, False, False))
        ring = hop.exchange(False)
        return StepBuffers(
            dense_grad=piece_rows * piece_cols * POOLED_BYTES,
            workspace=max(ring, backward_workspace(
                table.optimizer, n_local, nb, piece_rows, piece_rows, piece_cols,
                distinct_rows_bound(table, n_local), allocator)))
    cached = cache_slots > 0
    base, n_ids, u = (_sequence_piece_buffers(table, piece_rows, piece_cols, world, model,
                                              allocator, cached)
                      if table.sequence else
                      _sharded_piece_buffers(table, piece_rows, piece_cols, world, model,
                                             host_samples, allocator, cached))
    if model.pipelined:
        # The next batch's ids arrive while this one runs (its input all-to-all runs beside
        # this step's work), and are held to its own step: ids, lengths, offsets twice.
        base = replace(base, ids=2 * base.ids)
    if not cache_slots:
        return base
    # The re-admission is one more backward transient, beside the backward's workspace.
    return base.with_workspace(max(base.workspace, _cache_admission(cache_slots, n_ids, u)))


# A piece shape is costed for each cache ratio of its tiers: what the slots do not change
# (all but the re-admission) is counted once per shape.
@functools.lru_cache(maxsize=1 << 14)
def _sharded_piece_buffers(table: TableGeom, piece_rows: int, piece_cols: int, world: int,
                           model: ModelGeom, host_samples: int, allocator: Allocator,
                           cached: bool = False) -> tuple[StepBuffers, int, int]:
    """A pooled table's sharded piece, its cache's re-admission aside: its buffers, the ids
    it receives (at most) and the distinct rows it updates (at most)."""
    b = model.batch_per_gpu
    nb = bags_per_gpu(table, b)
    # Per bag, not per sample: each of a table's features is its own pooled vector.
    bags = nb * world
    pooled = bags * piece_cols * POOLED_BYTES
    # Its own rank's nb vectors do not cross the wire (host-reduced pieces: (g - 1) x hosts
    # x nb in the host stage plus (hosts - 1) x nb across hosts, the same W - 1 blocks).
    # (As _staging's sender forward plus receiver backward, built as one StepBuffers.)
    blocks, send = _send_side(bags - nb, piece_cols, model.fwd_precision)
    recv, decoded, kept = _receive_side(bags - nb, piece_cols, model.bwd_precision, nb)
    n_ids = _id_bound(table, b, world, piece_rows)
    ids = (n_ids + 2 * bags) * DEVICE_INDEX_BYTES
    # The piece's distinct rows are at most the whole table's under all the step's ids.
    u = min(piece_rows, n_ids, distinct_rows_bound(table, world * round(b * table.pooling)))
    return StepBuffers(
        ids, pooled, pooled + host_samples * piece_cols * POOLED_BYTES, 0, 0, blocks, send,
        0, 0, 0, 0, 0, recv, decoded, kept,
        backward_workspace(table.optimizer, n_ids, bags, piece_rows, u, piece_cols, u,
                           allocator, cached)
    ), n_ids, u


def _cache_admission(cache_slots: int, n_ids: int, u: int) -> int:
    return ((CACHE_ADMISSION_PER_SLOT * cache_slots + CACHE_ADMISSION_PER_ID * n_ids
             + CACHE_ADMISSION_PER_DISTINCT * u) * DEVICE_INDEX_BYTES if cache_slots else 0)


@functools.lru_cache(maxsize=1 << 14)
def _sequence_piece_buffers(table: TableGeom, piece_rows: int, piece_cols: int, world: int,
                            model: ModelGeom, allocator: Allocator, cached: bool = False
                            ) -> tuple[StepBuffers, int, int]:
    """A sharded piece of a sequence table (unpooled): one output vector per id it receives
    (n, all ids of the table for a table- or column-wise piece, at most _id_bound's for a
    row-wise one), and their gradients. Held: the ids, each bag's length (bags per rank x W),
    one offset per id (every id is its own bag of one in the lookup and the row gradients),
    plus per-bag offsets' room; the n vectors and their n gradients. Staging: the vectors of
    other ranks' ids (n less the own rank's round(b * pooling) for table-/column-wise pieces;
    all n for a row-wise piece, whose own share varies), in blocks of varying size (aligned
    as blocks of one vector, the worst case)."""
    b = model.batch_per_gpu
    nb = bags_per_gpu(table, b)
    n_ids = _id_bound(table, b, world, piece_rows)
    own = round(b * table.pooling) if piece_rows >= table.rows else 0
    vectors = n_ids * piece_cols * POOLED_BYTES
    staging = (_staging(n_ids - own, piece_cols, model.fwd_precision, 1, True, True)
               + _staging(n_ids - own, piece_cols, model.bwd_precision, 1, False, False))
    u = min(piece_rows, n_ids, distinct_rows_bound(table, world * round(b * table.pooling)))
    return staging + StepBuffers(
        ids=(2 * n_ids + 2 * nb * world) * DEVICE_INDEX_BYTES, pooled=vectors, grads=vectors,
        workspace=backward_workspace(table.optimizer, n_ids, n_ids, piece_rows, u,
                                     piece_cols, u, allocator, cached)), n_ids, u


def placed_piece_buffers(table: TableGeom, kind: ShardingType, tier: Tier, cache_ratio: float,
                         piece_rows: int, piece_cols: int, hw: HardwareProfile,
                         model: ModelGeom, allocator: Allocator = "plan") -> StepBuffers:
    """piece_buffers with what the piece's sharding and tier add: a table-row-wise or grid
    piece gathers the hosts x b samples' gradients of its host stage (hosts x nb bags'), a
    cached piece
    re-admits its slots after the step. The planner, the plan's per-GPU figures, the checker
    and the executor's prediction all count a piece's buffers through this."""
    host_reduced = kind in (ShardingType.TABLE_ROW_WISE, ShardingType.GRID)
    cached = tier in (Tier.HBM_CACHE, Tier.SSD)
    return piece_buffers(table, kind is ShardingType.DATA_PARALLEL, piece_rows, piece_cols,
                         hw.world_size, model,
                         hw.hosts * bags_per_gpu(table, model.batch_per_gpu)
                         if host_reduced else 0,
                         cache_rows(cache_ratio, piece_rows) if cached else 0, allocator)

def owner_buffers(tables: list[TableGeom], model: ModelGeom,
                  data_parallel: list[bool] | None = None,
                  remote_cols: list[int] | None = None,
                  sliced_cols: list[int] | None = None) -> StepBuffers:
    """Every GPU's buffers as the owner of its b samples, per table: its pooled vectors (as
    received, fp32), their gradients and the dense part's stand-in, held; its ids, lengths
    and offsets, held by a data-parallel table (looked up here all step); its side of the
    output all-to-all, staging: b vectors of `remote_cols` columns (per table: the columns of
    its pieces on other GPUs, one block per piece; None: the table's dim once); of them
    `sliced_cols` (per table: those of pieces narrower than the table), whose gradients
    leave as a column slice of the owner's, copied to be contiguous before they are encoded
    (at fp32 the copy is the block sent: 5% over the model on a plan with two column chunks
    on one GPU, measured by the executor's allocator). A sharded
    table's ids leave in the input all-to-all, before any pooled vector exists: a phase below
    the others. `data_parallel` None: every table's ids held, which no placement exceeds."""
    b = model.batch_per_gpu
    ids = pooled = 0
    staging = StepBuffers()
    for i, t in enumerate(tables):
        nb = bags_per_gpu(t, b)  # one length and offset per bag
        no = outputs_per_gpu(t, b)  # one vector (and its gradient) per output
        n_ids = round(b * t.pooling)
        pooled += no * t.dim * POOLED_BYTES
        if data_parallel is None or data_parallel[i]:
            # A sequence replica also holds one offset per id (each id its own bag).
            ids += (n_ids * (2 if t.sequence else 1) + 2 * nb) * DEVICE_INDEX_BYTES
            if data_parallel is not None:
                continue
        if t.sequence:
            # Where each piece's vectors go among the owner's ids (a row-wise piece's are
            # a subset), held from the forward's assembly to the backward's gather.
            ids += n_ids * DEVICE_INDEX_BYTES
        cols = t.dim if remote_cols is None else remote_cols[i]
        if cols:
            # A sequence table's blocks vary in size (row-wise): aligned as blocks of one.
            block = 1 if t.sequence else no
            staging = (staging + _staging(no, cols, model.fwd_precision, block, False, True)
                       + _staging(no, cols, model.bwd_precision, block, True, False))
            sliced = sliced_cols[i] if sliced_cols is not None else 0
            if sliced and model.bwd_precision is CommPrecision.FP32:
                staging = staging + StepBuffers(blocks_bwd=no * sliced * POOLED_BYTES)
    return staging + StepBuffers(ids=ids, pooled=pooled, grads=pooled, dense=pooled)


def host_reduce_index_bytes(hosts: int, gpus_per_host: int, batch: int) -> int:
    """Held by every GPU of a plan with table-row-wise or grid tables: for each local index,
    the samples of that index's ranks host by host (int64), which the host stage reduces."""
    return gpus_per_host * hosts * batch * DEVICE_INDEX_BYTES


def step_peak(pieces: list[StepBuffers], owner: StepBuffers) -> int:
    """A GPU's step buffers at the step's peak over its phases (StepBuffers): what is held,
    plus in each phase its own staging, the largest of
    - the forward all-to-all (before any gradient): every piece's send side and the owner's
      receive side, then what the owner keeps;
    - the backward all-to-all (the owner's gradients made, the pieces' not yet): the owner's
      send side and every piece's receive side, then what the pieces keep (their gradients
      are made from it);
    - the backward: one piece's workspace at a time.
    At most the planner's sum of `total`s."""
    s = sum(pieces, owner)
    early = s.held - s.grads - s.dense_grad  # before the loss
    before_bwd = s.held - sum(p.grads for p in pieces) - s.dense_grad
    return max(early + s.exchange(True), early + s.kept_fwd,
               before_bwd + s.exchange(False), s.held - s.dense_grad + s.kept_bwd,
               s.held + max((p.workspace for p in pieces), default=0))
