"""Communication precision: rows quantized before sending, dequantized after receiving.

The wire format of n rows of d elements is exactly `n * comm_row_bytes(precision, d)` bytes
(cost_models/sizes.py): fp32/fp16/bf16 rows as they are; int8 and fp8 rows as one fp32 scale
per row (all scales first, then all elements), symmetric around zero.
"""

import torch

from cost_models.sizes import comm_row_bytes
from cost_models.types import CommPrecision

_FLOAT = {CommPrecision.FP32: torch.float32, CommPrecision.FP16: torch.float16,
          CommPrecision.BF16: torch.bfloat16}
_INT8_MAX = 127.0
_FP8_MAX = 448.0  # largest finite float8_e4m3fn


def wire_bytes(precision: CommPrecision, rows: int, cols: int) -> int:
    return rows * comm_row_bytes(precision, cols)


def encode(x: torch.Tensor, precision: CommPrecision) -> torch.Tensor:
    """float32 [n, d] -> uint8 [n * comm_row_bytes]."""
    x = x.contiguous()
    if precision in _FLOAT:
        return x.to(_FLOAT[precision]).contiguous().view(torch.uint8).reshape(-1)
    top = _INT8_MAX if precision is CommPrecision.INT8 else _FP8_MAX
    amax = x.abs().amax(dim=1, keepdim=True) if x.shape[1] else x.new_zeros((x.shape[0], 1))
    scale = torch.where(amax > 0, amax / top, torch.ones_like(amax))
    if precision is CommPrecision.INT8:
        q = torch.round(x / scale).clamp(-_INT8_MAX, _INT8_MAX).to(torch.int8)
    else:
        q = (x / scale).to(torch.float8_e4m3fn)
    return torch.cat([scale.reshape(-1).view(torch.uint8), q.reshape(-1).view(torch.uint8)])


def decode(buf: torch.Tensor, rows: int, cols: int, precision: CommPrecision) -> torch.Tensor:
    """uint8 [rows * comm_row_bytes] -> float32 [rows, cols]."""
    if buf.storage_offset() % 8:
        buf = buf.clone()  # a dtype view needs an aligned start
    if precision in _FLOAT:
        return buf.view(_FLOAT[precision]).reshape(rows, cols).to(torch.float32)
    scale = buf[:rows * 4].view(torch.float32).reshape(rows, 1)
    body = buf[rows * 4:]
    q = body.view(torch.int8) if precision is CommPrecision.INT8 else body.view(
        torch.float8_e4m3fn)
    return q.reshape(rows, cols).to(torch.float32) * scale


def roundtrip(x: torch.Tensor, precision: CommPrecision) -> torch.Tensor:
    """What the receiver sees: used where a sender must keep the value it sent."""
    if precision is CommPrecision.FP32:
        return x
    return decode(encode(x, precision), x.shape[0], x.shape[1], precision)
