"""The unsharded reference: every table whole, in one process, in float64, no communication,
and none of the ranks' arithmetic: this module does not import kernels.py, quant.py, rank.py,
store.py or stored.py. It uses torch's own operators only:

- lookup and sum pooling: `torch.nn.functional.embedding_bag(mode="sum")` on the whole table;
  a sequence table's (pooling_mode "none") lookup: `torch.nn.functional.embedding`, one
  vector per id;
- gradients: autograd through that call, of the loss 0.5 * |pooled - target|^2 summed over
  every sample of every rank;
- updates: `torch.optim.SGD`, `torch.optim.Adagrad` and `torch.optim.Adam`. Sharded tables
  are updated lazily, only the rows a step looks up (as FBGEMM's fused optimizers do): for
  Adam, torch.optim.Adam runs on those rows with their moments loaded into its state and the
  step count of the run (torch's SparseAdam would put epsilon elsewhere: eps * sqrt(1 -
  beta2^t)). Data-parallel tables are dense parameters under a dense optimizer, as TorchRec
  replicates them. Row-wise Adagrad, which torch lacks, is written here once from FBGEMM's
  definition: per row of each column shard, state += mean over the shard's columns of g^2,
  then w -= lr * g / (sqrt(state) + eps).

What follows the plan is the model's semantics, not its transport: the storage dtype (weights
stored as fp16/bf16 are rounded to it after every update, as the ranks store them; int8
weights are quantized per row of every column chunk, at the start and after every update of
the rows it updated, written here apart from the ranks' code from FBGEMM's definition, in
float64: see _int8) and the
column shards of row-wise Adagrad (one accumulator per row of each shard, as FBGEMM and
TorchRec keep it). The per-piece partial sums of row-split tables are returned for step 0 only
as magnitudes: the executor's tolerance for quantized communication scales with them.
"""

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from cost_models.types import DataType, Optimizer
from planner.executor import synthetic
from planner.executor.layout import ExecLayout, TableExec

_STORAGE = {DataType.FP32: torch.float32, DataType.FP16: torch.float16,
            DataType.BF16: torch.bfloat16, DataType.INT8: torch.float64}  # int8: see _int8
BETAS = (0.9, 0.999)
# int8 rows, FBGEMM's definition (its training TBE, deterministic rounding): per row of a
# column chunk, scale = (max - min) / 255, bias = min, code = round((x - bias) * 255 /
# (scale * 255 + 1e-8)) to nearest (ties to even, as lrintf) in [0, 255], value = code *
# scale + bias.
_QPARAM_EPS = 1e-8
# The ranks compute the code's argument t in fp32 from the same fp32 initial weights: at most
# 7 roundings (x - bias, max - min, / 255, * 255, + eps, 255 / ., the product), each within
# 2^-24 of t <= 255: |t_fp32 - t| < 8 * 2^-24 * 256 = 2^-13. Where t lies that close to a
# rounding boundary the two sides may pick adjacent codes: such an element is "ambiguous".
INT8_CODE_EPS = 2.0**-13
# Their dequantization (fp32 scale rounded once, code * scale, + bias) and fp32 scale
# differ from float64's by at most 4 * 2^-24 of |bias| + 255 * scale: 2^-21 with margin.
INT8_DEQUANT = 2.0**-21


@dataclass
class ReferenceResult:
    outputs: dict[tuple[int, int, int], torch.Tensor]  # (step, rank, table) -> [b, dim] f64
    weights: dict[int, torch.Tensor]  # table -> [rows, dim] float64
    initial: dict[int, torch.Tensor]  # table -> [rows, dim] float64, as stored at the start
    states: dict[tuple[int, int], torch.Tensor]  # (table, chunk col0) -> [rows, state cols]
    # Step 0, per table: sum over each bag of |w| (the magnitude fp32 pooling rounds), and per
    # column chunk the partial sums of its row ranges ([B, cols] each): what the ranks send.
    abs_pooled: dict[int, torch.Tensor] = field(default_factory=dict)
    partials: dict[tuple[int, int], list[torch.Tensor]] = field(default_factory=dict)
    max_bag: dict[int, int] = field(default_factory=dict)  # table -> longest bag, step 0
    # int8 tables: what their tolerances need (Int8Stats), and at step 0 per output element
    # the bag's sum of its rows' int8 slack (INT8_SLACK0), [B, dim].
    int8: dict[int, "Int8Stats"] = field(default_factory=dict)
    int8_slack0: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass
