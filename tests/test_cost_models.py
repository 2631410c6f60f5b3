"""Unit tests for the analytic cost model (cost_models/).

Every expected value below is a hand computation written out in the test with small round
numbers; none is taken from the code's own output.

Shared setting unless a test says otherwise:
  hardware: 2 hosts x 4 GPUs, so W = 8 GPUs, G = 4 GPUs per host;
    HBM 1000 GB/s at efficiency 0.5   -> 500e9 B/s
    PCIe 50 GB/s at 0.5               -> 25e9 B/s
    DDR 400 GB/s at 0.5, shared by 4  -> 50e9 B/s per GPU, so host reads are PCIe-bound: 25e9
    SSD 8 GB/s at 0.5, shared by 4    -> 1e9 B/s per GPU
    NVLink 400 GB/s at 0.5            -> 200e9 B/s
    NIC 40 GB/s at 0.5                -> 20e9 B/s
    id 8 B, cache metadata 16 B/row, SSD page 4096 B
  table: 1000 rows, dim 8, pooling 2, fp32, uniform access
  model: b = 10 samples per GPU, so B = b*W = 80; forward comm fp32, backward comm fp16
"""

import numpy as np
import pytest

from cost_models import (
    CommPrecision,
    CostBreakdown,
    CostConstants,
    CurveAccess,
    DataType,
    HardwareProfile,
    ModelGeom,
    Optimizer,
    PieceTraffic,
    ShardingType,
    TableGeom,
    Tier,
    UniformAccess,
    ZipfAccess,
    hit_rate,
    piece_cost,
    piece_memory,
    piece_traffic,
    traffic_cost,
)
from cost_models.sizes import comm_row_bytes, optimizer_state_row_bytes, weight_row_bytes

REL = 1e-9
GB = 1e9


def make_hw(hosts=2, gpus_per_host=4, ddr_bw=400 * GB, overhead_s=0.0, update_s=0.0,
            a2a_call_s=0.0, a2a_peer_s=0.0, ar_call_s=0.0, ar_hop_s=0.0,
            bucket_bytes=25 << 20):
    # Latency terms off unless a test names them: the byte tests divide bytes only.
    consts = CostConstants(
        update_launch_s=update_s,
        a2a_call_latency_s=a2a_call_s,
        a2a_peer_latency_s=a2a_peer_s,
        allreduce_call_latency_s=ar_call_s,
        allreduce_hop_latency_s=ar_hop_s,
        allreduce_bucket_bytes=bucket_bytes,
        hbm_efficiency=0.5,
        pcie_efficiency=0.5,
        ddr_efficiency=0.5,
        ssd_efficiency=0.5,
        nvlink_efficiency=0.5,
        nic_efficiency=0.5,
        ssd_read_granularity_bytes=4096,
        id_bytes=8,
        cache_metadata_bytes_per_row=16,
        piece_overhead_s=overhead_s,
    )
    return HardwareProfile(
        hosts=hosts,
        gpus_per_host=gpus_per_host,
        hbm_bytes=80 * 10**9,
        hbm_reserved_bytes=10 * 10**9,
        hbm_bw=1000 * GB,
        ddr_bytes=1000 * 10**9,
        ddr_reserved_bytes=100 * 10**9,
        ddr_bw=ddr_bw,
        ssd_bytes=4000 * 10**9,
        ssd_bw=8 * GB,
        nvlink_bw=400 * GB,
        nic_bw=40 * GB,
        pcie_bw=50 * GB,
        constants=consts,
    )


def make_table(
    rows=1000,
    dim=8,
    pooling=2.0,
    access=None,
    data_type=DataType.FP32,
    optimizer=Optimizer.SGD,
):
    return TableGeom(
        rows=rows,
        dim=dim,
        pooling=pooling,
        access=access if access is not None else UniformAccess(),
        data_type=data_type,
        optimizer=optimizer,
    )


def make_model(fwd=CommPrecision.FP32, bwd=CommPrecision.FP16, pipelined=False):
    return ModelGeom(batch_per_gpu=10, fwd_precision=fwd, bwd_precision=bwd, pipelined=pipelined)


def traffic(table, kind, tier=Tier.HBM, cache_ratio=0.0, rows=None, cols=None, hw=None,
            model=None):
    return piece_traffic(
        table,
        kind,
        tier,
        cache_ratio,
        table.rows if rows is None else rows,
        table.dim if cols is None else cols,
        hw if hw is not None else make_hw(),
        model if model is not None else make_model(),
    )


def uniq(rows, table_lookups, share=1.0):
    """Distinct rows a piece of `share` of a uniform table sees: share * N (1 - (1-1/N)^k)."""
    return share * rows * (1 - (1 - 1 / rows) ** table_lookups)


def uniq_zipf(rows, alpha, table_lookups, hot=None):
    """sum_i 1 - (1 - p_i)^k over a zipf table (or its `hot` hottest rows), a plain loop."""
    total = sum(k ** -alpha for k in range(1, rows + 1))
    top = rows if hot is None else hot
    return sum(1 - (1 - k ** -alpha / total) ** table_lookups for k in range(1, top + 1))


def check_traffic(t, **expected):
    for name, value in expected.items():
        assert getattr(t, name) == pytest.approx(value, rel=REL, abs=1e-12), name


# --------------------------------------------------------------------------------------------
# 1. sizes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data_type", "cols", "expected"),
    [
        (DataType.FP32, 8, 32),  # 8 cols * 4 B
        (DataType.FP16, 8, 16),  # 8 cols * 2 B
        (DataType.BF16, 8, 16),  # 8 cols * 2 B
        (DataType.INT8, 8, 16),  # 8 cols * 1 B + 8 B (fp32 scale + fp32 bias)
        (DataType.INT8, 100, 108),  # 100 * 1 + 8
    ],
)
def test_weight_row_bytes(data_type, cols, expected):
    assert weight_row_bytes(data_type, cols) == expected


