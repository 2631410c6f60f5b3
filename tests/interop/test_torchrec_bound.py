"""The lower bound under TorchRec's estimators (benchmarks/torchrec_bound.py): below every
plan it should bound, at least its two simple bounds, exact where it is known by hand."""

import math

import pytest

pytest.importorskip("torchrec")

import planner
from benchmarks.torchrec_bound import all_options, torchrec_lower_bound
from planner.interop import (
    TorchRecProblem,
    export_from_sharding_plan,
    score_with_torchrec,
    to_torchrec,
)
from planner.planning import resolve
from tests.interop.interop_helpers import HARDWARE

pytestmark = pytest.mark.usefixtures("quiet_torchrec")


def _request(tables, gpus):
    hw = dict(HARDWARE, hosts=1, gpus_per_host=gpus)
    return resolve({"model": {"batch_size_per_gpu": 256, "tables": tables}, "hardware": hw})


def _table(name, rows, dim, pooling):
    return {"name": name, "num_embeddings": rows, "embedding_dim": dim,
            "pooling_factor": pooling}


def _torchrec_plan_ms(problem, req):
    g = req.hardware.gpus_per_host
    exp = export_from_sharding_plan(problem.plan(), req.hardware.hosts * g, g)
    return score_with_torchrec(problem, exp).step_ms


def _fitting(problem):
    cap = problem.topology.devices[0].storage.hbm
    by = {}
    for o in all_options(problem):
        by.setdefault(o.name, [])
        if all(s.storage.hbm <= cap for s in o.shards):
            by[o.name].append([s.perf.total for s in o.shards])
    return by


def test_bound_is_below_both_plans_and_above_its_simple_bounds():
    req = _request([_table("big", 200_000, 128, 20.0), _table("mid", 50_000, 64, 8.0),
                    _table("small", 2_000, 32, 2.0)], gpus=4)
    problem = TorchRecProblem.of(req)
    b = torchrec_lower_bound(problem)
    world = problem.topology.world_size

    # (a) below TorchRec's own plan and our exported plan, both scored by its estimators.
    torchrec_ms = _torchrec_plan_ms(problem, req)
    ours = to_torchrec(planner.plan(req))
    assert not ours.by_status("inexpressible")
    ours_ms = score_with_torchrec(problem, ours).step_ms
    assert 0 < b.bound_ms <= torchrec_ms * (1 + 1e-12)
    assert b.bound_ms <= ours_ms * (1 + 1e-12)

    # (b) at least sum of least work / W and the largest least-largest-shard, recomputed.
    by = _fitting(problem)
    assert set(by) == {"big", "mid", "small"}
    work = math.fsum(min(math.fsum(p) for p in opts) for opts in by.values()) / world
    piece = max(min(max(p) for p in opts) for opts in by.values())
    assert b.work_bound_ms == pytest.approx(work, rel=1e-12)
    assert b.piece_bound_ms == pytest.approx(piece, rel=1e-12)
    assert b.bound_ms >= max(work, piece) * (1 - 1e-12)

    # The bisection finds the exact threshold: with f(T) the least total work of options
    # whose largest shard is <= T, the smallest T with f(T) <= T * W is the least, over
    # breakpoints v (largest shards), of max(v, f(v) / W).
    exact = math.inf
    for v in sorted({max(p) for opts in by.values() for p in opts}):
        least = [min((math.fsum(p) for p in opts if max(p) <= v), default=None)
                 for opts in by.values()]
        if None not in least:
            exact = min(exact, max(v, math.fsum(least) / world))
    assert b.bound_ms == pytest.approx(exact, rel=1e-9)
    assert b.bound_ms <= exact


def test_bound_covers_what_torchrec_enumerates():
    req = _request([_table("a", 10_000, 64, 4.0)], gpus=2)
    problem = TorchRecProblem.of(req)
    enumerated = problem.enumerator().enumerate(problem.module, problem.sharders)
    ours = all_options(problem)
    key = lambda o: (o.sharding_type, o.compute_kernel, o.cache_load_factor,  # noqa: E731
                     tuple(tuple(s.size) for s in o.shards))
    assert {key(o) for o in enumerated} <= {key(o) for o in ours}
    kernels = {o.compute_kernel for o in ours}
    assert {"fused", "fused_uvm_caching", "fused_uvm", "key_value", "dense"} <= kernels


def test_bound_is_exact_on_one_gpu():
    """On one GPU every shard of every table lands on it, so a plan's time is the sum over
    tables of its options' total work: the best plan takes each table's least-work option
    that fits, the bound is that sum, and TorchRec's planner finds that plan."""
    req = _request([_table("a", 100_000, 64, 10.0), _table("b", 30_000, 32, 3.0)], gpus=1)
    problem = TorchRecProblem.of(req)
    b = torchrec_lower_bound(problem)
    enumerated = problem.enumerator().enumerate(problem.module, problem.sharders)
    cap = problem.topology.devices[0].storage.hbm
    best = {}
    for o in enumerated:
        if all(s.storage.hbm <= cap for s in o.shards):
            work = math.fsum(s.perf.total for s in o.shards)
            best[o.name] = min(best.get(o.name, math.inf), work)
    assert b.bound_ms == pytest.approx(best["a"] + best["b"], rel=1e-12)
    assert b.bound_ms == pytest.approx(_torchrec_plan_ms(problem, req), rel=1e-12)
    assert b.bound_ms == pytest.approx(b.work_bound_ms, rel=1e-12)