class Int8Stats:
    """An int8 table's quantization over the run (reference side)."""

    step: torch.Tensor  # [rows, dim]: each element's code step (its row chunk's scale), at the end
    mag: torch.Tensor  # [rows, dim]: |bias| + 255 * scale, the dequantization's magnitude
    step_max: float = 0.0  # the largest code step of any row chunk over the run
    lookups_max: int = 0  # most lookups of one row in one step
    bag_max: int = 0  # longest bag of any step
    grad_norm_min: float = float("inf")  # smallest |pooled - target|_F of a step


def storage_dtype(dt: DataType) -> torch.dtype:
    if dt not in _STORAGE:
        raise ValueError(f"no reference for {dt.value} weights")
    return _STORAGE[dt]


def _int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of one column chunk, float64 [n, c], as int8 stores them: (values, scale [n, 1],
    magnitude |bias| + 255 * scale [n, 1], ambiguous [n, c]: codes the ranks' fp32 may round
    the other way, INT8_CODE_EPS)."""
    lo = x.min(dim=1, keepdim=True).values
    hi = x.max(dim=1, keepdim=True).values
    scale = (hi - lo) / 255
    t = (x - lo) * (255 / (scale * 255 + _QPARAM_EPS))
    code = torch.round(t).clamp(0, 255)
    ambiguous = ((t - torch.floor(t)) - 0.5).abs() <= INT8_CODE_EPS
    return code * scale + lo, scale, lo.abs() + 255 * scale, ambiguous


def _batch(lay: ExecLayout, t: TableExec, seed: int, step: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, offsets) of the global batch, rank-major: W x t.bags bags (per rank, one per
    sample and feature, feature after feature)."""
    got = [synthetic.id_batch(seed, t.index, t.access, t.rows, t.pooling, step, r, lay.batch,
                              t.features)
           for r in range(lay.world)]
    lengths = torch.from_numpy(np.concatenate([g[0] for g in got]))
    ids = torch.from_numpy(np.concatenate([g[1] for g in got]))
    offsets = torch.zeros(lengths.numel(), dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)[:-1]
    return ids, offsets


def _targets(lay: ExecLayout, t: TableExec, seed: int, step: int) -> torch.Tensor:
    return torch.cat([torch.from_numpy(synthetic.targets(seed, t.index, step, r, t.outputs,
                                                         t.dim)) for r in range(lay.world)]
                     ).double()