@pytest.mark.parametrize(
    ("optimizer", "cols", "expected"),
    [
        (Optimizer.SGD, 8, 0),  # no state
        (Optimizer.ROWWISE_ADAGRAD, 8, 4),  # one fp32 per row, whatever the width
        (Optimizer.ROWWISE_ADAGRAD, 100, 4),
        (Optimizer.ADAGRAD, 8, 32),  # one fp32 per element: 8 * 4
        (Optimizer.ADAM, 8, 64),  # two fp32 moments per element: 2 * 8 * 4
    ],
)
def test_optimizer_state_row_bytes(optimizer, cols, expected):
    assert optimizer_state_row_bytes(optimizer, cols) == expected


@pytest.mark.parametrize(
    ("precision", "cols", "expected"),
    [
        (CommPrecision.FP32, 8, 32),  # 8 * 4
        (CommPrecision.FP16, 8, 16),  # 8 * 2
        (CommPrecision.BF16, 8, 16),  # 8 * 2
        (CommPrecision.INT8, 8, 12),  # 8 * 1 + 4 B fp32 row scale
        (CommPrecision.FP8, 8, 12),  # 8 * 1 + 4 B fp32 row scale
    ],
)
def test_comm_row_bytes(precision, cols, expected):
    assert comm_row_bytes(precision, cols) == expected


# --------------------------------------------------------------------------------------------
# 2. hit rates
# --------------------------------------------------------------------------------------------


def test_hit_rate_fixed_tiers():
    table = make_table(access=ZipfAccess(1.1))
    # HBM serves everything from HBM; DDR has no fast level at all.
    assert hit_rate(table, Tier.HBM, 0.5, 1000) == 1.0
    assert hit_rate(table, Tier.DDR, 0.5, 1000) == 0.0


@pytest.mark.parametrize("tier", [Tier.HBM_CACHE, Tier.SSD])
def test_hit_rate_uniform_is_cache_fraction(tier):
    # 1000 rows, 25% cached = int(0.25 * 1000) = 250 rows; curve read at 250 * 1000 // 1000
    # = 250 rows; every row equally likely -> h = 250/1000 = 0.25
    table = make_table(access=UniformAccess())
    assert hit_rate(table, tier, 0.25, 1000) == pytest.approx(0.25, rel=REL)
    assert UniformAccess().hit_rate(250, 1000) == pytest.approx(0.25, rel=REL)


def test_hit_rate_zipf_small_table_brute_force():
    # 1000 rows, alpha 1.1, 10% cached = int(0.1 * 1000) = 100 hottest rows.
    # h = sum_{k=1..100} k^-1.1 / sum_{k=1..1000} k^-1.1
    alpha = 1.1
    head = 0.0
    total = 0.0
    for k in range(1, 1001):
        term = k ** -alpha
        total += term
        if k <= 100:
            head += term
    expected = head / total
    table = make_table(rows=1000, access=ZipfAccess(alpha))
    assert hit_rate(table, Tier.HBM_CACHE, 0.1, 1000) == pytest.approx(expected, rel=1e-9)
    assert ZipfAccess(alpha).hit_rate(100, 1000) == pytest.approx(expected, rel=1e-9)
    # Sanity: a skewed curve gives far more than the uniform 10%.
    assert expected > 0.5


@pytest.fixture(scope="module")
def big_k():
    # k = 1 .. 10^7 as float64 (80 MB, fast).
    return np.arange(1, 10**7 + 1, dtype=np.float64)


@pytest.mark.parametrize("alpha", [1.1, 1.0, 0.8])
def test_hit_rate_zipf_big_table_exact_sum(big_k, alpha):
    # 10^7 rows, 10% cached = int(0.1 * 10^7) = 10^6 hottest rows (whole-table piece).
    # Exact: sum of all 10^7 terms with numpy.
    # h = sum_{k<=10^6} k^-a / sum_{k<=10^7} k^-a
    terms = big_k**-alpha
    expected = float(np.sum(terms[: 10**6])) / float(np.sum(terms))
    table = make_table(rows=10**7, access=ZipfAccess(alpha))
    assert hit_rate(table, Tier.HBM_CACHE, 0.1, 10**7) == pytest.approx(expected, rel=1e-9)


def test_hit_rate_row_piece_reads_table_curve():
    # Row-wise piece of 250 of a 1000-row Zipf(1.1) table, 10% cache:
    # the piece caches int(0.1 * 250) = 25 rows; ids spread evenly over row ranges, so the
    # table's curve is read at 25 * 1000 // 250 = 100 rows -> h = H(100)/H(1000).
    alpha = 1.1
    head = sum(k ** -alpha for k in range(1, 101))
    total = sum(k ** -alpha for k in range(1, 1001))
    table = make_table(rows=1000, access=ZipfAccess(alpha))
    assert hit_rate(table, Tier.HBM_CACHE, 0.1, 250) == pytest.approx(head / total, rel=1e-9)
    # Piece of 300 rows, 10%: int(0.1 * 300) = 30 cached -> 30 * 1000 // 300 = 100 rows too.
    assert hit_rate(table, Tier.SSD, 0.1, 300) == pytest.approx(head / total, rel=1e-9)
    # Uniform: 25 of the piece's 250 rows -> 100 of 1000 -> h = 0.1
    assert hit_rate(make_table(), Tier.HBM_CACHE, 0.1, 250) == pytest.approx(0.1, rel=REL)


def test_hit_rate_curve_linear_interpolation():
    # Points (0,0) implied, (0.1, 0.5), (0.5, 0.9), (1,1) implied.
    curve = CurveAccess(points=((0.1, 0.5), (0.5, 0.9)))
    table = make_table(rows=1000, access=curve)
    # 0.05: 50 of 1000 rows, halfway from (0,0) to (0.1,0.5)     -> 0.25
    assert hit_rate(table, Tier.HBM_CACHE, 0.05, 1000) == pytest.approx(0.25, rel=REL)
    # 0.3: 300 rows, halfway from (0.1,0.5) to (0.5,0.9)          -> 0.5 + 0.5*0.4 = 0.7
    assert hit_rate(table, Tier.HBM_CACHE, 0.3, 1000) == pytest.approx(0.7, rel=REL)
    # 0.75: 750 rows, halfway from (0.5,0.9) to (1,1)             -> 0.9 + 0.5*0.1 = 0.95
    assert hit_rate(table, Tier.SSD, 0.75, 1000) == pytest.approx(0.95, rel=REL)
    # exactly on a point: 100 of 1000 rows = 0.1 -> 0.5
    assert curve.hit_rate(100, 1000) == pytest.approx(0.5, rel=REL)


