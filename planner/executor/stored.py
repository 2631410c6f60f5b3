"""How a piece's rows are stored, and the two conversions between stored rows and fp32 (the
ranks' side; the unsharded reference, reference.py, writes its own from the definition).

fp32, fp16 and bf16 weights are stored as they are. int8 weights are stored as FBGEMM's
training TBE stores them (`SplitTableBatchedEmbeddingBagsCodegen(weights_precision=
SparseType.INT8)`): one uint8 row of `cols + 8` bytes per row: `cols` codes, then the fp32
scale and the fp32 bias (a [rows, cols] piece is a uint8 [rows, cols + 8] tensor, the cost
model's `cols + 8` bytes per row, cost_models/sizes.py). A piece row is quantized on its own
(per row of the piece's columns, i.e. per column chunk of the table's row), asymmetric, as
FBGEMM's deterministic path (stochastic_rounding=False) does it in fp32
(fbgemm_gpu/include/fbgemm_gpu/utils: `thrust_find_qparams` / `warp_find_qparams`,
`nearest_rounding_vector`):
    scale = (max - min) / 255, bias = min,
    inv_scale = 255 / (scale * 255 + 1e-8),
    code = round-half-to-even((x - bias) * inv_scale)   (lrintf; clamped to [0, 255]),
and read back as code * scale + bias, pooled in fp32. An update reads the touched rows
(dequantized), applies the optimizer in fp32 and quantizes each row again with its fresh
min and max.

Every store (store.py) moves stored rows as they are: gathers, scatters, cache slots and
memory-mapped files see uint8 rows of the same width, so no tier needs to know the format.

FBGEMM's own int8 TBE trains on CUDA only (its CPU backward has no uint8 kernel:
`split_embedding_backward_exact_cpu_kernel ... not implemented for 'Byte'`), so with
`--kernels fbgemm|auto` int8 pieces run here, on the torch path (fbgemm.why_not).
"""

import torch

from cost_models.types import DataType
from planner.executor import kernels

_DTYPES = {DataType.FP32: torch.float32, DataType.FP16: torch.float16,
           DataType.BF16: torch.bfloat16, DataType.INT8: torch.uint8}
QPARAM_BYTES = 8  # fp32 scale, then fp32 bias, after a row's codes
_QPARAM_EPS = 1e-8  # FBGEMM's kQParamEps


def storage_dtype(dt: DataType) -> torch.dtype:
    """The torch dtype of a stored row: the weights' own, uint8 for int8 rows."""
    return _DTYPES[dt]


def is_quantized(rows: torch.Tensor) -> bool:
    return rows.dtype == torch.uint8


def quantize(x: torch.Tensor) -> torch.Tensor:
    """float32 [n, c] -> uint8 [n, c + 8]: each row's codes, scale and bias. Overwrites x
    (its codes are computed in place: one [n, c] float32 array the fewer)."""
    n, c = x.shape
    out = torch.empty((n, c + QPARAM_BYTES), dtype=torch.uint8, device=x.device)
    if n == 0:
        return out
    lo, hi = torch.aminmax(x, dim=1, keepdim=True)
    scale = hi.sub_(lo).div_(255.0)  # (max - min) / 255, in fp32
    inv = 255.0 / (scale * 255.0 + _QPARAM_EPS)
    codes = x.sub_(lo).mul_(inv).round_().clamp_(0.0, 255.0)
    out[:, :c] = codes
    out[:, c:c + 4] = scale.view(torch.uint8)
    out[:, c + 4:] = lo.view(torch.uint8)
    return out


def _qparams(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, bias), float32 [n, 1] each, of stored int8 rows."""
    c = rows.shape[1] - QPARAM_BYTES
    # A copy, always: a dtype view needs an aligned start (one row's slice is contiguous).
    qp = rows[:, c:].clone(memory_format=torch.contiguous_format).view(torch.float32)
    return qp[:, :1], qp[:, 1:]


def dequantize(rows: torch.Tensor) -> torch.Tensor:
    """uint8 [n, c + 8] -> float32 [n, c]: code * scale + bias."""
    c = rows.shape[1] - QPARAM_BYTES
    scale, bias = _qparams(rows)
    return rows[:, :c].to(torch.float32).mul_(scale).add_(bias)


def to_float(rows: torch.Tensor) -> torch.Tensor:
    """Stored rows -> float32 [n, cols]."""
    return dequantize(rows) if is_quantized(rows) else rows.to(torch.float32)


def to_stored(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 [n, cols] -> rows stored as `dtype` (int8: quantized, x overwritten)."""
    return quantize(x) if dtype == torch.uint8 else x.to(dtype)


def cols_of(rows: torch.Tensor) -> int:
    """The weights' columns of stored rows."""
    return rows.shape[1] - (QPARAM_BYTES if is_quantized(rows) else 0)


def pool(weight: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor,
         mask: torch.Tensor | None = None) -> torch.Tensor:
    """Fused lookup and sum pooling from stored rows (kernels.pool_bags), float32 [bags,
    cols]. int8 rows: torch's fused 8-bit row-wise embedding bag (the same row layout:
    codes, fp32 scale, fp32 bias), which dequantizes and sums in fp32 without gathering."""
    if not is_quantized(weight):
        return kernels.pool_bags(weight, ids, offsets, mask)
    psw = None if mask is None else mask.to(torch.float32)
    return torch.ops.quantized.embedding_bag_byte_rowwise_offsets(
        weight, ids, offsets, False, 0, False, psw, None, False)
