"""Bytes per row of weights, optimizer state and communicated vectors."""

from cost_models.types import CommPrecision, DataType, Optimizer

# int8 weights carry a per-row fp32 scale and bias (FBGEMM's fused int8 row layout).
_INT8_ROW_OVERHEAD_BYTES = 8
# int8/fp8 communication carries one fp32 scale per row (quantize before send, per row).
_QUANT_COMM_ROW_OVERHEAD_BYTES = 4
_DTYPE_BYTES = {DataType.FP32: 4, DataType.FP16: 2, DataType.BF16: 2, DataType.INT8: 1}
_COMM_BYTES = {
    CommPrecision.FP32: 4,
    CommPrecision.FP16: 2,
    CommPrecision.BF16: 2,
    CommPrecision.FP8: 1,
    CommPrecision.INT8: 1,
}
# Optimizer state is kept in fp32.
_STATE_ELEMENT_BYTES = 4
# State elements per row: (per row, per column of the row).
_STATE_ELEMENTS = {Optimizer.SGD: (0, 0), Optimizer.ROWWISE_ADAGRAD: (1, 0),
                   Optimizer.ADAGRAD: (0, 1), Optimizer.ADAM: (0, 2)}


def weight_row_bytes(data_type: DataType, cols: int) -> int:
    """Bytes of one stored row of `cols` columns."""
    extra = _INT8_ROW_OVERHEAD_BYTES if data_type is DataType.INT8 else 0
    return cols * _DTYPE_BYTES[data_type] + extra


def param_bytes(data_type: DataType, rows: int, cols: int) -> int:
    """Bytes of a [rows, cols] parameter in its own dtype, as DDP sizes its buckets (no
    per-row int8 overhead)."""
    return rows * cols * _DTYPE_BYTES[data_type]


def optimizer_state_row_bytes(optimizer: Optimizer, cols: int) -> int:
    """Bytes of optimizer state per row: none for SGD, one fp32 for row-wise Adagrad,
    one fp32 per element for Adagrad, two (first and second moment) for Adam."""
    per_row, per_col = _STATE_ELEMENTS[optimizer]
    return (per_row + per_col * cols) * _STATE_ELEMENT_BYTES


def comm_row_bytes(precision: CommPrecision, cols: int) -> int:
    """Bytes of one communicated vector of `cols` elements at `precision`."""
    quantized = precision in (CommPrecision.INT8, CommPrecision.FP8)
    extra = _QUANT_COMM_ROW_OVERHEAD_BYTES if quantized else 0
    return cols * _COMM_BYTES[precision] + extra