def test_hit_rate_zipf_counts_every_cached_row():
    # 100 rows, cache ratio 0.295 -> int(29.5) = 29 cached rows (as piece_memory reserves).
    alpha = 1.1
    table = make_table(rows=100, access=ZipfAccess(alpha))
    mem = piece_memory(table, Tier.HBM_CACHE, 0.295, 100, 8, make_hw())
    assert mem.hbm == 29 * (32 + 16)  # 29 slots * (32 B row + 16 B metadata)
    # h = H(29, a) / H(100, a)
    head = sum(k ** -alpha for k in range(1, 30))
    total = sum(k ** -alpha for k in range(1, 101))
    assert hit_rate(table, Tier.HBM_CACHE, 0.295, 100) == pytest.approx(
        head / total, rel=1e-9
    )
    # 49 rows, ratio 0.01: int(0.49) = 0 -> at least 1 slot (as memory reserves), so the
    # hottest row is cached: h = H(1)/H(49) = 1 / sum_{k<=49} k^-a, not 0.
    table49 = make_table(rows=49, access=ZipfAccess(alpha))
    mem49 = piece_memory(table49, Tier.HBM_CACHE, 0.01, 49, 8, make_hw())
    assert mem49.hbm == 1 * (32 + 16)
    total49 = sum(k ** -alpha for k in range(1, 50))
    assert hit_rate(table49, Tier.HBM_CACHE, 0.01, 49) == pytest.approx(
        1.0 / total49, rel=1e-9
    )


# --------------------------------------------------------------------------------------------
# 3. traffic per sharding type (HBM tier)
# --------------------------------------------------------------------------------------------


def test_traffic_table_wise():
    # fp32, rowwise Adagrad, dim 8: row = 8*4 = 32 B, state = 4 B.
    table = make_table(optimizer=Optimizer.ROWWISE_ADAGRAD)
    t = traffic(table, ShardingType.TABLE_WISE)
    # B = 10*8 = 80 samples; lookups = 80 * 2 pooling * 1.0 share = 160 rows
    # fwd = 160 * 32 = 5120 B rows + 160 ids * 8 B = 1280 B  -> 6400
    # bwd: each lookup reads its sample's fp32 gradient (160 * 8 * 4 = 5120), then each of the
    # U = 1000 (1 - 0.999^160) distinct rows is read and written once: U * 2 * (32 + 4)
    # input = 1280 B of ids + 80 samples * 4 B bag lengths = 1600 B:
    #     intra (G-1)/W = 3/8 -> 600, inter (W-G)/W = 4/8 -> 800; lengths received 80*4*7/8
    # out fwd fp32 row 32 B: 80 * 32 = 2560 B -> intra 3/8 = 960, inter 4/8 = 1280
    # out bwd fp16 row 16 B: 80 * 16 = 1280 B -> intra 480, inter 640
    check_traffic(
        t,
        lookups=160,
        hbm_fwd=6400,
        hbm_bwd=uniq(1000, 160) * 72 + 5120,
        unique_rows=uniq(1000, 160),
        host=0,
        ssd=0,
        ids_intra=600,
        ids_inter=800,
        lengths=280,
        out_fwd_intra=960,
        out_fwd_inter=1280,
        out_bwd_intra=480,
        out_bwd_inter=640,
        allreduce=0,
    )


def test_traffic_column_wise_piece():
    # Table dim 16 split into pieces of 4 columns; fp16 weights, Adagrad.
    # piece row = 4 * 2 = 8 B; state = 4 * 4 = 16 B.
    table = make_table(dim=16, data_type=DataType.FP16, optimizer=Optimizer.ADAGRAD)
    t = traffic(table, ShardingType.COLUMN_WISE, rows=1000, cols=4)
    # every column piece sees all ids: lookups = 80 * 2 = 160
    # fwd = 160 * 8 + 160 * 8 (ids) = 2560; bwd = U * 2 * (8 + 16) + 160 * 4 cols * 4 B
    # ids 1280 B + lengths 320 B -> 600 intra, 800 inter
    # out fwd fp32 4 cols = 16 B: 80*16 = 1280 -> intra 3/8 = 480, inter 4/8 = 640
    # out bwd fp16 4 cols = 8 B: 80*8 = 640 -> intra 240, inter 320
    check_traffic(
        t,
        lookups=160,
        hbm_fwd=2560,
        hbm_bwd=uniq(1000, 160) * 48 + 2560,
        host=0,
        ssd=0,
        ids_intra=600,
        ids_inter=800,
        out_fwd_intra=480,
        out_fwd_inter=640,
        out_bwd_intra=240,
        out_bwd_inter=320,
        allreduce=0,
    )


def test_traffic_row_wise_piece():
    # Row-wise piece of 125 of the 1000 rows (share 1/8); fp32, Adam: row 32 B, state 64 B.
    # Backward comm in int8: 8 * 1 + 4 = 12 B per vector.
    table = make_table(optimizer=Optimizer.ADAM)
    t = traffic(table, ShardingType.ROW_WISE, rows=125, cols=8,
                model=make_model(bwd=CommPrecision.INT8))
    # lookups = 80 * 2 * 125/1000 = 20
    # fwd = 20 * 32 + 20 * 8 = 800; bwd = U * 2 * (32 + 64) + 20 * 32, U the piece's 1/8
    # of the table's distinct rows among its 160 lookups
    # ids = 20 * 8 = 160, plus a bag length for each of the 80 samples, 320 B, empty bags
    # included = 480 -> intra 3/8 = 180, inter 4/8 = 240
    # out: a partial sum for every one of the 80 samples.
    #   fwd fp32 32 B: 2560 -> intra 960, inter 1280
    #   bwd int8 12 B: 960 -> intra 3/8 = 360, inter 4/8 = 480
    check_traffic(
        t,
        lookups=20,
        hbm_fwd=800,
        hbm_bwd=uniq(1000, 160, 1 / 8) * 192 + 640,
        host=0,
        ssd=0,
        ids_intra=180,
        ids_inter=240,
        lengths=280,
        out_fwd_intra=960,
        out_fwd_inter=1280,
        out_bwd_intra=360,
        out_bwd_inter=480,
        allreduce=0,
    )


