"""The ranks' arithmetic: lookup and sum pooling, reduction, gradients and optimizers. The
unsharded reference (reference.py) shares none of it.

Lookups are fused: `torch.nn.functional.embedding_bag(mode="sum")` pools each bag straight
from the table (or cache), never materialising the gathered rows ([ids, cols]); the gradient
of each looked-up row is one more fused bag sum, over the pooled gradients of the samples that
looked it up (`row_grads_bags`). Weights stored as fp16/bf16 pool to that dtype (torch's
kernel returns the weight's dtype) and are widened to fp32 after.

Determinism: every bag is summed in its ids' order, the row gradients in (row, lookup) order,
partial sums by an explicit left fold; optimizer updates touch each row once, over the sorted
unique ids of a step. On CUDA, `torch.use_deterministic_algorithms(True)` (set by the worker)
keeps `index_add_` (the data-parallel gradient) free of order-dependent atomics.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cost_models.types import Optimizer


def bag_offsets(lengths: torch.Tensor) -> torch.Tensor:
    """Where each bag starts in the ids (int64): the exclusive prefix sum of the lengths."""
    n = int(lengths.sum())  # ids in all bags: no bag starts past them
    offsets = torch.zeros(lengths.numel(), dtype=torch.int64, device=lengths.device)
    if lengths.numel() > 1:
        offsets[1:] = torch.cumsum(lengths, 0)[:-1]
    offsets = offsets.clamp(max=n)
    return offsets


def pool_bags(weight: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor,
              mask: torch.Tensor | None = None) -> torch.Tensor:
    """Fused sum pooling: out[bag] = sum of weight[ids] of the bag (those where mask is 1),
    float32 [bags, cols]."""
    psw = None if mask is None else mask.to(weight.dtype)
    return F.embedding_bag(ids, weight, offsets, mode="sum", per_sample_weights=psw).float()


def row_grads_bags(ids: torch.Tensor, offsets: torch.Tensor, grad: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted unique ids, the gradient of each): the pooled gradients `grad` [bags, cols] of
    the bags that looked the row up, summed in lookup order, fused (no [ids, cols] copy)."""
    uniq, inv, counts = torch.unique(ids, sorted=True, return_inverse=True, return_counts=True)
    lengths = torch.diff(offsets, append=offsets.new_tensor([ids.numel()]))
    sample = torch.repeat_interleave(torch.arange(offsets.numel(), device=ids.device), lengths)
    order = torch.sort(inv, stable=True).indices
    starts = torch.zeros_like(counts)
    if counts.numel() > 1:
        starts[1:] = torch.cumsum(counts, 0)[:-1]
    return compact(uniq), F.embedding_bag(sample[order], grad, starts, mode="sum")


def compact(uniq: torch.Tensor) -> torch.Tensor:
    """torch.unique's rows in storage of their own size. On CUDA its output is a view of a
    buffer as long as its input (the ids), which would live through the optimizer step: 8 B
    per id where the memory model counts 8 per updated row (measured on an H200: deeprecsys_rm2's
    backward peak 1,766,080 B over the model, exactly that buffer's excess). A copy of u rows."""
    return uniq.clone() if uniq.untyped_storage().nbytes() > uniq.nbytes else uniq


def pool(rows: torch.Tensor, sample: torch.Tensor, samples: int) -> torch.Tensor:
    """Sum pooling: out[s] = sum of the rows whose sample is s, added in lookup order."""
    out = torch.zeros((samples, rows.shape[1]), dtype=torch.float32, device=rows.device)
    return out.index_add_(0, sample, rows)


def fold_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """((p0 + p1) + p2) + ...: partial sums of row ranges, always in row order."""
    acc = parts[0]
    for p in parts[1:]:
        acc = acc + p
    return acc


def sample_index(lengths: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)


def row_grads(ids: torch.Tensor, grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted unique ids, the gradient of each: its lookups' gradients added in order)."""
    uniq, inv = torch.unique(ids, sorted=True, return_inverse=True)
    g = torch.zeros((uniq.numel(), grads.shape[1]), dtype=torch.float32, device=grads.device)
    return compact(uniq), g.index_add_(0, inv, grads)


def dense_grads(ids: torch.Tensor, grads: torch.Tensor, rows: int) -> torch.Tensor:
    g = torch.zeros((rows, grads.shape[1]), dtype=torch.float32, device=grads.device)
    return g.index_add_(0, ids, grads)


def state_cols(opt: Optimizer, cols: int) -> int:
    """fp32 optimizer state per row, as cost_models/sizes.py counts it."""
    return {Optimizer.SGD: 0, Optimizer.ROWWISE_ADAGRAD: 1, Optimizer.ADAGRAD: cols,
            Optimizer.ADAM: 2 * cols}[opt]


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 0.01
    eps: float = 1e-8
    beta1: float = 0.9
    beta2: float = 0.999


def apply_optimizer(opt: Optimizer, cfg: OptimConfig, w: torch.Tensor, s: torch.Tensor,
                    g: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """New (weights, state) of rows with gradient g; w and g float32, `step` counts from 1.
    Row-wise Adagrad keeps one accumulator per row of this column shard (as FBGEMM does)."""
    if opt is Optimizer.SGD:
        return w - cfg.lr * g, s
    if opt is Optimizer.ROWWISE_ADAGRAD:
        s = s + (g * g).mean(dim=1, keepdim=True)
        return w - cfg.lr * g / (torch.sqrt(s) + cfg.eps), s
    if opt is Optimizer.ADAGRAD:
        s = s + g * g
        return w - cfg.lr * g / (torch.sqrt(s) + cfg.eps), s
    d = w.shape[1]
    m = cfg.beta1 * s[:, :d] + (1 - cfg.beta1) * g
    v = cfg.beta2 * s[:, d:] + (1 - cfg.beta2) * g * g
    mhat = m / (1 - cfg.beta1 ** step)
    vhat = v / (1 - cfg.beta2 ** step)
    return w - cfg.lr * mhat / (torch.sqrt(vhat) + cfg.eps), torch.cat([m, v], dim=1)
