"""Latency terms (alpha-beta collectives, launches) and per-batch unique rows: the formulas
against counts, and the terms where a plan and the checker show them."""

import math

import numpy as np
import pytest
import torch

from cost_models import (
    CostConstants,
    HardwareProfile,
    UniformAccess,
    ZipfAccess,
    step_fixed,
    traffic_cost,
)
from cost_models.traffic import PieceTraffic
from cost_models.unique_rows import piece_unique_rows, unique_rows, unique_rows_hot
from planner import plan
from planner.check import check_plan
from planner.executor import kernels
from planner.hashing import plan_hash_of
from planner.plan_model import Plan
from tests.conftest import fixture_request


def _distinct_mc(p: np.ndarray, k: int, trials: int, seed: int) -> tuple[float, float]:
    """(mean, standard error) of the distinct rows among k draws from p, over trials."""
    rng = np.random.default_rng(seed)
    counts = [np.unique(rng.choice(len(p), size=k, p=p)).size for _ in range(trials)]
    return float(np.mean(counts)), float(np.std(counts) / math.sqrt(trials))


@pytest.mark.parametrize(("access", "rows", "k"), [
    (UniformAccess(), 1000, 800),
    (UniformAccess(), 50, 500),
    (ZipfAccess(1.1), 5000, 3000),
    (ZipfAccess(0.8), 20000, 10000),
])
def test_unique_rows_against_monte_carlo(access: object, rows: int, k: int) -> None:
    if isinstance(access, ZipfAccess):
        p = np.arange(1, rows + 1, dtype=np.float64) ** -access.alpha
        p /= p.sum()
    else:
        p = np.full(rows, 1.0 / rows)
    mean, se = _distinct_mc(p, k, 300, seed=rows)
    model = unique_rows(access, rows, float(k))
    assert abs(model - mean) <= 4 * se + 1e-9, (model, mean, se)
    if isinstance(access, UniformAccess):
        assert model == pytest.approx(rows * (1 - (1 - 1 / rows) ** k), rel=1e-12)


def test_unique_rows_bucketed_tail_matches_the_exact_sum() -> None:
    # 300,000 zipf rows: the head is summed row by row, the tail as a bucketed integral.
    rows, alpha, k = 300_000, 1.05, 200_000.0
    p = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
    p /= p.sum()
    exact = float(np.sum(-np.expm1(k * np.log1p(-p))))
    assert unique_rows(ZipfAccess(alpha), rows, k) == pytest.approx(exact, rel=1e-6)


def test_unique_rows_bounds_and_piece_share() -> None:
    assert unique_rows(UniformAccess(), 10, 1e9) == pytest.approx(10.0)
    assert unique_rows(UniformAccess(), 10**9, 5.0) <= 5.0
    assert piece_unique_rows(UniformAccess(), 1000, 800, 0.25) == pytest.approx(
        0.25 * unique_rows(UniformAccess(), 1000, 800))


def test_executor_backward_updates_each_unique_row_once() -> None:
    # What the model counts (traffic.py): the optimizer sees one gradient per distinct id.
    ids = torch.tensor([3, 1, 3, 3, 7, 1, 0])
    offsets = torch.tensor([0, 2, 5])
    grad = torch.ones(3, 4)
    uniq, g = kernels.row_grads_bags(ids, offsets, grad)
    assert uniq.tolist() == [0, 1, 3, 7]
    assert g.shape == (4, 4)
    assert g[:, 0].tolist() == [1.0, 2.0, 3.0, 1.0]  # row 3: three lookups, one update
    # The unique rows hold storage of their own size (CUDA's unique returns a view of an
    # input-sized buffer, which the memory model does not count through the optimizer step).
    # On CPU unique's storage is its own size already, so this cannot fail here: the guard is
    # the test below and the GPU runs (benchmarks/results/gpu_h200.md, runs 3 and 4).
    assert uniq.untyped_storage().nbytes() == uniq.nbytes


def test_compact_copies_only_views_of_a_larger_buffer() -> None:
    big = torch.arange(10)
    view = big[:3]
    out = kernels.compact(view)
    assert out.tolist() == [0, 1, 2] and out.untyped_storage().nbytes() == out.nbytes == 24
    own = torch.tensor([4, 5])
    assert kernels.compact(own) is own


def _hw(world_hosts: int = 2, g: int = 4, **consts: float) -> HardwareProfile:
    return HardwareProfile(hosts=world_hosts, gpus_per_host=g, hbm_bytes=10**11,
                           hbm_reserved_bytes=0, hbm_bw=1e12, ddr_bytes=10**12,
                           ddr_reserved_bytes=0, ddr_bw=4e11, ssd_bytes=10**12, ssd_bw=8e9,
                           nvlink_bw=4e11, nic_bw=4e10, pcie_bw=5e10,
                           constants=CostConstants(**consts))


def _zero_traffic(**kw: float) -> PieceTraffic:
    base = dict.fromkeys(("lookups", "hbm_fwd", "hbm_bwd", "host", "ssd", "ids_intra",
                          "ids_inter", "out_fwd_intra", "out_fwd_inter", "out_bwd_intra",
                          "out_bwd_inter", "allreduce"), 0.0)
    base.update(kw)
    return PieceTraffic(**base)