def test_traffic_table_row_wise_piece():
    # Table-row-wise piece of 250 rows (share 1/4, one of the 4 GPUs of a host), fp32, SGD.
    table = make_table()
    t = traffic(table, ShardingType.TABLE_ROW_WISE, rows=250, cols=8)
    # lookups = 80 * 2 * 1/4 = 40
    # fwd = 40 * 32 + 40 * 8 = 1600; bwd = U * 2 * 32 + 40 * 32 (U: 1/4 of the distinct rows)
    # ids = 320 + lengths 320 = 640 -> intra 3/8 = 240, inter 4/8 = 320
    # out fwd fp32 32 B over 80 samples = 2560 B:
    #   intra reduce-scatter (G-1)/G = 3/4 -> 1920
    #   inter B*(W-G)/(W*G) = 80 * 4/32 = 10 vectors -> 320
    # out bwd fp16 16 B: 1280 B -> intra 960, inter 10 * 16 = 160
    check_traffic(
        t,
        lookups=40,
        hbm_fwd=1600,
        hbm_bwd=uniq(1000, 160, 1 / 4) * 64 + 1280,
        host=0,
        ssd=0,
        ids_intra=240,
        ids_inter=320,
        out_fwd_intra=1920,
        out_fwd_inter=320,
        out_bwd_intra=960,
        out_bwd_inter=160,
        allreduce=0,
    )


def test_traffic_grid_piece():
    # Grid piece: 250 of 1000 rows and 8 of 16 columns; int8 weights: 8 * 1 + 8 = 16 B row.
    table = make_table(dim=16, data_type=DataType.INT8)
    t = traffic(table, ShardingType.GRID, rows=250, cols=8)
    # lookups = 80 * 2 * 1/4 = 40
    # fwd = 40 * 16 + 40 * 8 = 960; bwd = U * 2 * 16 + 40 * 8 cols * 4 B
    # ids = 320 + lengths 320 = 640 -> 240 intra, 320 inter
    # out (8 cols): fwd 32 B -> intra 80*32*3/4 = 1920, inter 10 vectors * 32 = 320
    #               bwd 16 B -> intra 960, inter 160
    check_traffic(
        t,
        lookups=40,
        hbm_fwd=960,
        hbm_bwd=uniq(1000, 160, 1 / 4) * 32 + 1280,
        host=0,
        ssd=0,
        ids_intra=240,
        ids_inter=320,
        out_fwd_intra=1920,
        out_fwd_inter=320,
        out_bwd_intra=960,
        out_bwd_inter=160,
        allreduce=0,
    )


def test_traffic_data_parallel_replica():
    # Replica of the whole table on every GPU; fp32 row 32 B, rowwise Adagrad state 4 B.
    table = make_table(optimizer=Optimizer.ROWWISE_ADAGRAD)
    t = traffic(table, ShardingType.DATA_PARALLEL, rows=1000, cols=8)
    # serves only its own b = 10 samples: lookups = 10 * 2 = 20
    # fwd = 20 * 32 + 20 * 8 = 800
    # bwd: one gradient row scattered per lookup 20 * 32 = 640, plus the dense optimizer
    #     step over the replica (read + write weight and state) 1000 * 2 * (32 + 4) = 72000
    #     = 72640 (no per-lookup fused read/write any more)
    # no ids or pooled vectors cross GPUs
    # all-reduce: gradient in fp16 = 1000 rows * 16 B = 16000; ring 2*(W-1)/W = 2*7/8
    #     -> 28000
    check_traffic(
        t,
        lookups=20,
        hbm_fwd=800,
        hbm_bwd=72640,
        host=0,
        ssd=0,
        ids_intra=0,
        ids_inter=0,
        out_fwd_intra=0,
        out_fwd_inter=0,
        out_bwd_intra=0,
        out_bwd_inter=0,
        allreduce=28000,
    )


def test_traffic_single_host_has_no_inter_host_bytes():
    # 1 host x 4 GPUs: W = G = 4, B = 40. TW piece, fp32, SGD.
    hw = make_hw(hosts=1, gpus_per_host=4)
    t = traffic(make_table(), ShardingType.TABLE_WISE, hw=hw)
    # lookups = 40 * 2 = 80; ids = 640 B + lengths 40 * 4 = 160 -> intra (G-1)/W = 3/4 -> 600
    # out fwd 40 * 32 = 1280 -> intra 3/4 = 960; bwd 40 * 16 = 640 -> 480
    check_traffic(
        t,
        lookups=80,
        ids_intra=600,
        ids_inter=0,
        out_fwd_intra=960,
        out_fwd_inter=0,
        out_bwd_intra=480,
        out_bwd_inter=0,
    )


# --------------------------------------------------------------------------------------------
# 4. tiers (table-wise piece, fp32 row 32 B, rowwise Adagrad state 4 B, uniform access)
#    lookups = 160; fwd rows = 160 * 32 = 5120; ids read = 1280; gradient reads 160 * 32 =
#    5120 (in HBM); per distinct row U = uniq(1000, 160): weight U * 64 + state U * 8
# --------------------------------------------------------------------------------------------


def test_tier_hbm_cache():
    table = make_table(optimizer=Optimizer.ROWWISE_ADAGRAD)
    t = traffic(table, ShardingType.TABLE_WISE, tier=Tier.HBM_CACHE, cache_ratio=0.25)
    # h = 0.25 (uniform: int(0.25 * 1000) = 250 of 1000 rows)
    # cache holds weight rows only; optimizer state stays in DDR:
    # hbm_fwd = 0.25 * 5120 + 1280 = 2560; hbm_bwd = 0.25 * U * 64 (weights) + 5120
    # (uniform: a quarter of the distinct rows are cached, as of the lookups)
    # host = 0.75 * (5120 + U * 64) + U * 8 (all state read + write)
    u = uniq(1000, 160)
    check_traffic(t, lookups=160, hbm_fwd=2560, hbm_bwd=0.25 * u * 64 + 5120,
                  host=0.75 * (5120 + u * 64) + u * 8, ssd=0)


