"""Candidate enumeration's shortcuts (planner/candidates.py) give what costing every piece
afresh gives: the shape cache keyed by the type's class, and the per-problem enumeration
memo."""

import dataclasses

import pytest

from cost_models import ShardingType, Tier, piece_memory, piece_traffic, placed_piece_buffers
from planner.candidates import _KIND_CLASS, enumerate_candidates
from planner.plan_build import shape_figures
from planner.planning import build_problem, resolve
from tests.conftest import small_model

_TABLES = [
    {"name": "zipf", "num_embeddings": 200_000, "embedding_dim": 64, "pooling_factor": 7.5,
     "access_frequency": {"kind": "zipf", "alpha": 1.1}},
    {"name": "uniform", "num_embeddings": 50_000, "embedding_dim": 128, "pooling_factor": 2.0,
     "optimizer": "adam"},
    {"name": "curve", "num_embeddings": 1_000_003, "embedding_dim": 32, "pooling_factor": 20.0,
     "access_frequency": {"kind": "curve", "points": [[0.01, 0.4], [0.1, 0.8]]}},
    {"name": "features", "num_embeddings": 300_000, "embedding_dim": 64,
     "features": [{"name": "f1", "pooling_factor": 3.0},
                  {"name": "f2", "pooling_factor": 1.0, "batch_size_per_gpu": 256}]},
    {"name": "sequence", "num_embeddings": 80_000, "embedding_dim": 32, "pooling_factor": 4.0,
     "pooling_mode": "none", "access_frequency": {"kind": "zipf", "alpha": 0.9}},
]


@pytest.fixture(scope="module")
def problem():
    return build_problem(resolve({"model": small_model(_TABLES),
                                  "hardware": {"preset": "h100", "hosts": 2}}))