def test_latency_terms_in_a_piece_cost() -> None:
    hw = _hw(piece_overhead_s=2e-6, update_launch_s=3e-6, allreduce_call_latency_s=1e-5,
             allreduce_hop_latency_s=1e-6, allreduce_bucket_bytes=1000)
    # A replica whose gradient fills 2.5 buckets, on 8 GPUs: 2.5 calls of 10 + 14 * 1 us.
    c = traffic_cost(_zero_traffic(allreduce_calls=2.5), hw)
    assert c.lookup == pytest.approx(2e-6)
    assert c.backward == pytest.approx(3e-6)
    assert c.allreduce == pytest.approx(2.5 * (1e-5 + 14e-6))
    assert c.input_a2a == 0 and c.output_a2a == 0


def test_step_fixed_counts_six_all_to_all_calls() -> None:
    hw = _hw(a2a_call_latency_s=1e-5, a2a_peer_latency_s=2e-6)
    f = step_fixed(hw)
    call = 1e-5 + 7 * 2e-6  # 8 GPUs: 7 peers
    assert f.input_a2a == pytest.approx(2 * call)
    assert f.output_a2a == pytest.approx(4 * call)
    assert step_fixed(_hw(1, 1, a2a_call_latency_s=1.0)).comm == 0  # one GPU: no exchange


def _latency_plan() -> tuple[Plan, float]:
    req = fixture_request("deeprecsys_rm2", 2)
    req["hardware"]["overrides"] = {"constants": {"a2a_call_latency_s": 2e-4,
                                                  "a2a_peer_latency_s": 1e-5}}
    p = plan(req)
    w = p.request.hardware.hosts * p.request.hardware.gpus_per_host
    return p, 2e-4 + 1e-5 * (w - 1)


def test_plan_figures_and_checker_carry_the_latency() -> None:
    p, call = _latency_plan()
    for g in p.gpus:
        assert g.cost.input_a2a_s >= 2 * call * (1 - 1e-12)
        assert g.cost.output_a2a_s >= 4 * call * (1 - 1e-12)
    assert p.summary.lower_bound_s >= 6 * call  # the bound counts what every GPU pays
    assert check_plan(p).ok, check_plan(p).errors[:3]
    # A plan that leaves the calls' latency out of one GPU is caught by the checker.
    d = p.model_dump(mode="json")
    d["gpus"][1]["cost"]["input_a2a_s"] -= 2 * call
    d["plan_hash"] = plan_hash_of(d)
    errs = check_plan(Plan.model_validate(d)).errors
    assert any(e.startswith("gpus[1].cost.input_a2a_s") for e in errs), errs[:3]


def test_unique_rows_among_the_hottest_against_monte_carlo() -> None:
    # What an LFU cache of the 200 hottest rows serves of the backward's distinct rows.
    rows, alpha, k, hot = 2000, 1.1, 1500, 200
    p = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
    p /= p.sum()
    rng = np.random.default_rng(7)
    counts = [np.unique(d[d < hot]).size for d in
              (rng.choice(rows, size=k, p=p) for _ in range(300))]
    mean, se = float(np.mean(counts)), float(np.std(counts) / math.sqrt(300))
    model = unique_rows_hot(ZipfAccess(alpha), rows, float(k), hot)
    assert abs(model - mean) <= 4 * se + 1e-9, (model, mean, se)
    assert unique_rows_hot(UniformAccess(), 1000, 800.0, 250) == pytest.approx(
        0.25 * unique_rows(UniformAccess(), 1000, 800.0))


def test_executor_prediction_pays_whole_allreduce_calls() -> None:
    """The plan charges replicas their share of the all-reduce calls (a job's dense part
    all-reduces anyway); the executor, with no dense part, makes whole DDP calls, and its
    prediction says so: one call's latency for three small replicas, counted here by hand."""
    from planner.executor.predict import predict
    from planner.problem import build_problem

    req = {"model": {"batch_size_per_gpu": 8, "tables": [
        {"name": f"t{i}", "num_embeddings": 100 + i, "embedding_dim": 8, "pooling_factor": 2.0,
         "constraints": {"sharding_types": ["data_parallel"]}} for i in range(3)]},
           "hardware": {"preset": "h100", "hosts": 1}, "options": {"solver": "greedy"}}
    p = plan(req)
    ranks, _ = predict(p)
    hw = build_problem(p.request).hw
    c = hw.constants
    w = hw.world_size
    call = c.allreduce_call_latency_s + 2 * (w - 1) * c.allreduce_hop_latency_s
    shares = sum((100 + i) * 8 * 4 / c.allreduce_bucket_bytes for i in range(3))  # fp32 grads
    for rp, g in zip(ranks, p.gpus, strict=True):
        assert rp.seconds["allreduce"] == pytest.approx(g.cost.allreduce_s + (1 - shares) * call,
                                                        rel=1e-9)
        assert rp.seconds["total"] - g.cost.total_s == pytest.approx((1 - shares) * call)
