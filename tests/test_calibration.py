"""`planner calibrate`: the robust fit recovers known constants from synthetic measurements,
and the command writes a profile that `planner plan --hardware` takes."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from planner.calibration.bench import Measurements
from planner.calibration.fit import fit_linear
from planner.calibration.profile import (
    build_profile,
    fit_collectives,
    fit_host,
    fit_kernels,
    fit_overlap,
)
from planner.cli import app
from planner.spec import HardwareSpec

# Known constants the synthetic machine runs on (seconds; inverse bandwidths s/byte).
TRUE = {
    "piece_overhead_s": 8e-6, "update_launch_s": 5e-5, "inv_hbm_bw": 1 / 40e9,
    "inv_backward_bw": 1 / 2e9, "a2a_call_latency_s": 3e-4, "a2a_peer_latency_s": 2e-4,
    "allreduce_call_latency_s": 4e-4, "allreduce_hop_latency_s": 1e-4, "inv_link_bw": 1 / 1e9,
    "host_piece_overhead_s": 2e-4, "inv_host_bw": 1 / 3e9, "inv_ssd_bw": 1 / 8e9,
    "update_row_s": 2e-7, "backward_id_s": 5e-8, "cache_probe_s": 1e-7, "lookup_id_s": 4e-8,
    "cache_step_s": 3e-4, "cache_slot_s": 5e-7, "allreduce_table_hop_s": 3e-5,
}


def synthetic(noise: float, outliers: float, seed: int = 0) -> Measurements:
    """Times from TRUE's formulas (profile.py's), times (1 + noise * N(0, 1)); a fraction
    `outliers` of the points 3-10x slower (another process took the core)."""
    rng = np.random.default_rng(seed)

    def t(x: float) -> float:
        slow = rng.uniform(3, 10) if rng.random() < outliers else 1.0
        return x * (1 + noise * rng.standard_normal()) * slow

    m = Measurements()
    for i, b in enumerate(np.geomspace(1e4, 1e8, 25)):
        ids = b / (72 * 4 ** (i % 3))  # ids of 64- to 1,024-byte rows, plus their 8-byte id
        m.lookup.append({"bytes": b, "lookups": ids, "seconds": t(
            TRUE["piece_overhead_s"] + b * TRUE["inv_hbm_bw"] + ids * TRUE["lookup_id_s"])})
        # Distinct rows: a row of 64 to 1,024 bytes (dims and optimizers differ).
        u = b / (64 * 2 ** (i % 5))
        n = u * (1 + 7 * (i // 5 % 2))  # ids: each distinct row looked up once or 8 times
        m.backward.append({"bytes": b, "unique": u, "lookups": n, "seconds": t(
            TRUE["update_launch_s"] + b * TRUE["inv_backward_bw"] + u * TRUE["update_row_s"]
            + n * TRUE["backward_id_s"])})
    for i, b in enumerate(np.geomspace(1e4, 1e8, 24)):
        # ddr pieces (host bytes only), ssd and hbm_cache pieces (slots; ssd: pages too).
        tier = ("ddr", "ssd", "hbm_cache")[i % 3]
        ssd = b * (2 + 6 * (i // 3 % 2)) if tier == "ssd" else 0.0
        slots = 0.0 if tier == "ddr" else b / 2048 * (1 + 3 * (i // 6 % 2))
        n, hits = b / 100, b / 400 * (1 + i % 2)  # ids looked up; hit and id bytes
        m.host.append({"tier": tier, "host_bytes": b, "ssd_bytes": ssd, "cache_slots": slots,
                       "lookups": n, "hbm_fwd_bytes": hits,
                       "seconds": t(TRUE["host_piece_overhead_s"] + b * TRUE["inv_host_bw"]
                                    + ssd * TRUE["inv_ssd_bw"] + slots * TRUE["cache_slot_s"]
                                    + (TRUE["cache_step_s"] if slots else 0.0)),
                       "lookup_seconds": t(TRUE["piece_overhead_s"] + hits * TRUE["inv_hbm_bw"]
                                           + n * (TRUE["cache_probe_s"]
                                                  + TRUE["lookup_id_s"]))})
    for w in (2, 3, 4):
        for b in np.geomspace(64, 4e6, 8):
            m.alltoall.append({"world": w, "bytes": b, "seconds": t(
                TRUE["a2a_call_latency_s"] + (w - 1) * TRUE["a2a_peer_latency_s"]
                + b * TRUE["inv_link_bw"])})
            for k in (1, 8):  # tables in the bucket
                m.allreduce.append({"world": w, "bytes": b, "tables": k, "seconds": t(
                    TRUE["allreduce_call_latency_s"]
                    + 2 * (w - 1) * (TRUE["allreduce_hop_latency_s"]
                                     + k * TRUE["allreduce_table_hop_s"])
                    + b * TRUE["inv_link_bw"])})
    return m


def _fits(m: Measurements) -> dict[str, tuple[float, tuple[float, float]]]:
    out = {}
    for fit in (fit_kernels(m), fit_host(m), fit_collectives(m)):
        for n, v, ci in zip(fit.names, fit.values, fit.ci95, strict=True):
            out[n] = (v, ci)
    return out


def test_fit_recovers_known_constants_with_noise_and_outliers() -> None:
    fits = _fits(synthetic(noise=0.03, outliers=0.1))
    for name, true in TRUE.items():
        value, (lo, hi) = fits[name]
        assert value == pytest.approx(true, rel=0.15), name
        assert lo <= true <= hi, (name, lo, true, hi)


def test_intervals_keep_their_width_when_features_span_many_orders() -> None:
    """A launch (feature 1 to 8) beside bytes (1e6 to 1e9): each constant's 95% interval has
    a width of the order its noise gives and covers the truth (J^T J's eigenvalues span
    ~1e30 here; pinv's cut-off once gave the launch an interval of width 0)."""
    rng = np.random.default_rng(3)
    n = 40
    launches = rng.integers(1, 9, n).astype(float)
    nbytes = 10 ** rng.uniform(6, 9, n)
    truth = (1.6e-4, 1.0 / 1.2e12)
    t = (launches * truth[0] + nbytes * truth[1]) * (1 + rng.normal(0, 0.03, n))
    f = fit_linear(np.column_stack([launches, nbytes]), t, ("launch", "inv_bw"))
    for (lo, hi), v, true in zip(f.ci95, f.values, truth, strict=True):
        assert lo <= true <= hi, (lo, true, hi)
        assert (hi - lo) / v > 0.005, (lo, v, hi)  # not a point


def test_robust_loss_resists_outliers_where_plain_least_squares_does_not() -> None:
    worst: dict[str, list[float]] = {"soft_l1": [], "linear": []}
    for seed in range(4):
        m = synthetic(noise=0.02, outliers=0.2, seed=seed)
        for rows, names in ((m.lookup, ("piece_overhead_s", "inv_hbm_bw", "lookup_id_s")),
                            (m.backward, ("update_launch_s", "inv_backward_bw",
                                          "update_row_s", "backward_id_s"))):
            b = np.array([r["bytes"] for r in rows])
            t = np.array([r["seconds"] for r in rows])
            per_row = [[r[k] for r in rows] for k in ("unique", "lookups") if k in rows[0]]
            x = np.column_stack([np.ones(len(b)), b, *per_row])
            for loss, errs in worst.items():
                f = fit_linear(x, t, names, loss=loss)
                errs.append(max(abs(f.value(n) / TRUE[n] - 1) for n in names))
    robust, plain = float(np.mean(worst["soft_l1"])), float(np.mean(worst["linear"]))
    # Measured: soft-l1 within ~2% of the truth (the worst constant of each fit, 2.02% on
    # average since lookups have a per-id term too), plain least squares ~16% off.
    assert robust < 0.03 and plain > 3 * robust, (robust, plain)


def test_profile_from_a_fit_is_a_hardware_spec_that_plans(tmp_path: Path) -> None:
    spec, prov = build_profile("h100", synthetic(0.02, 0.0), "cpu", "planner calibrate (test)")
    hw = HardwareSpec.model_validate(spec)
    c = hw.constants
    assert c.a2a_call_latency_s == pytest.approx(TRUE["a2a_call_latency_s"], rel=0.1)
    assert c.backward_efficiency == pytest.approx(2e9 / 40e9, rel=0.1)
    eff = hw.gpu.hbm_bandwidth_gb_per_s * c.hbm_efficiency
    assert eff == pytest.approx(40.0, rel=0.1)  # GB/s, of the preset's peak
    assert any("Calibrated" in s for s in hw.sources)
    assert prov["fits"]["kernels"]["points"] == 50 + 8  # and the hbm_cache lookups
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(spec))
    r = CliRunner().invoke(app, ["plan", "deeprecsys_rm1", "--hardware", str(path)])
    assert r.exit_code == 0, r.output