def test_tier_ddr():
    table = make_table(optimizer=Optimizer.ROWWISE_ADAGRAD)
    t = traffic(table, ShardingType.TABLE_WISE, tier=Tier.DDR, cache_ratio=0.25)
    # only the ids and gradients are read from HBM; 5120 + U * 72 B go over PCIe
    check_traffic(t, lookups=160, hbm_fwd=1280, hbm_bwd=5120, host=5120 + uniq(1000, 160) * 72,
                  ssd=0)


def test_tier_ssd_small_rows_cost_a_page():
    table = make_table(optimizer=Optimizer.ROWWISE_ADAGRAD)
    t = traffic(table, ShardingType.TABLE_WISE, tier=Tier.SSD, cache_ratio=0.25)
    # host as for ddr: 5120 + U * 72; h = 0.25 of the DDR cache
    # row + state = 36 B < 4096 B page -> page 4096
    # ssd = 0.75 * 160 * 2 (read + write back) * 4096 = 120 * 8192 = 983040
    check_traffic(t, lookups=160, hbm_fwd=1280, hbm_bwd=5120, host=5120 + uniq(1000, 160) * 72,
                  ssd=983040)


def test_tier_ssd_big_rows_cost_more_than_a_page():
    # dim 1024 fp32: row 4096 B; Adam state 2 * 1024 * 4 = 8192 B; row + state = 12288 > 4096
    table = make_table(dim=1024, optimizer=Optimizer.ADAM)
    t = traffic(table, ShardingType.TABLE_WISE, tier=Tier.SSD, cache_ratio=0.5)
    # lookups 160; fwd = 160 * 4096 = 655360; bwd = U * 2 * 12288; gradients 160 * 4096
    # host = 655360 + U * 24576; ids read = 1280
    # ssd = 0.5 * 160 * 2 * 12288 = 1966080 (page reads per missed lookup)
    check_traffic(t, lookups=160, hbm_fwd=1280, hbm_bwd=655360,
                  host=655360 + uniq(1000, 160) * 24576, ssd=1966080)


def test_tier_hbm_cache_zipf_uses_curve():
    # 1000-row Zipf(1.1) table, 10% cache: h = H(100)/H(1000) from a plain loop.
    alpha = 1.1
    h = sum(k ** -alpha for k in range(1, 101)) / sum(k ** -alpha for k in range(1, 1001))
    table = make_table(access=ZipfAccess(alpha))  # SGD, row 32 B
    t = traffic(table, ShardingType.TABLE_WISE, tier=Tier.HBM_CACHE, cache_ratio=0.1)
    # fwd rows 5120, ids 1280, weight bwd U * 2 * 32 over the distinct rows, of which the
    # cache holds those among its 100 hottest rows (h_u of them), gradient reads 5120, SGD
    # state 0 B -> 0 in DDR
    u = uniq_zipf(1000, alpha, 160)
    h_u = uniq_zipf(1000, alpha, 160, hot=100) / u
    assert h_u < h  # a hot row is looked up often but updated once
    check_traffic(
        t,
        hbm_fwd=h * 5120 + 1280,
        hbm_bwd=h_u * u * 64 + 5120,
        host=(1 - h) * 5120 + (1 - h_u) * u * 64 + 0,
    )


def test_tier_hbm_cache_zipf_state_in_ddr():
    # Same Zipf(1.1) table, 10% cache, Adam: row 32 B, state 2 * 8 * 4 = 64 B.
    alpha = 1.1
    h = sum(k ** -alpha for k in range(1, 101)) / sum(k ** -alpha for k in range(1, 1001))
    table = make_table(access=ZipfAccess(alpha), optimizer=Optimizer.ADAM)
    t = traffic(table, ShardingType.TABLE_WISE, tier=Tier.HBM_CACHE, cache_ratio=0.1)
    # fwd rows 160 * 32 = 5120, ids 1280, weight bwd U * 2 * 32, gradient reads 5120,
    # state bwd U * 2 * 64 always over PCIe (state is not cached)
    u = uniq_zipf(1000, alpha, 160)
    h_u = uniq_zipf(1000, alpha, 160, hot=100) / u
    check_traffic(
        t,
        hbm_fwd=h * 5120 + 1280,
        hbm_bwd=h_u * u * 64 + 5120,
        host=(1 - h) * 5120 + (1 - h_u) * u * 64 + u * 128,
        ssd=0,
    )


# --------------------------------------------------------------------------------------------
# 5. cost
# --------------------------------------------------------------------------------------------


def _bytes(**kw):
    base = dict(
        lookups=0.0,
        hbm_fwd=0.0,
        hbm_bwd=0.0,
        host=0.0,
        ssd=0.0,
        ids_intra=0.0,
        ids_inter=0.0,
        out_fwd_intra=0.0,
        out_fwd_inter=0.0,
        out_bwd_intra=0.0,
        out_bwd_inter=0.0,
        allreduce=0.0,
    )
    base.update(kw)
    return PieceTraffic(**base)


def test_effective_bandwidths():
    hw = make_hw()
    assert hw.world_size == 8
    assert hw.eff_hbm_bw == pytest.approx(500e9, rel=REL)  # 1000 * 0.5
    # min(PCIe 50 * 0.5 = 25, DDR 400 * 0.5 / 4 = 50) = 25 GB/s
    assert hw.eff_host_read_bw == pytest.approx(25e9, rel=REL)
    assert hw.eff_ssd_bw == pytest.approx(1e9, rel=REL)  # 8 * 0.5 / 4
    assert hw.eff_nvlink_bw == pytest.approx(200e9, rel=REL)  # 400 * 0.5
    assert hw.eff_nic_bw == pytest.approx(20e9, rel=REL)  # 40 * 0.5
    # DDR-bound host: min(25, 80 * 0.5 / 4 = 10) = 10 GB/s
    assert make_hw(ddr_bw=80 * GB).eff_host_read_bw == pytest.approx(10e9, rel=REL)