def test_types_of_one_class_cost_alike(problem) -> None:
    """The shape cache shares a piece's costing between the types of one _KIND_CLASS: the
    cost model must read nothing else of the type."""
    tiers = [(Tier.HBM, 1.0), (Tier.HBM_CACHE, 0.05), (Tier.DDR, 1.0), (Tier.SSD, 0.1)]
    by_class: dict[tuple[bool, bool], list[ShardingType]] = {}
    for kind, klass in _KIND_CLASS.items():
        by_class.setdefault(klass, []).append(kind)
    assert len(by_class[(False, False)]) >= 4  # table-, column-, table-column-, row-wise
    for t in problem.tables:
        g = t.geom
        for tier, ratio in tiers:
            for rows, cols in ((g.rows, g.dim), (g.rows // 8 + 1, g.dim // 2)):
                for kinds in by_class.values():
                    first = kinds[0]
                    want = (piece_traffic(g, first, tier, ratio, rows, cols, problem.hw,
                                          problem.model),
                            placed_piece_buffers(g, first, tier, ratio, rows, cols, problem.hw,
                                                 problem.model),
                            shape_figures(problem, t, first, tier, ratio, rows, cols))
                    for kind in kinds[1:]:
                        got = (piece_traffic(g, kind, tier, ratio, rows, cols, problem.hw,
                                             problem.model),
                               placed_piece_buffers(g, kind, tier, ratio, rows, cols,
                                                    problem.hw, problem.model),
                               shape_figures(problem, t, kind, tier, ratio, rows, cols))
                        assert got == want, (t.name, kind, first, tier, rows, cols)
                assert piece_memory(g, tier, ratio, rows, cols, problem.hw) is not None


def test_candidate_figures_are_each_shapes_own(problem) -> None:
    """Every candidate's figures (slow tiers included) equal plan_build's costing of that
    shape with the candidate's own type, tier and cache ratio, to the bit."""
    for t in problem.tables:
        for c in enumerate_candidates(problem, t, slow_tiers=True):
            assert c.figures is not None
            for (rows, cols), fig in c.figures.items():
                assert fig == tuple(shape_figures(problem, t, c.kind, c.tier, c.cache_ratio,
                                                  rows, cols)), (t.name, c.label)


def test_enumeration_is_memoized_per_problem(problem) -> None:
    t = problem.tables[0]
    first = enumerate_candidates(problem, t, slow_tiers=True)
    again = enumerate_candidates(problem, t, slow_tiers=True)
    assert again is not first and again == first  # the same candidates, a list of its own
    assert all(a is b for a, b in zip(first, again, strict=True))
    # Not the problem's own table object: enumerated afresh, to the same figures.
    copy = dataclasses.replace(t)
    fresh = enumerate_candidates(problem, copy, slow_tiers=True)
    assert [c.dominance_key() for c in fresh] == [c.dominance_key() for c in first]
    assert not any(a is b for a, b in zip(first, fresh, strict=True))
    # Another problem of the same request has its own enumeration.
    other = build_problem(problem.request)
    theirs = enumerate_candidates(other, other.tables[0], slow_tiers=True)
    assert not any(a is b for a, b in zip(first, theirs, strict=True))
    assert [c.dominance_key() for c in theirs] == [c.dominance_key() for c in first]


def test_exact_products_sum_as_the_pieces() -> None:
    """_Costed sums a group's pieces by shape: x repeated n times is given to math.fsum as
    Dekker's exact product (or x itself n times), so the correctly rounded sum is the same."""
    import math
    import random

    from planner.candidates import _times

    rng = random.Random(7)
    for _ in range(20_000):
        vals: list[float] = []
        parts: list[float] = []
        for _ in range(rng.randint(1, 4)):
            x = rng.random() * 10.0 ** rng.choice([-300, -12, -9, -6, -3, 0, 3, 250])
            n = rng.choice([1, 2, 3, 8, 127, 1024, 1025, rng.randint(1, 5000)])
            vals += [x] * n
            parts += _times(x, n)
        assert math.fsum(parts) == math.fsum(vals)


@pytest.mark.parametrize(("fixture", "hosts", "hbm"), [
    ("criteo_kaggle", 1, None), ("deeprecsys_rm3", 2, "800MiB"), ("hugectr_200", 2, "4GiB"),
    ("criteo_dcnv2", 1, "1536MiB"), ("zionex_12t", 2, None)])
def test_least_bytes_are_the_costed_candidates_minima(fixture: str, hosts: int,
                                                       hbm: str | None) -> None:
    """least_bytes (bytes alone, nothing costed) gives each axis' least over the costed,
    Pareto-filtered every-tier candidates, and None exactly where none fits; small HBM caps
    leave some candidates unfit, so the fit test is exercised too."""
    from planner.candidates import least_bytes
    from tests.conftest import fixture_request

    req = fixture_request(fixture, hosts)
    if hbm is not None:
        req["hardware"]["overrides"] = {"gpu": {"hbm_capacity_bytes": hbm,
                                                "hbm_reserved_bytes": "512MiB"}}
    problem = build_problem(resolve(req))
    # The candidates come from a problem of their own: no memoized costs shared.
    costed = build_problem(resolve(req))
    unfit = 0
    for t, u in list(zip(problem.tables, costed.tables, strict=True))[:120]:
        least = least_bytes(problem, t)
        every = enumerate_candidates(costed, u, slow_tiers=True)
        kept = enumerate_candidates(costed, u, slow_tiers=True, keep_unfit=True)
        unfit += any(c.max_piece_hbm > costed.hw.hbm_cap for c in kept)
        if least is None:
            assert every == []
            continue
        assert (least.hbm, least.ddr, least.ssd, least.total) == (
            min(c.hbm_total for c in every), min(c.ddr_total for c in every),
            min(c.ssd_total for c in every), min(c.total_bytes for c in every))
        assert least.candidates >= len(every)
    if hbm is not None:
        assert unfit > 0, "the small HBM left every candidate fitting: the test lost its edge"


def test_column_splits_take_every_equal_aligned_divisor() -> None:
    """dim 96 at the default 32 columns splits into 3 chunks too (the checker accepts them;
    the grid took powers of two only); power-of-two dims keep the splits they had."""
    from planner.candidates import column_splits

    assert column_splits(96, 32, 8) == [2, 3]
    assert column_splits(192, 32, 4) == [2, 3, 4]
    assert column_splits(128, 32, 1024) == [2, 4]
    assert column_splits(256, 16, 8) == [2, 4, 8]
    assert column_splits(100, 32, 8) == []  # 50 columns are not a multiple of 4
    from planner import plan

    p = plan({"model": {"batch_size_per_gpu": 512, "tables": [
        {"name": "a", "num_embeddings": 1_000_000, "embedding_dim": 96, "pooling_factor": 8.0,
         "constraints": {"sharding_types": ["column_wise"]}}]},
        "hardware": {"preset": "h100", "hosts": 1}})
    assert sorted({x.col_count for x in p.tables[0].pieces}) in ([32], [48])