def test_calibrate_command_writes_a_profile_plan_accepts(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    r = subprocess.run([sys.executable, "-m", "planner.cli", "calibrate", "--smoke", "--quiet",
                        "--world-size", "2", "-o", str(out)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    HardwareSpec.model_validate(json.loads(out.read_text()))
    prov = json.loads(out.with_suffix(".provenance.json").read_text())
    assert prov["device"] == "cpu" and prov["measurements"]["alltoall"]
    # Lookups and backwards from the executed calibration plans: one point per rank each.
    assert len(prov["measurements"]["lookup"]) == 4 * 2
    assert all(pt["seconds"] > 0 and pt["parts"] for pt in prov["measurements"]["backward"])
    # Their all-to-all phases: three per rank, in the threads' CPU time (step_clock).
    assert len(prov["measurements"]["step_alltoall"]) == 4 * 2 * 3
    assert prov["step_alltoall_clock"] == "cpu"
    assert spec_a2a(out) == prov["fits"]["step_alltoall"]["constants"]["a2a_call_latency_s"][
        "value"]
    # The overlap pair (one calibration plan in turn and pipelined): a point per rank.
    assert len(prov["measurements"]["overlap"]) == 2
    assert 0.0 <= prov["fits"]["overlap"]["value"] <= 1.0
    p = CliRunner().invoke(app, ["plan", "criteo_kaggle", "--hardware", str(out)])
    assert p.exit_code == 0, p.output


def spec_a2a(path: Path) -> float:
    return float(json.loads(path.read_text())["constants"]["a2a_call_latency_s"])


def _priced_a2a_phases(hardware: dict[str, object]) -> Measurements:
    """The calibration plans priced by the model under `hardware`, each GPU's all-to-all
    phases as `planner execute --compare` maps the model's terms onto them
    (compare.predicted_phases), taken as if measured: executed.a2a_points of them."""
    from planner.calibration.executed import a2a_points, calibration_plan, plans_needed
    from planner.executor.compare import predicted_phases
    from planner.executor.predict import predict

    m = Measurements()
    for i in range(plans_needed(2)):
        plan = calibration_plan(i, 2, hardware)
        ranks, _ = predict(plan)
        phases = [predicted_phases(g.cost.model_dump(), ranks[g.rank].bytes["output_fwd"],
                                   ranks[g.rank].bytes["output_bwd"])
                  for g in sorted(plan.gpus, key=lambda g: g.rank)]
        m.step_alltoall += a2a_points(plan, phases)
    return m


def test_step_alltoall_fit_inverts_the_model_on_the_calibration_plans() -> None:
    """The all-to-all's call fitted where the executor makes it (executed.a2a_points: the
    executor's calls, predict's bytes) over phases the model priced under a known call, peer
    latency and link: the call comes back, with the peer term and the link held at the
    microbenchmarks' (a stand-in fit). Held at a wrong link, it does not."""
    from planner.calibration.executed import plans_needed
    from planner.calibration.profile import fit_step_alltoall
    from planner.presets import preset_dict

    call, peer, eff = 2.7e-4, 3e-5, 0.004
    hardware = preset_dict("h100")
    hardware = {**hardware, "constants": {**hardware.get("constants", {}),
                                          "a2a_call_latency_s": call,
                                          "a2a_peer_latency_s": peer,
                                          "nvlink_efficiency": eff}}
    m = _priced_a2a_phases(hardware)
    assert len(m.step_alltoall) == plans_needed(2) * 2 * 3  # per rank and phase
    assert min(pt["bytes"] for pt in m.step_alltoall) > 0
    inv_link = 1 / (hardware["links"]["nvlink_gb_per_s"] * 1e9 * eff)
    fit = fit_step_alltoall(m, peer, inv_link)
    assert fit is not None
    assert fit.value("a2a_call_latency_s") == pytest.approx(call, rel=1e-6)
    assert fit.rel_residual_p90 < 1e-6
    wrong = fit_step_alltoall(m, peer, inv_link / 10)
    assert wrong is not None and wrong.rel_residual_p90 > 0.01


def test_profile_takes_the_call_from_the_plans_steps_and_the_link_from_the_benchmarks(
) -> None:
    """With the calibration plans' all-to-all phases measured, the profile's call latency
    is theirs (the microbenchmarks' call, timed alone, ran short of the executor's), its
    link and peer terms the microbenchmarks'; both fits are in the provenance."""
    m = synthetic(0.0, 0.0)
    step_call = 1.5 * TRUE["a2a_call_latency_s"]
    for b in (2e3, 3e4, 9e4):
        for phase, calls in (("input_a2a", 2), ("output_a2a_fwd", 2)):
            m.step_alltoall.append({"plan": 0, "rank": 0, "phase": phase, "world": 2.0,
                                    "calls": float(calls), "bytes": b, "seconds": calls * (
                                        step_call + TRUE["a2a_peer_latency_s"])
                                    + b * TRUE["inv_link_bw"]})
    spec, prov = build_profile("h100", m, "cpu", "planner calibrate (test)")
    hw = HardwareSpec.model_validate(spec)
    c = hw.constants
    assert c.a2a_call_latency_s == pytest.approx(step_call, rel=1e-3)
    eff_link = hw.links.nvlink_gb_per_s * 1e9 * c.nvlink_efficiency
    assert 1 / eff_link == pytest.approx(TRUE["inv_link_bw"], rel=0.05)
    assert "all-to-all phases" in " ".join(hw.sources)
    assert c.a2a_peer_latency_s == pytest.approx(TRUE["a2a_peer_latency_s"], rel=0.05)
    micro = prov["fits"]["collectives"]["constants"]["a2a_call_latency_s"]["value"]
    assert micro == pytest.approx(TRUE["a2a_call_latency_s"], rel=0.05)
    assert prov["fits"]["step_alltoall"]["points"] == 6
    # Without them, the microbenchmarks' call stands.
    m.step_alltoall.clear()
    spec, prov = build_profile("h100", m, "cpu", "planner calibrate (test)")
    assert prov["fits"]["step_alltoall"] is None
    assert HardwareSpec.model_validate(spec).constants.a2a_call_latency_s == pytest.approx(
        TRUE["a2a_call_latency_s"], rel=0.05)


def test_calibrate_cuda_refuses_without_a_gpu(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    r = CliRunner().invoke(app, ["calibrate", "--device", "cuda", "-o",
                                 str(tmp_path / "x.json")])
    assert r.exit_code == 2 and "no CUDA device" in r.output


def test_one_rank_keeps_the_presets_collective_constants() -> None:
    # One GPU (or --world-size 1) measures no collective: those constants stay the preset's.
    m = synthetic(0.02, 0.0)
    m.alltoall.clear()
    m.allreduce.clear()
    spec, prov = build_profile("h100", m, "cuda", "planner calibrate (test)")
    hw = HardwareSpec.model_validate(spec)
    assert "a2a_call_latency_s" in prov["kept_from_preset"]
    assert hw.constants.a2a_call_latency_s == HardwareSpec.model_validate(
        {**spec, "constants": {}}).constants.a2a_call_latency_s
    assert hw.constants.update_launch_s == pytest.approx(TRUE["update_launch_s"], rel=0.1)


def test_host_tier_fit_reaches_the_model_through_the_profile() -> None:
    # The fitted host read rate, SSD rate and per-piece host overhead are what the cost model
    # reads from the profile (eff_host_read_bw, a GPU's eff_ssd_bw, cache_miss's overhead).
    from cost_models import Tier
    from planner.planning import resolve
    from planner.problem import build_problem

    spec, prov = build_profile("h100", synthetic(0.02, 0.0), "cpu", "planner calibrate (test)")
    hw = HardwareSpec.model_validate(spec).profile()
    assert hw.eff_host_read_bw == pytest.approx(3e9, rel=0.1)
    assert hw.eff_ssd_bw == pytest.approx(8e9, rel=0.1)
    assert hw.constants.host_piece_overhead_s == pytest.approx(2e-4, rel=0.15)
    assert hw.constants.cache_slot_s == pytest.approx(5e-7, rel=0.15)
    assert set(prov["fits"]["host"]["by_tier"]) == {"ddr", "ssd", "hbm_cache"}
    req = {"model": "deeprecsys_rm1", "hardware": {**spec, "hosts": 1, "gpus_per_host": 2},
           "options": {"solver": "greedy"}}
    problem = build_problem(resolve(req))
    from cost_models import ShardingType, piece_cost

    t = problem.tables[0]
    args = (ShardingType.TABLE_WISE, Tier.DDR, 1.0, t.geom.rows, t.geom.dim, problem.hw,
            problem.model)
    ddr = piece_cost(t.geom, *args)
    hbm = piece_cost(t.geom, ShardingType.TABLE_WISE, Tier.HBM, 1.0, *args[3:])
    assert hbm.cache_miss == 0.0
    assert ddr.cache_miss > hw.constants.host_piece_overhead_s


def test_host_overhead_left_out_of_the_json_at_its_default() -> None:
    # A new constant at its default (0: no term) is not in the request's JSON, so plans made
    # before it hash as they did.
    from planner.spec.hardware import ConstantsSpec

    for name in ("host_piece_overhead_s", "update_row_s", "backward_id_s", "lookup_id_s",
                 "cache_probe_s", "cache_step_s", "cache_slot_s", "allreduce_table_hop_s"):
        assert name not in ConstantsSpec().model_dump()
        assert ConstantsSpec(**{name: 1e-4}).model_dump()[name] == 1e-4


def test_device_cache_size_and_speed_recovered_from_a_machine_with_one() -> None:
    """Lookups and updates of tables whose rows fit a 1 MiB cache run 20x (forward) and 5x
    (backward) faster per byte: the fit picks 1 MiB among the levels and recovers both."""
    from cost_models.sizes import optimizer_state_row_bytes
    from cost_models.traffic import device_resident
    from cost_models.types import Optimizer
    from planner.calibration.profile import choose_device_cache

    cache, inv_f, inv_b = 1 << 20, 1 / 2e9, 1 / 1e9
    rng = np.random.default_rng(3)
    m = Measurements()
    for rows in (100, 2_000, 20_000, 400_000):
        for dim in (16, 64):
            for n in (256, 2048, 16384):
                b = n * (dim * 4 + 8)
                f = device_resident(cache, rows, dim * 4)
                m.lookup.append({"bytes": b, "lookups": n, "rows": rows, "dim": dim,
                                 "seconds": (2e-5 + b * inv_f * (1 - f + f / 20))
                                 * (1 + 0.01 * rng.standard_normal())})
                for opt in (Optimizer.SGD, Optimizer.ADAGRAD):
                    u = min(rows, n)
                    row = dim * 4 + optimizer_state_row_bytes(opt, dim)
                    fb = device_resident(cache, rows, row)
                    bb = u * 2 * row + n * 4 * dim
                    m.backward.append({"bytes": bb, "unique": u, "lookups": n, "rows": rows,
                                       "dim": dim, "optimizer": str(opt),
                                       "seconds": (5e-5 + bb * inv_b * (1 - fb + fb / 5))
                                       * (1 + 0.01 * rng.standard_normal())})
    best, tried = choose_device_cache(m, [32 << 10, 1 << 20, 32 << 20])
    assert best == cache, {c: f.rel_residual_median for c, f in tried.items()}
    fit = tried[best]
    assert fit.value("inv_hbm_bw") / fit.value("inv_hbm_cached_bw") == pytest.approx(20, rel=0.15)
    assert (fit.value("inv_backward_bw") / fit.value("inv_backward_cached_bw")
            == pytest.approx(5, rel=0.15))
    assert tried[0].rel_residual_median > 5 * fit.rel_residual_median


def test_rank_phases_of_several_pieces_recover_known_constants() -> None:
    """Points as the executed calibration plans give them (executed.py): a rank's phase over
    its pieces, each piece its own launch, the cache split per piece by its own table's
    rows. The fit recovers the launch, per-id and both bandwidths."""
    from cost_models.sizes import optimizer_state_row_bytes
    from cost_models.traffic import device_resident
    from cost_models.types import Optimizer

    cache, launch, per_id, inv_f, inv_c = 1 << 20, 6e-5, 3e-9, 1 / 5e9, 1 / 50e9
    up, row_s, inv_b = 2e-4, 2e-7, 1 / 2e9
    rng = np.random.default_rng(5)
    m = Measurements()
    shapes = [(rows, dim, pool) for rows in (100, 3_000, 40_000, 300_000) for dim in (16, 128)
              for pool in (1, 20)]
    for i, (rows, dim, pool) in enumerate(shapes):
        k = 1 + i % 5  # pieces on the rank
        n = 512 * pool  # ids a piece looks up
        b = n * (dim * 4 + 8)
        f = device_resident(cache, rows, dim * 4)
        parts = [{"rows": rows, "dim": dim, "bytes": b}] * k
        m.lookup.append({"launches": float(k), "lookups": float(k * n), "bytes": k * b,
                         "parts": parts, "seconds": k * (launch + n * per_id + b * (1 - f)
                                                         * inv_f + b * f * inv_c)
                         * (1 + 0.01 * rng.standard_normal())})
        opt = Optimizer.ADAGRAD
        row = dim * 4 + optimizer_state_row_bytes(opt, dim)
        u = min(rows, n) * 0.9
        bb = u * 2 * row + n * 4 * dim
        m.backward.append({"launches": float(k), "lookups": float(k * n), "bytes": k * bb,
                           "unique": k * u, "seconds": k * (up + u * row_s + bb * inv_b)
                           * (1 + 0.01 * rng.standard_normal()),
                           "parts": [{"rows": rows, "dim": dim, "optimizer": str(opt),
                                      "bytes": bb}] * k})
    fit = fit_kernels(m, cache)
    for name, true in (("piece_overhead_s", launch), ("lookup_id_s", per_id),
                       ("inv_hbm_bw", inv_f), ("inv_hbm_cached_bw", inv_c),
                       ("update_launch_s", up), ("update_row_s", row_s)):
        assert fit.value(name) == pytest.approx(true, rel=0.15), name
    # Counted as one piece each, the same phases cannot be fitted as well.
    single = Measurements(lookup=[{k: v for k, v in pt.items() if k != "launches"}
                                  for pt in m.lookup], backward=m.backward)
    assert fit_kernels(single, cache).rel_residual_p90 > 10 * fit.rel_residual_p90


def test_calibration_plans_give_each_rank_its_shape() -> None:
    """executed.calibration_request: rank r of plan i holds RANK_SETS[(i * ranks + r) % n],
    table-wise, and every rank set is some rank's in plans_needed(ranks) plans: each
    one-shape set (SHAPES) and each mixed one (MIXED); the model's terms a point sums are its
    pieces' ids and bytes (uniform fp32 rows: ids x (row + id))."""
    from planner.calibration.executed import (
        BATCHES,
        MIXED,
        RANK_SETS,
        SHAPES,
        _pieces_of,
        calibration_plan,
        calibration_request,
        plans_needed,
    )
    from planner.presets import preset_dict

    assert len(RANK_SETS) == len(SHAPES) + len(MIXED)
    seen = set()
    for i in range(plans_needed(2)):
        request, layout = calibration_request(i, 2, preset_dict("h100"))
        by_name = {t["name"]: t for t in request["model"]["tables"]}
        for r in range(2):
            mine = [t for t in layout if t["pieces"][0]["rank"] == r]
            got = tuple((by_name[t["name"]]["num_embeddings"], by_name[t["name"]][
                "embedding_dim"], int(by_name[t["name"]]["pooling_factor"]),
                by_name[t["name"]]["optimizer"]) for t in mine)
            assert got == tuple((rows, dim, pool, str(opt)) for rows, dim, pool, opt in
                                RANK_SETS[(i * 2 + r) % len(RANK_SETS)])
            seen.add(got)
            assert all(t["sharding_type"] == "table_wise" for t in mine)
    assert len(seen) == len(RANK_SETS)
    # The one-shape sets: `count` tables of one shape; the mixed ones: ten or more of
    # sizes over three or more orders of magnitude.
    for count, rows, dim, pool, opt in SHAPES:
        assert ((rows, dim, pool, str(opt)),) * count in seen
    for mixed in MIXED:
        assert len(mixed) >= 10 and max(m[0] for m in mixed) >= 1000 * min(m[0] for m in mixed)
    plan = calibration_plan(1, 2, preset_dict("h100"))
    batch = BATCHES[1]
    for r, pieces in enumerate(_pieces_of(plan)):
        _count, _rows, dim, pooling, _opt = SHAPES[2 + r]
        for pc in pieces:
            ids = batch * 2 * pooling  # every rank's samples, one bag of `pooling` each
            assert pc["lookups"] == ids
            assert pc["fwd_bytes"] == ids * (dim * 4 + 8)


def test_a_cache_whose_reads_cost_per_id_is_credible_though_its_bytes_are_free() -> None:
    """Executed lookups of tables under 1 MiB cost their launch and ~6 ns per id whatever
    their bytes (measured here): a fit with the cache's bytes at ~0 and a per-id time is a
    cache the model can run. Without any per-id or per-row time, bytes nearly free are the
    launch terms absorbing a lookup: not credible."""
    from planner.calibration.fit import FitResult
    from planner.calibration.profile import KERNEL_NAMES, credible_cache

    def fit(**values: float) -> FitResult:
        v = {"inv_hbm_bw": 1.5e-10, "inv_backward_bw": 5e-10, "inv_hbm_cached_bw": 1e-22,
             "inv_backward_cached_bw": 4e-10, "lookup_id_s": 6e-9, **values}
        vals = tuple(v.get(n, 0.0) for n in KERNEL_NAMES)
        return FitResult(KERNEL_NAMES, vals, vals, tuple((x, x) for x in vals), 0.05, 0.1,
                         40, 0)

    assert credible_cache(fit())
    assert not credible_cache(fit(lookup_id_s=1e-19))  # the solver's zero
    assert credible_cache(fit(lookup_id_s=0.0, inv_hbm_cached_bw=1e-12))  # 150x: a cache
    assert not credible_cache(fit(inv_backward_cached_bw=0.0))  # nothing prices its rows
    assert credible_cache(fit(inv_backward_cached_bw=0.0, update_row_s=1e-7))
    assert not credible_cache(fit(inv_hbm_bw=0.0))  # no memory behind the cache


def test_the_kernel_fit_inverts_the_model_on_the_calibration_plans() -> None:
    """Each calibration plan priced by the model (planning.evaluate, cost.traffic_cost) under
    known constants, its GPUs' lookup and backward seconds taken as if measured: the points
    executed.rank_points builds from them, fitted, give those constants back. So a rank's
    point sums what the model sums for that GPU (launches, bytes, ids, distinct rows, the
    device cache's split; and each GPU's phase start once, cost.step_fixed), by another
    path than the model's own."""
    from planner.calibration.executed import calibration_plan, plans_needed, rank_points
    from planner.presets import preset_dict

    known = {"piece_overhead_s": 6e-5, "lookup_id_s": 5e-9, "update_launch_s": 2e-4,
             "update_row_s": 1e-7, "backward_id_s": 3e-8, "hbm_efficiency": 0.004,
             "backward_efficiency": 0.25, "device_cache_bytes": 1 << 20,
             "device_cache_fwd_factor": 20.0, "device_cache_bwd_factor": 4.0,
             "lookup_start_s": 1.5e-4, "backward_start_s": 7e-4}
    hardware = preset_dict("h100")
    hardware = {**hardware, "constants": {**hardware.get("constants", {}), **known}}
    m = Measurements()
    for i in range(plans_needed(2)):
        plan = calibration_plan(i, 2, hardware)
        gpus = sorted(plan.gpus, key=lambda g: g.rank)
        lk, bw = rank_points(plan, [{"lookup": g.cost.lookup_s, "backward": g.cost.backward_s}
                                    for g in gpus])
        m.lookup += lk
        m.backward += bw
    fit = fit_kernels(m, 1 << 20)
    eff = hardware["gpu"]["hbm_bandwidth_gb_per_s"] * 1e9 * known["hbm_efficiency"]
    for name, true in (("piece_overhead_s", 6e-5), ("lookup_id_s", 5e-9),
                       ("update_launch_s", 2e-4), ("update_row_s", 1e-7),
                       ("backward_id_s", 3e-8), ("inv_hbm_bw", 1 / eff),
                       ("inv_hbm_cached_bw", 1 / eff / 20),
                       ("inv_backward_bw", 1 / (eff * 0.25)),
                       ("inv_backward_cached_bw", 1 / (eff * 0.25) / 4),
                       ("lookup_start_s", 1.5e-4), ("backward_start_s", 7e-4)):
        assert fit.value(name) == pytest.approx(true, rel=1e-3), name
    assert fit.rel_residual_p90 < 1e-6


def _overlap_points(share: float, n: int, noise: float, seed: int = 0) -> list[dict[str, float]]:
    """Ranks of calibration plans whose pipelined step hides `share` of the input
    all-to-all, times (1 + noise * N(0, 1))."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        inp = rng.uniform(3e-4, 1.5e-3)
        seq = inp + rng.uniform(1e-3, 3e-3)
        out.append({"plan": i // 2, "rank": i % 2,
                    "sequential_s": seq * (1 + noise * rng.standard_normal()),
                    "pipelined_s": (seq - share * inp) * (1 + noise * rng.standard_normal()),
                    "input_s": inp * (1 + noise * rng.standard_normal())})
    return out


@pytest.mark.parametrize("share", [0.0, 0.3, 0.8])
def test_overlap_fit_recovers_a_known_share(share: float) -> None:
    fit = fit_overlap(_overlap_points(share, 40, 0.005))
    assert fit is not None and fit["points"] == 40
    assert fit["value"] == pytest.approx(share, abs=0.08)
    assert fit["ci95"][0] <= fit["value"] <= fit["ci95"][1] and fit["determined"]


def test_an_overlap_the_pairs_do_not_determine_keeps_the_presets() -> None:
    """Shares as this machine gave them (-4.6 to 3.6 of the input over 8 ranks): the
    interval spans 0 .. 1, so the profile keeps the preset's value and says so."""
    m = synthetic(0.02, 0.0)
    m.overlap = [{"sequential_s": s, "pipelined_s": p, "input_s": i} for s, p, i in (
        (12.03, 4.22, 2.18), (18.77, 10.87, 2.24), (4.65, 7.1, 0.53), (18.12, 20.52, 0.56),
        (15.0, 11.17, 2.08), (10.02, 6.75, 2.01), (14.08, 8.8, 2.76), (14.79, 9.35, 2.75))]
    spec, prov = build_profile("h100", m, "cpu", "planner calibrate (test)")
    assert not prov["fits"]["overlap"]["determined"]
    assert "pipeline_overlap" in prov["kept_from_preset"]
    assert "pipeline_overlap" not in spec["constants"]


def test_overlap_is_held_to_a_share() -> None:
    # A pipelined step slower than its sequential twin (the lane's exchange shared the core)
    # hides nothing; one that saved more than its input is noise, not more than all of it.
    assert fit_overlap(_overlap_points(-0.4, 20, 0.0))["value"] == 0.0
    assert fit_overlap(_overlap_points(1.5, 20, 0.0))["value"] == 1.0
    assert fit_overlap([]) is None


def test_profile_carries_the_overlap_and_a_pipelined_step_at_zero_is_sequential() -> None:
    m = synthetic(0.02, 0.0)
    m.overlap = _overlap_points(0.0, 16, 0.0)
    spec, prov = build_profile("h100", m, "cpu", "planner calibrate (test)")
    assert spec["constants"]["pipeline_overlap"] == 0.0
    assert prov["fits"]["overlap"]["points"] == 16
    from planner import plan
    from planner.presets import fixture_text

    model = json.loads(fixture_text("criteo_kaggle"))
    hw = {**spec, "hosts": 2}
    steps = {p: plan({"model": {**model, "pipelined": p}, "hardware": hw}).summary.step_time_s
             for p in (False, True)}
    assert steps[True] == pytest.approx(steps[False], rel=1e-12)
    # Hiding all of it (the presets' 1) makes the pipelined step shorter.
    hw1 = {**hw, "constants": {**spec["constants"], "pipeline_overlap": 1.0}}
    hidden = plan({"model": {**model, "pipelined": True}, "hardware": hw1}).summary.step_time_s
    assert hidden < steps[False]


def test_shares_past_the_whole_input_determine_nothing() -> None:
    """Shares of 1.4 to 3.0 (a pipelined step saving more than its whole input all-to-all, as
    one calibration here measured): clipped they read as a determined 1; the raw interval
    lies outside what a share can be, so the preset's value is kept."""
    m = synthetic(0.02, 0.0)
    m.overlap = [{"sequential_s": s, "pipelined_s": p, "input_s": i} for s, p, i in (
        (11.04, 6.78, 2.77), (18.11, 14.09, 2.77), (10.87, 5.47, 2.06), (28.58, 22.35, 2.10),
        (18.98, 12.88, 2.76), (15.0, 10.54, 2.10), (12.0, 6.74, 2.10), (14.0, 8.83, 2.10))]
    fit = fit_overlap(m.overlap)
    assert fit is not None and fit["ci95"] == [1.0, 1.0] and fit["ci95_raw"][0] > 1.25
    spec, prov = build_profile("h100", m, "cpu", "planner calibrate (test)")
    assert not prov["fits"]["overlap"]["determined"]
    assert "pipeline_overlap" not in spec["constants"]
