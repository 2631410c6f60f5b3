"""FBGEMM's table-batched embedding (TBE) for a rank's HBM pieces: `planner execute --kernels
fbgemm` (or `auto` where fbgemm_gpu imports).

One `SplitTableBatchedEmbeddingBagsCodegen` per (optimizer, weight dtype) group of a rank's
eligible pieces: every piece of the group is one TBE table, looked up in one fused call, its
rows updated by the TBE's fused optimizer inside the backward (no row gradients materialised
outside it). On CPU the TBE's tables live in host memory (`EmbeddingLocation.HOST`,
`ComputeDevice.CPU`), on CUDA in device memory (`DEVICE`, `CUDA`).

What FBGEMM serves (the rest runs the torch path, kernels.py and store.py, with the reason
in the report):
- hbm pieces of sharded tables: not cached tiers (FBGEMM's own caches are another design
  than store.py's, which the hit-rate check measures), not ddr, not data-parallel replicas
  (TorchRec runs those as dense DDP parameters);
- pooled (sum) tables; sequence tables stay on the torch path;
- fp32 and fp16 weights (`SparseType`); bf16 is not trained here; int8 pieces run on the torch
  path (stored.py: FBGEMM's int8 row layout and deterministic rounding), since FBGEMM's int8
  backward has no CPU kernel (CUDA only; on CUDA too they stay on torch here, untested);
- a piece width that is a multiple of 4 (the TBE's own assertion in construct_split_state);
- optimizers the TBE has on the device (FBGEMM's OptimType): EXACT_SGD, EXACT_ADAGRAD,
  EXACT_ROWWISE_ADAGRAD on CPU and CUDA; ADAM on CUDA only (the CPU constructor asserts it
  away: its codegen has no CPU kernel for Adam).

The updates are the definitions reference.py uses (FBGEMM's codegen/genscript/optimizers.py):
Adagrad s += g^2, w -= lr g / (sqrt(s) + eps); row-wise Adagrad s += mean(g^2) over the row's
D columns (one accumulator per row of the TBE table, i.e. of the piece's column band),
w -= lr g / (sqrt(s) + eps); SGD w -= lr g; Adam with bias correction by 1 - beta^iter, eps
outside the square root, iter counted by the TBE (+1 per training forward: the forward-only
warm-up pools from the TBE's weights with torch instead, so iter is the training step).
Stochastic rounding is off: fp16 weights are rounded to nearest, as the torch path does.

Different bag counts per piece (tables of several features, per-feature batches) are padded
to the group's largest with empty bags (the TBE takes one batch size for all its tables).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cost_models.types import DataType, Optimizer, Tier
from planner.executor import kernels
from planner.executor.layout import Piece, TableExec
from planner.executor.store import MemoryHeld, RowStore

KERNELS = ("torch", "fbgemm", "auto")


def available() -> bool:
    """fbgemm_gpu imports (and its training TBE with it)."""
    try:
        import fbgemm_gpu.split_table_batched_embeddings_ops_training  # noqa: F401
    except Exception:  # an ImportError, or a build whose ops fail to load
        return False
    return True


def resolve(kernels_opt: str) -> str:
    """The kernels a run uses: "torch" or "fbgemm". `auto`: fbgemm where it imports; an
    explicit `fbgemm` where it does not is an error (exit 2 from the CLI)."""
    if kernels_opt not in KERNELS:
        raise ValueError(f"--kernels {kernels_opt}: one of {', '.join(KERNELS)}")
    if kernels_opt == "torch":
        return "torch"
    if available():
        return "fbgemm"
    if kernels_opt == "auto":
        return "torch"
    raise ValueError("--kernels fbgemm: fbgemm_gpu is not importable here (pip install "
                     "fbgemm-gpu-cpu, or fbgemm-gpu for CUDA, matching torch); --kernels "
                     "auto falls back to torch")


_CPU_OPTIMIZERS = (Optimizer.SGD, Optimizer.ADAGRAD, Optimizer.ROWWISE_ADAGRAD)
_WEIGHTS = (DataType.FP32, DataType.FP16)


def why_not(t: TableExec, p: Piece, device: torch.device) -> str | None:
    """None when the TBE serves piece p of table t on `device`; else the reason it does not."""
    if t.data_parallel:
        return "data-parallel replica"
    if t.tier is not Tier.HBM:
        return f"tier {t.tier.value}"
    if t.sequence:
        return "sequence table"
    if t.data_type is DataType.INT8:
        # FBGEMM's training TBE takes int8 weights (SparseType.INT8, rows of codes, fp32 scale
        # and bias) but its backward is CUDA-only (on CPU: "not implemented for 'Byte'"): int8
        # pieces run on the torch path (stored.py), FBGEMM's row layout and rounding.
        return "int8 weights (FBGEMM's int8 backward is CUDA-only; the torch path trains them)"
    if t.data_type not in _WEIGHTS:
        return f"{t.data_type.value} weights"
    if p.cols % 4:
        return f"{p.cols} columns (TBE needs a multiple of 4)"
    if device.type != "cuda" and t.optimizer not in _CPU_OPTIMIZERS:
        return f"{t.optimizer.value} has no CPU kernel in FBGEMM"
    return None


def _optim_type(opt: Optimizer) -> Any:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType as OptimType

    return {Optimizer.SGD: OptimType.EXACT_SGD, Optimizer.ADAGRAD: OptimType.EXACT_ADAGRAD,
            Optimizer.ROWWISE_ADAGRAD: OptimType.EXACT_ROWWISE_ADAGRAD,
            Optimizer.ADAM: OptimType.ADAM}[opt]


def build_tbe(specs: list[tuple[int, int]], opt: Optimizer, data_type: DataType,
              cfg: kernels.OptimConfig, device: torch.device) -> Any:
    """The TBE over tables of (rows, cols) `specs`, with `opt` fused at cfg's settings."""
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        BoundsCheckMode,
        EmbeddingLocation,
        PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    cuda = device.type == "cuda"
    loc = EmbeddingLocation.DEVICE if cuda else EmbeddingLocation.HOST
    comp = ComputeDevice.CUDA if cuda else ComputeDevice.CPU
    return SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, cols, loc, comp) for rows, cols in specs],
        optimizer=_optim_type(opt),
        learning_rate=cfg.lr, eps=cfg.eps, beta1=cfg.beta1, beta2=cfg.beta2,
        weights_precision=SparseType.FP16 if data_type is DataType.FP16 else SparseType.FP32,
        output_dtype=SparseType.FP32,
        stochastic_rounding=False,
        pooling_mode=PoolingMode.SUM,
        bounds_check_mode=BoundsCheckMode.FATAL,
        device=device,
    )


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class TbeGroup:
    """One TBE over `pieces` (all of one optimizer and weight dtype)."""

    def __init__(self, pieces: list[Piece], tables: list[TableExec],
                 init: list[tuple[torch.Tensor, torch.Tensor]], cfg: kernels.OptimConfig,
                 device: torch.device) -> None:
        t0 = tables[0]
        self.pieces, self.device, self.optimizer = pieces, device, t0.optimizer
        self.tbe = build_tbe([(p.rows, p.cols) for p in pieces], t0.optimizer, t0.data_type,
                             cfg, device)
        self.tbe.train()
        self.col0: list[int] = []
        at = 0
        for p in pieces:
            self.col0.append(at)
            at += p.cols
        with torch.no_grad():
            for w_view, (w, s), states in zip(self.tbe.split_embedding_weights(), init,
                                              self._states(), strict=True):
                w_view.copy_(w.to(w_view.dtype))
                for view, part in zip(states, self._state_parts(s, w.shape[1]), strict=True):
                    view.copy_(part.reshape(view.shape))
        self._out: torch.Tensor | None = None
        self._bags: list[int] = []

    def _states(self) -> list[list[torch.Tensor]]:
        """Per table, its optimizer state tensors (none for SGD)."""
        if self.optimizer is Optimizer.SGD:
            return [[] for _ in self.pieces]
        return [list(s) for s in self.tbe.split_optimizer_states()]

    def _state_parts(self, s: torch.Tensor, cols: int) -> list[torch.Tensor]:
        """Our state layout [rows, state_cols] as the TBE's tensors: row-wise Adagrad one
        value per row, Adagrad one per element, Adam (m, v)."""
        if self.optimizer is Optimizer.SGD:
            return []
        if self.optimizer is Optimizer.ADAM:
            return [s[:, :cols], s[:, cols:]]
        return [s]

    def pool(self, lookups: list[tuple[torch.Tensor, torch.Tensor]], train: bool
             ) -> list[torch.Tensor]:
        """Fused lookup and sum pooling of every piece's (ids, offsets): float32 [bags, cols]
        per piece (views of one output). `train`: kept for `backward`; forward-only steps
        pool from the TBE's weights with torch (no optimizer iteration counted)."""
        bags = [o.numel() for _, o in lookups]
        if not train:
            with torch.no_grad():
                return [kernels.pool_bags(w, ids.to(w.device), off.to(w.device))
                        for w, (ids, off) in zip(self.tbe.split_embedding_weights(),
                                                 lookups, strict=True)]
        big = max(bags)
        ids = torch.cat([i for i, _ in lookups]).to(self.device)
        offs, at = [], 0
        for (i, o), nb in zip(lookups, bags, strict=True):
            o = o.to(self.device) + at
            at += i.numel()
            # Empty bags to the group's bag count: they pool to zeros, their gradients are 0.
            offs.append(torch.cat([o, o.new_full((big - nb,), at)]) if nb < big else o)
        offs.append(torch.tensor([at], dtype=torch.int64, device=self.device))
        out = self.tbe(ids, torch.cat(offs))
        self._out, self._bags = out, bags
        flat = out.detach()
        return [flat[:nb, c:c + p.cols] for p, nb, c in zip(self.pieces, bags, self.col0,
                                                             strict=True)]

    def backward(self, grads: list[torch.Tensor]) -> None:
        """The pooled gradients of every piece ([bags, cols] each): the TBE's backward sums
        them per row and applies its fused optimizer."""
        out = self._out
        assert out is not None, "backward without a training forward"
        g = torch.zeros_like(out)
        for gp, nb, c in zip(grads, self._bags, self.col0, strict=True):
            g[:nb, c:c + gp.shape[1]] = gp
        out.backward(g)
        self._out = None

    def dump(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Piece i's weights (float32) and state in our layout [rows, state_cols]."""
        w = self.tbe.split_embedding_weights()[i].detach().float().cpu().clone()
        parts = [x.detach().float().cpu().reshape(w.shape[0], -1) for x in self._states()[i]]
        s = torch.cat(parts, dim=1) if parts else torch.zeros((w.shape[0], 0))
        return w, s

    def held(self, i: int) -> int:
        """Bytes of piece i's weights and optimizer state in the TBE."""
        w = self.tbe.split_embedding_weights()[i]
        return _nbytes(w) + sum(_nbytes(x) for x in self._states()[i])

    def bookkeeping(self) -> int:
        """The TBE's other tensors (offsets, placements, counters): not in the model."""
        total = sum(_nbytes(b) for b in self.tbe.buffers())
        total += sum(_nbytes(x) for x in self.tbe.parameters())
        return total - sum(self.held(i) for i in range(len(self.pieces)))


@dataclass
class TbeStore(RowStore):
    """A piece served by a TbeGroup: the store interface for counters, memory and dump (its
    lookups and updates go through the group, fused with the other pieces')."""

    group: TbeGroup
    slot: int
    hits: int = 0
    lookups: int = 0

    def dump(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.group.dump(self.slot)

    def memory(self) -> MemoryHeld:
        return MemoryHeld(hbm=self.group.held(self.slot))


def group_pieces(tables: list[TableExec], pieces: list[Piece], device: torch.device
                 ) -> tuple[dict[tuple[Optimizer, DataType], list[Piece]], dict[str, str]]:
    """(the TBE groups of a rank's pieces, by optimizer and dtype; why each other piece runs
    on torch, by key)."""
    groups: dict[tuple[Optimizer, DataType], list[Piece]] = {}
    torch_why: dict[str, str] = {}
    for p in pieces:
        t = tables[p.table]
        why = why_not(t, p, device)
        if why is None:
            groups.setdefault((t.optimizer, t.data_type), []).append(p)
        else:
            torch_why[p.key] = why
    return groups, torch_why