class _Table:
    """One table's weights and optimizer state, float64."""

    def __init__(self, t: TableExec, seed: int, lr: float, eps: float) -> None:
        self.t, self.lr, self.eps = t, lr, eps
        self.dtype = storage_dtype(t.data_type)
        w0 = torch.from_numpy(synthetic.init_weights(seed, t.index, t.dim, 0, t.rows, 0, t.dim))
        self.w = torch.nn.Parameter(w0.to(self.dtype).double())
        self.int8: Int8Stats | None = None
        if t.data_type is DataType.INT8:
            zero = torch.zeros((t.rows, t.dim), dtype=torch.float64)
            self.int8 = Int8Stats(zero, zero.clone())
            self.ambiguous0 = self._quantize(torch.arange(t.rows))
        self.initial = self.w.detach().clone()
        opt = t.optimizer
        self.opt: torch.optim.Optimizer | None = None
        if opt is Optimizer.SGD:
            self.opt = torch.optim.SGD([self.w], lr=lr)
        elif opt is Optimizer.ADAGRAD:
            self.opt = torch.optim.Adagrad([self.w], lr=lr, eps=eps, foreach=False)
        elif opt is Optimizer.ADAM and t.data_parallel:
            self.opt = torch.optim.Adam([self.w], lr=lr, betas=BETAS, eps=eps, foreach=False)
        # Lazy Adam (sharded) keeps its moments here; row-wise Adagrad one accumulator per
        # row of every column chunk.
        self.m = torch.zeros((t.rows, t.dim), dtype=torch.float64)
        self.v = torch.zeros((t.rows, t.dim), dtype=torch.float64)
        self.rowwise = {ch.col0: torch.zeros(t.rows, dtype=torch.float64) for ch in t.chunks}

    def step(self, ids: torch.Tensor, offsets: torch.Tensor, target: torch.Tensor,
             step: int) -> torch.Tensor:
        """Pooled outputs of the global batch, then one update; returns the outputs."""
        self.w.grad = None
        out = _pooled(self.t, self.w, ids, offsets)
        loss = 0.5 * ((out - target) ** 2).sum()
        loss.backward()
        g = self.w.grad
        assert g is not None
        touched = torch.unique(ids)
        with torch.no_grad():
            if self.opt is not None:
                self.opt.step()
            elif self.t.optimizer is Optimizer.ROWWISE_ADAGRAD:
                for ch in self.t.chunks:
                    cols = slice(ch.col0, ch.col0 + ch.cols)
                    gr = g[touched, cols]
                    st = self.rowwise[ch.col0]
                    st[touched] += (gr * gr).mean(dim=1)
                    self.w[touched, cols] -= self.lr * gr / (
                        torch.sqrt(st[touched])[:, None] + self.eps)
            else:  # Adam on a sharded table: torch.optim.Adam on the rows looked up
                rows = torch.nn.Parameter(self.w[touched].clone())
                rows.grad = g[touched].clone()
                adam = torch.optim.Adam([rows], lr=self.lr, betas=BETAS, eps=self.eps,
                                        foreach=False)
                # torch.optim.Adam counts this step itself: it holds the steps before it.
                adam.state[rows] = {"step": torch.tensor(float(step - 1)),
                                    "exp_avg": self.m[touched].clone(),
                                    "exp_avg_sq": self.v[touched].clone()}
                adam.step()
                st = adam.state[rows]
                self.m[touched] = st["exp_avg"]
                self.v[touched] = st["exp_avg_sq"]
                self.w[touched] = rows.detach()
            if self.int8 is not None:  # the rows updated, quantized again
                self._quantize(torch.arange(self.t.rows) if self.t.data_parallel else touched)
                st = self.int8
                st.lookups_max = max(st.lookups_max, int(torch.bincount(ids).max()))
                ends = torch.cat([offsets[1:], torch.tensor([ids.numel()])])
                st.bag_max = max(st.bag_max, int((ends - offsets).max()) if
                                 offsets.numel() and not self.t.sequence else 1)
                st.grad_norm_min = min(st.grad_norm_min, float((out - target).norm()))
            elif self.dtype is not torch.float32:  # the storage's rounding, every update
                self.w.copy_(self.w.to(self.dtype).double())
        return out.detach()

    def _quantize(self, rows: torch.Tensor) -> torch.Tensor:
        """Quantize `rows` (int8 tables) per column chunk in place; returns which of their
        elements are ambiguous ([len(rows), dim])."""
        st = self.int8
        assert st is not None
        amb = torch.zeros((rows.numel(), self.t.dim), dtype=torch.bool)
        with torch.no_grad():
            for ch in self.t.chunks:
                cols = slice(ch.col0, ch.col0 + ch.cols)
                v, scale, mag, a = _int8(self.w[rows, cols])
                self.w[rows, cols] = v
                st.step[rows, cols] = scale.expand(-1, ch.cols)
                st.mag[rows, cols] = mag.expand(-1, ch.cols)
                amb[:, cols] = a
                if scale.numel():
                    st.step_max = max(st.step_max, float(scale.max()))
        return amb

    def states(self) -> dict[int, torch.Tensor]:
        """Per column chunk, the optimizer state in the ranks' layout ([rows, state cols])."""
        out = {}
        opt = self.t.optimizer
        for ch in self.t.chunks:
            cols = slice(ch.col0, ch.col0 + ch.cols)
            if opt is Optimizer.SGD:
                out[ch.col0] = torch.zeros((self.t.rows, 0), dtype=torch.float64)
            elif opt is Optimizer.ROWWISE_ADAGRAD:
                out[ch.col0] = self.rowwise[ch.col0][:, None].clone()
            elif opt is Optimizer.ADAGRAD:
                assert self.opt is not None
                out[ch.col0] = self.opt.state[self.w]["sum"][:, cols].clone() if \
                    self.opt.state else torch.zeros((self.t.rows, ch.cols), dtype=torch.float64)
            elif self.t.data_parallel:
                assert self.opt is not None
                st = self.opt.state[self.w]
                out[ch.col0] = torch.cat([st["exp_avg"][:, cols], st["exp_avg_sq"][:, cols]],
                                         dim=1) if st else torch.zeros(
                    (self.t.rows, 2 * ch.cols), dtype=torch.float64)
            else:
                out[ch.col0] = torch.cat([self.m[:, cols], self.v[:, cols]], dim=1)
        return out