def test_traffic_cost_each_term():
    hw = make_hw(overhead_s=1e-4)
    t = _bytes(
        hbm_fwd=1e9,
        hbm_bwd=2e9,
        host=250e6,
        ssd=100e6,
        ids_intra=200e6,
        ids_inter=20e6,
        out_fwd_intra=400e6,
        out_fwd_inter=40e6,
        out_bwd_intra=200e6,
        out_bwd_inter=20e6,
        allreduce=100e6,
    )
    c = traffic_cost(t, hw)
    # lookup = 1e9 / 500e9 = 2e-3 s + 1e-4 s overhead = 2.1e-3
    assert c.lookup == pytest.approx(2.1e-3, rel=REL)
    # backward = 2e9 / 500e9 = 4e-3
    assert c.backward == pytest.approx(4e-3, rel=REL)
    # cache_miss = 250e6 / 25e9 (PCIe) + 100e6 / 1e9 (SSD) = 0.01 + 0.1 = 0.11
    assert c.cache_miss == pytest.approx(0.11, rel=REL)
    # input = 200e6 / 200e9 + 20e6 / 20e9 = 1e-3 + 1e-3 = 2e-3
    assert c.input_a2a == pytest.approx(2e-3, rel=REL)
    # output = (400e6 + 200e6) / 200e9 + (40e6 + 20e6) / 20e9 = 3e-3 + 3e-3 = 6e-3
    assert c.output_a2a == pytest.approx(6e-3, rel=REL)
    # all-reduce over 2 hosts of 4 GPUs, one ring per channel: 1/4 of a GPU's bytes cross its
    # NIC (20 GB/s), 3/4 go over NVLink (200 GB/s): bus bandwidth
    # 1 / max(1 / (4 * 20e9), 3 / (4 * 200e9)) = 80e9, so 100e6 / 80e9 = 1.25e-3
    assert c.allreduce == pytest.approx(1.25e-3, rel=REL)
    # compute = 2.1e-3 + 4e-3 + 0.11 = 0.1161; comm = 2e-3 + 6e-3 + 1.25e-3 = 9.25e-3
    assert c.compute == pytest.approx(0.1161, rel=REL)
    assert c.comm == pytest.approx(9.25e-3, rel=REL)
    assert c.total(pipelined=False, overlap=1.0) == pytest.approx(0.12535, rel=REL)
    # pipelined: the next batch's input all-to-all runs beside the rest:
    # comm + max(0, compute - input) = 9.25e-3 + (0.1161 - 2e-3) = 0.12335
    assert c.total(pipelined=True, overlap=1.0) == pytest.approx(0.12335, rel=REL)


def test_traffic_cost_ddr_bound_host_reads():
    # host reads at min(25, 80 * 0.5 / 4 = 10) GB/s: 250e6 / 10e9 = 0.025 s
    c = traffic_cost(_bytes(host=250e6), make_hw(ddr_bw=80 * GB))
    assert c.cache_miss == pytest.approx(0.025, rel=REL)


def test_allreduce_bus_bandwidth_is_nvlink_bound_with_fast_nics():
    # 2 hosts of 4 GPUs with 200 GB/s NICs (100 effective): 4 NICs carry 400 GB/s, but 3/4
    # of every GPU's bytes go over its 200 GB/s NVLink: 1 / max(1 / 400e9, 3 / 800e9)
    # = 800e9 / 3
    hw = make_hw()
    fast = HardwareProfile(**{**hw.__dict__, "nic_bw": 200 * GB})
    assert fast.eff_allreduce_bw == pytest.approx(800e9 / 3, rel=REL)
    assert make_hw(hosts=1).eff_allreduce_bw == pytest.approx(200e9, rel=REL)


def test_traffic_cost_allreduce_single_host_uses_nvlink():
    # one host: ring runs over NVLink, 100e6 / 200e9 = 5e-4 s
    c = traffic_cost(_bytes(allreduce=100e6), make_hw(hosts=1))
    assert c.allreduce == pytest.approx(5e-4, rel=REL)


def test_traffic_cost_overhead_only_for_empty_piece():
    # no bytes: only the fixed per-piece overhead, charged on lookup
    c = traffic_cost(_bytes(), make_hw(overhead_s=3e-6))
    assert c.lookup == pytest.approx(3e-6, rel=REL)
    assert c.backward == 0 and c.cache_miss == 0 and c.comm == 0


def test_piece_cost_table_wise_end_to_end():
    # TW piece, fp32, SGD, HBM (see test_traffic_table_wise, with state 0 B):
    #   hbm_fwd 6400, hbm_bwd U * 2 * 32 + 5120 (gradients), ids + lengths 600/800,
    #   out fwd 960/1280, out bwd 480/640
    hw = make_hw(overhead_s=1e-6)
    model = make_model()
    c = piece_cost(make_table(), ShardingType.TABLE_WISE, Tier.HBM, 0.0, 1000, 8, hw, model)
    # lookup = 6400 / 500e9 + 1e-6 = 1.28e-8 + 1e-6
    assert c.lookup == pytest.approx(1.28e-8 + 1e-6, rel=REL)
    # backward = (U * 64 + 5120) / 500e9
    assert c.backward == pytest.approx((uniq(1000, 160) * 64 + 5120) / 500e9, rel=REL)
    assert c.cache_miss == 0
    # input = 600 / 200e9 + 800 / 20e9 = 3e-9 + 4e-8
    assert c.input_a2a == pytest.approx(3e-9 + 4e-8, rel=REL)
    # output = (960 + 480) / 200e9 + (1280 + 640) / 20e9 = 7.2e-9 + 9.6e-8
    assert c.output_a2a == pytest.approx(7.2e-9 + 9.6e-8, rel=REL)
    assert c.allreduce == 0


