"""The executor's parts on their own, without launching ranks."""

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cost_models import Tier, ZipfAccess  # noqa: E402
from cost_models.access import CurveAccess  # noqa: E402
from cost_models.sizes import comm_row_bytes  # noqa: E402
from cost_models.types import CommPrecision  # noqa: E402
from planner.check import check_plan  # noqa: E402
from planner.executor import quant, synthetic  # noqa: E402
from planner.executor.demo import all_types_plan  # noqa: E402
from planner.executor.layout import exec_layout  # noqa: E402
from planner.executor.predict import predict  # noqa: E402
from planner.executor.rank import stage_items  # noqa: E402
from planner.executor.scale import scaled_plan  # noqa: E402
from planner.executor.store import CachedStore, DenseStore  # noqa: E402

# Largest rounding error of one element, relative to its row's largest |value|.
ROUNDING = {CommPrecision.FP16: 2**-11, CommPrecision.BF16: 2**-8,
            CommPrecision.INT8: 1 / 254, CommPrecision.FP8: 2**-4}


@pytest.mark.parametrize("precision", list(CommPrecision))
def test_wire_format_has_the_cost_models_size_and_bounded_error(precision):
    g = torch.Generator().manual_seed(0)
    x = torch.randn((37, 12), generator=g) * torch.logspace(-3, 3, 37)[:, None]
    x[5] = 0.0
    buf = quant.encode(x, precision)
    assert buf.dtype == torch.uint8
    assert buf.numel() == 37 * comm_row_bytes(precision, 12)
    y = quant.decode(buf, 37, 12, precision)
    if precision is CommPrecision.FP32:
        assert torch.equal(x, y)
        return
    amax = x.abs().amax(dim=1, keepdim=True)
    err = (y - x).abs()
    if precision in (CommPrecision.FP16, CommPrecision.BF16):
        # fp16 below 2^-14 is subnormal: an absolute step of 2^-24, half of it at most.
        assert bool((err <= ROUNDING[precision] * x.abs() + 2**-25).all())
    else:
        assert bool((err <= ROUNDING[precision] * amax * 1.0001).all())
    assert torch.equal(y[5], torch.zeros(12))


def test_scaled_plan_keeps_the_shape_and_passes_the_checker():
    plan = all_types_plan()
    small = scaled_plan(plan, 0.5, batch=8)
    assert check_plan(small).ok, check_plan(small).errors
    assert small.request.model.batch_size_per_gpu == 8
    for a, b in zip(plan.tables, small.tables, strict=True):
        assert (a.sharding_type, a.tier, a.cache_ratio) == (b.sharding_type, b.tier,
                                                            b.cache_ratio)
        assert [(p.rank, p.col_offset, p.col_count) for p in a.pieces] == [
            (p.rank, p.col_offset, p.col_count) for p in b.pieces]
    rows = {t.name: t.num_embeddings for t in small.request.model.tables}
    assert rows["rw_ddr"] == 50 and rows["zipf_cache"] == 1000
    rw = next(t for t in small.tables if t.name == "rw_ddr")
    assert sorted(p.row_count for p in rw.pieces) == [12, 12, 13, 13]
    assert scaled_plan(plan) is plan


def test_bytes_of_the_wire_plan_equal_piece_traffic():
    """The executor's message list, before any run: per piece, the vectors it sends forward
    (both stages of table-row-wise and grid) times comm_row_bytes equal the model's
    out_fwd_intra + out_fwd_inter."""
    plan = all_types_plan("int8", "fp16", batch=16)
    lay = exec_layout(plan)
    first, second = stage_items(lay)
    sent: dict[str, int] = {}
    for it in first + second:
        sent[it.piece.key] = sent.get(it.piece.key, 0) + it.rows * comm_row_bytes(
            CommPrecision.INT8, it.piece.cols)
    _, pieces = predict(plan)
    for pp in pieces:
        if pp.kind == "data_parallel":
            continue
        assert sent[pp.key] == pp.out_fwd_bytes, pp


@pytest.mark.parametrize("access", [ZipfAccess(1.05), ZipfAccess(0.7),
                                    CurveAccess(((0.1, 0.6), (0.5, 0.9)))])
def test_ids_follow_the_access_curve_the_hit_rate_model_reads(access):
    rows, n = 5000, 400_000
    rng = np.random.default_rng(1)
    ranks = synthetic.popularity_ranks(access, rows, n, rng)
    counts = np.bincount(ranks, minlength=rows)
    for cached in (50, 500, 2500):
        top = np.sort(counts)[::-1][:cached].sum() / n
        assert abs(top - access.hit_rate(cached, rows)) < 0.01
    # The bijection from popularity rank to row spreads hot rows over every quarter.
    ids = synthetic.rank_to_row(np.arange(100), rows, table=3)
    assert len(set(ids.tolist())) == 100
    assert all(np.sum((ids >= q * 1250) & (ids < (q + 1) * 1250)) >= 15 for q in range(4))


def test_initial_weights_are_the_same_whichever_piece_asks():
    full = synthetic.init_weights(7, 2, 16, 0, 100, 0, 16)
    part = synthetic.init_weights(7, 2, 16, 40, 20, 4, 8)
    assert np.array_equal(full[40:60, 4:12], part)
    assert not np.array_equal(full, synthetic.init_weights(8, 2, 16, 0, 100, 0, 16))


@pytest.mark.parametrize(("tier", "policy"), [(Tier.HBM_CACHE, "lfu"), (Tier.SSD, "lfu"),
                                              (Tier.HBM_CACHE, "lru")])
def test_cached_store_computes_what_a_plain_store_does(tmp_path: Path, tier, policy):
    """Write-back caching changes where rows live, never their values."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn((200, 6), generator=g)
    s = torch.zeros((200, 1))
    plain = DenseStore(w.clone(), s.clone(), Tier.HBM, torch.device("cpu"))
    cached = CachedStore(w.clone(), s.clone(), tier, 0.1, torch.device("cpu"), policy,
                         tmp_path / "piece")
    assert cached.slots == 20
    rng = np.random.default_rng(0)
    for _ in range(30):
        ids = torch.from_numpy(synthetic.popularity_ranks(ZipfAccess(1.2), 200, 64, rng))
        assert torch.equal(plain.read(ids), cached.read(ids))
        uniq = torch.unique(ids)
        delta = torch.randn((uniq.numel(), 6), generator=g)

        def fn(wr, sr, d=delta):
            return wr + d, sr + 1.0
        plain.update(uniq, fn)
        cached.update(uniq, fn)
        cached.end_step()
    pw, ps = plain.dump()
    cw, cs = cached.dump()
    assert torch.equal(pw, cw) and torch.equal(ps, cs)
    assert cached.hits > 0.4 * cached.lookups  # zipf 1.2: the hot rows stay cached
    held = cached.memory()
    meta = 16 * 20
    if tier is Tier.SSD:
        assert (held.ddr, held.ssd) == (20 * (24 + 4) + meta, 200 * 28)
    else:
        assert (held.hbm, held.ddr) == (20 * 24 + meta, 200 * 28)


def test_reference_shares_no_code_with_the_ranks():
    """reference.py imports none of the ranks' arithmetic (kernels, quant, rank, store,
    comm, stored): a bug there cannot be on both sides of the check."""
    import ast

    import planner.executor.reference as ref

    tree = ast.parse(Path(ref.__file__).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
            names.update(f"{node.module}.{a.name}" for a in node.names)
    shared = {f"planner.executor.{m}" for m in ("kernels", "quant", "rank", "store", "comm",
                                                "stored")}
    assert not names & shared, names & shared