def run_reference(lay: ExecLayout, seed: int, steps: int, lr: float,
                  eps: float = 1e-8) -> ReferenceResult:
    res = ReferenceResult({}, {}, {}, {})
    for t in lay.tables:
        b = t.outputs  # rows of the table's outputs per rank
        tab = _Table(t, seed, lr, eps)
        res.initial[t.index] = tab.initial
        for step in range(steps):
            ids, offsets = _batch(lay, t, seed, step)
            if step == 0:
                _magnitudes(res, t, tab.w.detach(), ids, offsets)
                if tab.int8 is not None:
                    # Per element: a whole code step where the ranks may round the other way,
                    # and the fp32 dequantization's error (INT8_DEQUANT).
                    slack = (tab.ambiguous0.double() * tab.int8.step
                             + INT8_DEQUANT * tab.int8.mag)
                    res.int8_slack0[t.index] = _pooled(t, slack, ids, offsets)
            out = tab.step(ids, offsets, _targets(lay, t, seed, step), step + 1)
            for r in range(lay.world):
                res.outputs[(step, r, t.index)] = out[r * b:(r + 1) * b]
        res.weights[t.index] = tab.w.detach().clone()
        if tab.int8 is not None:
            res.int8[t.index] = tab.int8
        for col0, st in tab.states().items():
            res.states[(t.index, col0)] = st
    return res


def _pooled(t: TableExec, w: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor
            ) -> torch.Tensor:
    """Sum pooling of [rows, dim] values per bag (a sequence table: per id)."""
    if t.sequence:
        return F.embedding(ids, w)
    return F.embedding_bag(ids, w, offsets, mode="sum")


def _magnitudes(res: ReferenceResult, t: TableExec, w: torch.Tensor, ids: torch.Tensor,
                offsets: torch.Tensor) -> None:
    if t.sequence:  # every id its own output: a "bag" of one
        ids = ids.clone()
        offsets = torch.arange(ids.numel(), dtype=torch.int64)
    res.abs_pooled[t.index] = F.embedding_bag(ids, w.abs(), offsets, mode="sum")
    ends = torch.cat([offsets[1:], torch.tensor([ids.numel()])])
    res.max_bag[t.index] = int((ends - offsets).max()) if offsets.numel() else 0
    for ch in t.chunks:
        wc = w[:, ch.col0:ch.col0 + ch.cols]
        ranges = [(p.row0, p.rows) for p in ch.pieces] if t.row_split else [(0, t.rows)]
        parts = []
        for r0, n in ranges:
            inside = ((ids >= r0) & (ids < r0 + n)).double()
            parts.append(F.embedding_bag(ids, wc, offsets, mode="sum",
                                         per_sample_weights=inside))
        res.partials[(t.index, ch.col0)] = parts