def test_piece_cost_ssd_tier_end_to_end():
    # from test_tier_ssd_small_rows_cost_a_page: host 5120 + U * 72 B, ssd 983040 B, ids read
    # 1280, gradient reads 5120 in HBM
    hw = make_hw()
    table = make_table(optimizer=Optimizer.ROWWISE_ADAGRAD)
    c = piece_cost(table, ShardingType.TABLE_WISE, Tier.SSD, 0.25, 1000, 8, hw, make_model())
    # cache_miss = host / 25e9 + 983040 / 1e9
    host = 5120 + uniq(1000, 160) * 72
    assert c.cache_miss == pytest.approx(host / 25e9 + 9.8304e-4, rel=REL)
    # lookup = 1280 / 500e9 = 2.56e-9 (no overhead here); backward 5120 / 500e9
    assert c.lookup == pytest.approx(2.56e-9, rel=REL)
    assert c.backward == pytest.approx(5120 / 500e9, rel=REL)


def test_cost_breakdown_add_and_total():
    a = CostBreakdown(lookup=1, backward=2, cache_miss=3, input_a2a=4, output_a2a=5, allreduce=6)
    b = CostBreakdown(
        lookup=10, backward=20, cache_miss=30, input_a2a=40, output_a2a=50, allreduce=60
    )
    s = a + b
    assert (s.lookup, s.backward, s.cache_miss) == (11, 22, 33)
    assert (s.input_a2a, s.output_a2a, s.allreduce) == (44, 55, 66)
    # a: compute 1+2+3 = 6, comm 4+5+6 = 15; total 21; pipelined, the input all-to-all (4)
    # hides behind the rest: 15 + max(0, 6 - 4) = 17
    assert a.compute == 6
    assert a.comm == 15
    assert a.total(pipelined=False, overlap=1.0) == 21
    assert a.total(pipelined=True, overlap=1.0) == 17
    # compute-bound when pipelined: 3 + (32 - 1) = 34, one below the sequential 35
    c = CostBreakdown(lookup=30, backward=1, cache_miss=1, input_a2a=1, output_a2a=1,
                      allreduce=1)
    assert c.total(pipelined=True, overlap=1.0) == 34
    assert c.total(pipelined=False, overlap=1.0) == 35
    # an input all-to-all longer than the compute: the links' load, comm 5 + 1 + 4 = 10
    d = CostBreakdown(lookup=1, backward=1, input_a2a=5, output_a2a=1, allreduce=4)
    assert d.total(pipelined=True, overlap=1.0) == 10
    assert d.total(pipelined=False, overlap=1.0) == 12
    # pipeline_overlap: the share of the input all-to-all the step hides. a: 15 + max(0, 6 -
    # 0.5 * 4) = 19; c: 3 + (32 - 0.5) = 34.5; at 0 a pipelined step is the sequential one
    assert a.total(pipelined=True, overlap=0.5) == 19
    assert c.total(pipelined=True, overlap=0.5) == 34.5
    for x in (a, c, d):
        assert x.total(pipelined=True, overlap=0.0) == x.total(pipelined=False, overlap=1.0)
    # empty breakdown is the identity
    assert CostBreakdown() + a == a


# --------------------------------------------------------------------------------------------
# 6. memory (fp32 row 32 B, rowwise Adagrad state 4 B, metadata 16 B)
# --------------------------------------------------------------------------------------------


def test_memory_hbm():
    table = make_table(optimizer=Optimizer.ROWWISE_ADAGRAD)
    m = piece_memory(table, Tier.HBM, 0.0, 1000, 8, make_hw())
    # 1000 rows * (32 + 4) = 36000 B in HBM
    assert (m.hbm, m.ddr, m.ssd) == (36000, 0, 0)


def test_memory_hbm_cache():
    table = make_table(optimizer=Optimizer.ROWWISE_ADAGRAD)
    m = piece_memory(table, Tier.HBM_CACHE, 0.1, 1000, 8, make_hw())
    # cache int(0.1 * 1000) = 100 slots * (32 row + 16 metadata) = 4800 B in HBM;
    # whole table + state in DDR: 1000 * 36 = 36000, plus the eviction policy's int64 per
    # row (LFU counts, LRU stamps): 1000 * 8 = 8000
    assert (m.hbm, m.ddr, m.ssd) == (4800, 36000 + 8000, 0)


def test_memory_hbm_cache_at_least_one_row():
    table = make_table(optimizer=Optimizer.ROWWISE_ADAGRAD)
    m = piece_memory(table, Tier.HBM_CACHE, 0.0001, 1000, 8, make_hw())
    # int(0.0001 * 1000) = int(0.1) = 0 -> at least 1 slot: 1 * (32 + 16) = 48
    assert (m.hbm, m.ddr, m.ssd) == (48, 36000 + 1000 * 8, 0)  # + the policy's int64 per row


def test_memory_ddr():
    table = make_table(optimizer=Optimizer.ROWWISE_ADAGRAD)
    m = piece_memory(table, Tier.DDR, 0.5, 1000, 8, make_hw())
    # whole table + state in DDR: 36000
    assert (m.hbm, m.ddr, m.ssd) == (0, 36000, 0)


def test_memory_ssd():
    table = make_table(optimizer=Optimizer.ROWWISE_ADAGRAD)
    m = piece_memory(table, Tier.SSD, 0.1, 1000, 8, make_hw())
    # DDR cache: 100 rows * (32 + 4 + 16) = 5200, plus the policy's int64 per row of the
    # piece 1000 * 8 = 8000; SSD: whole table + state 36000
    assert (m.hbm, m.ddr, m.ssd) == (0, 5200 + 8000, 36000)


def test_memory_uses_piece_shape():
    # 250-row x 4-col piece of a 1000 x 16 fp16 Adam table:
    # row 4 * 2 = 8 B, state 2 * 4 * 4 = 32 B -> 250 * 40 = 10000 B
    table = make_table(dim=16, data_type=DataType.FP16, optimizer=Optimizer.ADAM)
    m = piece_memory(table, Tier.HBM, 0.0, 250, 4, make_hw())
    assert (m.hbm, m.ddr, m.ssd) == (10000, 0, 0)
    # hbm_cache 20%: int(0.2 * 250) = 50 slots * (8 + 16) = 1200 in HBM, 10000 in DDR
    m = piece_memory(table, Tier.HBM_CACHE, 0.2, 250, 4, make_hw())
    assert (m.hbm, m.ddr, m.ssd) == (1200, 10000 + 250 * 8, 0)  # + policy int64 per row


