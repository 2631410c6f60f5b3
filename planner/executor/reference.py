"""The unsharded reference: every table whole, in one process, no communication.

It draws the same ids, targets and initial weights (synthetic.py) and runs the same kernels
(kernels.py). Two things follow the plan because they are the model's arithmetic, not its
transport: float addition is not associative, so a bag's partial sums over row ranges are
added in row order, and the data-parallel gradient in the ring all-reduce's order per chunk;
and row-wise Adagrad keeps one accumulator per row of each column shard (as FBGEMM and
TorchRec do). With fp32 communication the sharded run must then match it bit for bit.
"""

from dataclasses import dataclass

import numpy as np
import torch

from planner.executor import kernels, synthetic
from planner.executor.comm import chunk_bounds
from planner.executor.layout import ExecLayout, TableExec
from planner.executor.store import torch_dtype


@dataclass
class ReferenceResult:
    outputs: dict[tuple[int, int, int], torch.Tensor]  # (step, rank, table) -> [b, dim]
    weights: dict[int, torch.Tensor]  # table -> [rows, dim] float32
    states: dict[tuple[int, int], torch.Tensor]  # (table, chunk col0) -> [rows, state cols]


def _batch(lay: ExecLayout, t: TableExec, seed: int, step: int
           ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    got = [synthetic.id_batch(seed, t.index, t.access, t.rows, t.pooling, step, r, lay.batch)
           for r in range(lay.world)]
    return [g[0] for g in got], [g[1] for g in got]


def run_reference(lay: ExecLayout, seed: int, steps: int, lr: float) -> ReferenceResult:
    cfg = kernels.OptimConfig(lr=lr)
    b, w = lay.batch, lay.world
    weights = {t.index: torch.from_numpy(synthetic.init_weights(seed, t.index, t.dim, 0, t.rows,
                                                                0, t.dim)).to(
        torch_dtype(t.data_type)) for t in lay.tables}
    states = {(t.index, ch.col0): torch.zeros((t.rows, kernels.state_cols(t.optimizer, ch.cols)))
              for t in lay.tables for ch in t.chunks}
    outputs: dict[tuple[int, int, int], torch.Tensor] = {}
    for step in range(steps):
        for t in lay.tables:
            lengths, ids = _batch(lay, t, seed, step)
            tw = weights[t.index]
            target = torch.cat([torch.from_numpy(synthetic.targets(seed, t.index, step, r, b,
                                                                   t.dim)) for r in range(w)])
            if t.data_parallel:
                _data_parallel_step(t, tw, states[(t.index, 0)], lengths, ids, target, b, w,
                                    cfg, step, outputs)
                continue
            lt = torch.from_numpy(np.concatenate(lengths))
            it = torch.from_numpy(np.concatenate(ids))
            sample = kernels.sample_index(lt)
            out = torch.zeros((b * w, t.dim))
            for ch in t.chunks:
                wc = tw[:, ch.col0:ch.col0 + ch.cols]
                ranges = [(p.row0, p.rows) for p in ch.pieces] if t.row_split else [(0, t.rows)]
                parts = []
                for r0, n in ranges:
                    keep = (it >= r0) & (it < r0 + n)
                    parts.append(kernels.pool(wc[it[keep]].float(), sample[keep], b * w))
                out[:, ch.col0:ch.col0 + ch.cols] = kernels.fold_sum(parts)
            for r in range(w):
                outputs[(step, r, t.index)] = out[r * b:(r + 1) * b]
            grad = out - target
            for ch in t.chunks:
                g = grad[:, ch.col0:ch.col0 + ch.cols].contiguous()
                uniq, gu = kernels.row_grads(it, g[sample])
                st = states[(t.index, ch.col0)]
                wn, sn = kernels.apply_optimizer(
                    t.optimizer, cfg, tw[uniq, ch.col0:ch.col0 + ch.cols].float(), st[uniq], gu,
                    step + 1)
                tw[uniq, ch.col0:ch.col0 + ch.cols] = wn.to(tw.dtype)
                st[uniq] = sn
    return ReferenceResult(outputs, {k: v.float() for k, v in weights.items()}, states)


def _data_parallel_step(t: TableExec, tw: torch.Tensor, st: torch.Tensor,
                        lengths: list[np.ndarray], ids: list[np.ndarray], target: torch.Tensor,
                        b: int, w: int, cfg: kernels.OptimConfig, step: int,
                        outputs: dict[tuple[int, int, int], torch.Tensor]) -> None:
    dense = []
    for r in range(w):
        it = torch.from_numpy(ids[r])
        sample = kernels.sample_index(torch.from_numpy(lengths[r]))
        out = kernels.pool(tw[it].float(), sample, b)
        outputs[(step, r, t.index)] = out
        grad = out - target[r * b:(r + 1) * b]
        dense.append(kernels.dense_grads(it, grad[sample], t.rows))
    total = torch.empty_like(dense[0])
    bounds = chunk_bounds(t.rows, w)
    for c in range(w):
        rows = slice(bounds[c], bounds[c + 1])
        total[rows] = kernels.fold_sum([dense[(c + j) % w][rows] for j in range(w)])
    every = torch.arange(t.rows)
    wn, sn = kernels.apply_optimizer(t.optimizer, cfg, tw.float(), st, total, step + 1)
    tw[every] = wn.to(tw.dtype)
    st[:] = sn