def test_memory_footprint_adds():
    table = make_table(optimizer=Optimizer.ROWWISE_ADAGRAD)
    hw = make_hw()
    s = piece_memory(table, Tier.HBM, 0.0, 1000, 8, hw) + piece_memory(
        table, Tier.SSD, 0.1, 1000, 8, hw
    )
    # (36000, 0, 0) + (0, 5200 + 8000, 36000)
    assert (s.hbm, s.ddr, s.ssd) == (36000, 13200, 36000)


def test_owner_side_wait_by_hand() -> None:
    """2 hosts x 2 GPUs, b = 10 samples, NIC 100 B/s. Host 0's pieces carry owner bytes per
    sample (ids, fwd, bwd) = (1, 4, 0), host 1's (3, 0, 2): an owner on host 0 exchanges
    b * (host 1's) = (30, 0, 20) bytes over its NIC, one on host 1 b * (host 0's) =
    (10, 40, 0). GPU 0's own pieces already move (50, 0, 5) inter-host bytes, GPU 2's
    (0, 10, 0); GPUs 1 and 3 hold nothing."""
    from cost_models import owner_wait

    piece_inter = np.array([[50.0, 0, 5], [0, 0, 0], [0, 10, 0], [0, 0, 0]])
    host_rate = np.array([[1.0, 4, 0], [3, 0, 2]])
    wait = owner_wait(piece_inter, host_rate, np.array([0, 0, 1, 1]), 10, 100.0)
    # GPU 0: max(0, 30-50) + max(0, 0-0) + max(0, 20-5) = 15 bytes; GPU 1: 30 + 0 + 20 = 50;
    # GPU 2: 10 + (40-10) + 0 = 40; GPU 3: 10 + 40 + 0 = 50.
    assert wait.tolist() == pytest.approx([0.15, 0.5, 0.4, 0.5])
    one_host = owner_wait(piece_inter[:2], host_rate[:1], np.array([0, 0]), 10, 100.0)
    assert one_host.tolist() == [0.0, 0.0]  # nothing crosses a NIC on one host


def test_owner_bytes_per_sample_by_hand() -> None:
    """What the owner of one sample exchanges with a piece (placement.py reads these).
    Table: 1000 rows, dim 8, pooling 2, ids 8 B, bag lengths 4 B; fwd fp32 (32 B a row of 8),
    bwd fp16 (16 B). A table-wise piece: the sample's 2 ids (16 B) and its bag length (4 B),
    one pooled vector each way. A row-wise piece of 250 rows: a quarter of the ids (4 B) and
    a bag length (4 B, even when empty), a partial sum each way. A table-row-wise piece
    (4 GPUs per host): its ids and a length, and a quarter of the one vector its host
    reduces."""
    tab = make_table()
    tw = traffic(tab, ShardingType.TABLE_WISE)
    check_traffic(tw, owner_ids=20.0, owner_out_fwd=32.0, owner_out_bwd=16.0)
    rw = traffic(tab, ShardingType.ROW_WISE, rows=250)
    check_traffic(rw, owner_ids=8.0, owner_out_fwd=32.0, owner_out_bwd=16.0)
    twrw = traffic(tab, ShardingType.TABLE_ROW_WISE, rows=250)
    check_traffic(twrw, owner_ids=8.0, owner_out_fwd=8.0, owner_out_bwd=4.0)
    dp = traffic(tab, ShardingType.DATA_PARALLEL)
    check_traffic(dp, owner_ids=0.0, owner_out_fwd=0.0, owner_out_bwd=0.0)


def test_step_buffers_positional_copies_match_their_fields() -> None:
    """with_workspace and + build StepBuffers positionally: the field order they assume is
    the dataclass's (dataclasses.replace and a per-field sum are the reference)."""
    import dataclasses

    from cost_models.memory import StepBuffers

    names = [f.name for f in dataclasses.fields(StepBuffers)]
    a = StepBuffers(*range(1, len(names) + 1))
    b = StepBuffers(*(100 * k for k in range(1, len(names) + 1)))
    assert a.with_workspace(7) == dataclasses.replace(a, workspace=7)
    assert a + b == StepBuffers(**{n: getattr(a, n) + getattr(b, n) for n in names})


def test_device_cache_serves_the_share_of_rows_that_fit():
    """An hbm piece whose rows half fit the device cache reads half its HBM bytes at the
    cache's speed (forward factor 5, backward 2); with no cache (the presets) nothing
    changes; other tiers never use it."""
    import dataclasses

    base = make_hw()
    t = make_table(rows=1000, dim=8, optimizer=Optimizer.ADAGRAD)
    row_f = weight_row_bytes(t.data_type, 8)
    row_b = row_f + optimizer_state_row_bytes(t.optimizer, 8)
    hw = dataclasses.replace(base, constants=dataclasses.replace(
        base.constants, device_cache_bytes=500 * row_f, device_cache_fwd_factor=5.0,
        device_cache_bwd_factor=2.0))
    plain = traffic(t, ShardingType.TABLE_WISE, hw=base)
    cached = traffic(t, ShardingType.TABLE_WISE, hw=hw)
    assert plain.resident_fwd == plain.resident_bwd == 0.0
    assert cached.resident_fwd == pytest.approx(0.5)
    assert cached.resident_bwd == pytest.approx(500 * row_f / (1000 * row_b))
    a, b = traffic_cost(plain, base), traffic_cost(cached, hw)
    # lookup bytes: half at full time, half at a fifth: 0.6 of the time
    assert b.lookup == pytest.approx(0.6 * a.lookup, rel=REL)
    f = cached.resident_bwd
    assert b.backward == pytest.approx((1 - f + f / 2) * a.backward, rel=REL)
    assert traffic(t, ShardingType.TABLE_WISE, Tier.DDR, hw=hw).resident_fwd == 0.0
