"""Fit the named constants from measurements and write them into a hardware profile.

Three fits, each of the cost model's own form (cost.py, latency.py):
- kernels: lookup t = piece_overhead_s + bytes / eff_hbm_bw + lookup_id_s per id and
  backward t = update_launch_s + bytes / (eff_hbm_bw * backward_efficiency) + update_row_s
  * distinct rows + backward_id_s * ids, each summed over a rank's pieces: the time is a
  rank's lookup or backward phase in an executed calibration plan (executed.py), the
  terms the model's own (traffic.piece_traffic), plus lookup_start_s or backward_start_s
  once per phase (a step's fixed cost per GPU, cost.step_fixed: the calibration plans hold
  1 to 8 pieces a rank, which tells it from the per-piece launch). Then cache_probe_s per
  id of an hbm_cache piece, over what that fit prices of the host-tier benchmark's cached
  lookups.
- host tiers: a ddr, hbm_cache or ssd piece's cache_miss time per step,
  t = host_piece_overhead_s + host bytes / eff_host_read_bw + SSD bytes / eff_ssd_bw +
  (a cached piece) cache_step_s + cache_slot_s * cache slots (the bytes and slots:
  traffic.piece_traffic's for the shape).
  The host read rate becomes the PCIe link's (pcie_gb_per_s * pcie_efficiency, raised past
  the preset's peak where faster), DDR's share kept above it at the profile's gpus_per_host;
  the SSD rate a GPU's share at that count.
- collectives: all-to-all t = a2a_call + a2a_peer (W - 1) + bytes / eff_link and ring
  all-reduce t = ar_call + ar_hop 2 (W - 1) + bytes / eff_link, jointly (one link bandwidth:
  one host's all-reduce runs at eff NVLink, hardware.eff_allreduce_bw). With one world size
  a call's and a peer's latency cannot be told apart: the peer term is then held at 0.

- pipeline overlap: per rank of a calibration plan run in turn and pipelined
  (executed.bench_overlap), the share of its sequential input all-to-all the pipelined step
  saved, (sequential - pipelined) / input; pipeline_overlap is their median, held to [0, 1]
  (cost.sides_of hides that share of the input all-to-all), with a bootstrap interval. An
  interval wider than OVERLAP_MAX_INTERVAL determines nothing, and neither does one
  outside [-OVERLAP_SLACK, 1 + OVERLAP_SLACK] (a share a pipelined step cannot have: the
  two phase sums moved waits between phases): the preset's value is kept (on this 2-core
  machine the shares ran from -4.6 to 3.6 over 8 ranks, interval 0 .. 1; in another
  calibration from 1.4 to 3.0, interval 1.9 .. 2.6, which clipped to [0, 1] had read as a
  determined 1).

Bandwidths become efficiencies of the base preset's peak (hbm_efficiency, nvlink_efficiency);
where the measured bandwidth exceeds the peak, the peak is raised to it and the efficiency is 1.
"""

import datetime
import platform
import socket
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cost_models import CostConstants
from cost_models.sizes import optimizer_state_row_bytes
from cost_models.traffic import device_resident
from cost_models.types import Optimizer
from planner.calibration.bench import Measurements, to_arrays
from planner.calibration.executed import step_clock
from planner.calibration.fit import FitResult, fit_linear
from planner.presets import preset_dict

# A fitted pipeline_overlap whose 95% interval is wider than this is not written, nor one
# whose interval leaves [0, 1] by more than the slack.
OVERLAP_MAX_INTERVAL = 0.5
OVERLAP_SLACK = 0.25
KERNEL_NAMES = ("piece_overhead_s", "update_launch_s", "inv_hbm_bw", "inv_backward_bw",
                "update_row_s", "backward_id_s", "cache_probe_s", "lookup_id_s",
                "inv_hbm_cached_bw", "inv_backward_cached_bw", "lookup_start_s",
                "backward_start_s")


def cache_levels() -> list[int]:
    """This machine's data and unified cache sizes in bytes (Linux sysfs; none elsewhere)."""
    out = set()
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            kind = (d / "type").read_text().strip()
            size = (d / "size").read_text().strip()
        except OSError:
            continue
        if kind in ("Data", "Unified") and size.endswith("K") and size[:-1].isdigit():
            out.add(int(size[:-1]) * 1024)
    return sorted(out)


def _cached_bytes(r: dict[str, Any], cache_bytes: int, backward: bool) -> float:
    """Of a point's bytes, those its device cache serves (traffic.device_resident of each
    piece's table: fp32 rows, uniform ids; with its optimizer state backward). A point of
    several pieces (a rank's phase, executed.py) lists them as `parts`; 0 for a point
    without shapes (older profiles)."""
    if cache_bytes <= 0:
        return 0.0
    out = 0.0
    for part in r.get("parts", [r]):
        if "rows" not in part or "dim" not in part:
            continue
        row = int(part["dim"]) * 4
        if backward:
            row += optimizer_state_row_bytes(Optimizer(str(part["optimizer"])),
                                             int(part["dim"]))
        out += float(part["bytes"]) * device_resident(cache_bytes, int(part["rows"]), row)
    return out


def _cached_lookups(m: Measurements) -> list[dict[str, Any]]:
    """The hbm_cache points' lookup phases (their probe and the pool of their hits)."""
    return [r for r in m.host if r["tier"] == "hbm_cache" and "lookup_seconds" in r]


def _phases(r: dict[str, Any]) -> float:
    """A rank's phase (an executed plan's point, `parts` listed): its step's start, once per
    GPU and step (lookup_start_s, backward_start_s; cost.step_fixed); 0 for a single
    piece's microbenchmark point."""
    return 1.0 if "parts" in r else 0.0


def _launches(r: dict[str, Any]) -> float:
    """Pieces a point's time covers: one for a microbenchmark's, a rank's for an executed
    plan's phase (each piece its own lookup and update)."""
    return float(r.get("launches", 1.0))


def _ids(r: dict[str, Any]) -> float:
    """Ids a lookup point looked up (a profile's points from before the field: batch x
    pooling)."""
    if "lookups" in r:
        return float(r["lookups"])
    return float(r["batch"]) * float(r["pooling"])


# No cache level of a CPU or GPU serves reads more than this many times faster than the
# memory behind it (here a 100-row table's lookups cost 10-15x less per id than a
# 200,000-row table's).
MAX_CACHE_FACTOR = 1_000.0
# The terms that price a cache's reads per id or per row, beside its bytes: where one is
# fitted, cached bytes may cost next to nothing (measured: executed lookups of tables under
# 1 MiB cost their launch and ~6 ns per id whatever their bytes, larger ones 7 GB/s more).
# A fitted value under PER_ITEM_FLOOR_S is the solver's zero.
_PER_ITEM = {"inv_hbm_cached_bw": ("lookup_id_s",),
             "inv_backward_cached_bw": ("update_row_s", "backward_id_s")}
PER_ITEM_FLOOR_S = 1e-12
# Each device-cache factor and the two fitted inverse bandwidths it is the ratio of.
_CACHE_FACTORS = (("device_cache_fwd_factor", "inv_hbm_bw", "inv_hbm_cached_bw"),
                  ("device_cache_bwd_factor", "inv_backward_bw", "inv_backward_cached_bw"))


def credible_cache(f: FitResult) -> bool:
    """Whether a kernel fit with a device-cache level prices it as a cache can run: the
    memory behind it costs something, and the cache serves its bytes at most
    MAX_CACHE_FACTOR times faster, or a per-id (forward) or per-row (backward) term prices
    its reads instead."""
    return all(f.value(slow) > 0 and (f.value(fast) * MAX_CACHE_FACTOR >= f.value(slow) or any(
        f.value(n) > PER_ITEM_FLOOR_S for n in _PER_ITEM[fast]))
        for _, slow, fast in _CACHE_FACTORS)


def choose_device_cache(m: Measurements, levels: list[int]
                        ) -> tuple[int, dict[int, FitResult]]:
    """The device cache's size: none, or the cache level whose kernel fit has the smallest
    median residual (a level must beat none by a point to be taken, and must price the bytes
    it serves at most MAX_CACHE_FACTOR times faster than the memory behind it, unless a per-id
    (forward) or per-row (backward) term prices its reads instead: a fit that makes cached
    bytes nearly free with nothing else per id is not a cache but the launch terms absorbing
    a lookup; it came out so, at the 1e4 cap, in two calibrations here); every fit tried."""
    tried = {c: fit_kernels(m, c) for c in [0, *levels]}
    best = min((c for c in tried if c == 0 or credible_cache(tried[c])),
               key=lambda c: (tried[c].rel_residual_median + (0.0 if c == 0 else 0.01), c))
    return best, tried


def fit_kernels(m: Measurements, cache_bytes: int = 0) -> FitResult:
    """Lookups: t = piece_overhead_s + bytes * inv_hbm_bw + lookup_id_s per id (+
    cache_probe_s per id of an hbm_cache piece, whose bytes are its hits' and ids');
    backward: t = update_launch_s + bytes * inv_backward_bw + update_row_s * distinct rows
    + backward_id_s * ids (cost.py traffic_cost). With `cache_bytes`, each point's bytes
    split as the model splits an hbm piece's: the share its device cache holds
    (device_resident) at inv_*_cached_bw, the rest at inv_*_bw."""
    rows = []
    for r in m.lookup:
        b, f = float(r["bytes"]), _cached_bytes(r, cache_bytes, False)
        rows.append([_launches(r), 0.0, b - f, 0.0, 0.0, 0.0, 0.0, _ids(r), f, 0.0,
                     _phases(r), 0.0])
    t = [float(r["seconds"]) for r in m.lookup]
    for r in m.backward:
        b, f = float(r["bytes"]), _cached_bytes(r, cache_bytes, True)
        rows.append([0.0, _launches(r), 0.0, b - f, float(r["unique"]), float(r["lookups"]),
                     0.0, 0.0, 0.0, f, 0.0, _phases(r)])
    t += [float(r["seconds"]) for r in m.backward]
    main = _fit_seen_columns(np.array(rows), np.array(t), KERNEL_NAMES)
    cached = _cached_lookups(m)
    if not cached:
        return main
    # The hbm_cache lookups' probe, fitted second, over what the first fit prices of them
    # (its launch, its hits' bytes, its ids): the probe points come from the host-tier
    # microbenchmark, whose context differs from the executed plans' (executed.py); fitted
    # jointly they pulled the launch and per-id terms their way.
    x = np.array([[1.0, float(r["hbm_fwd_bytes"]), float(r["lookups"])] for r in cached])
    tc = np.array([float(r["lookup_seconds"]) for r in cached])
    base = x @ np.array([main.value(n) for n in ("piece_overhead_s", "inv_hbm_bw",
                                                 "lookup_id_s")])
    probe = fit_linear(x[:, 2:], tc, ("cache_probe_s",), offset=base)
    values = dict(zip(main.names, main.values, strict=True))
    stderr = dict(zip(main.names, main.stderr, strict=True))
    ci = dict(zip(main.names, main.ci95, strict=True))
    values["cache_probe_s"], stderr["cache_probe_s"] = probe.values[0], probe.stderr[0]
    ci["cache_probe_s"] = probe.ci95[0]
    pred = np.concatenate([np.array(rows) @ np.array([values[n] for n in KERNEL_NAMES]),
                           base + x[:, 2] * values["cache_probe_s"]])
    rel = np.abs(pred / np.concatenate([t, tc]) - 1.0)
    return FitResult(names=KERNEL_NAMES, values=tuple(values[n] for n in KERNEL_NAMES),
                     stderr=tuple(stderr[n] for n in KERNEL_NAMES),
                     ci95=tuple(ci[n] for n in KERNEL_NAMES),
                     rel_residual_median=float(np.median(rel)),
                     rel_residual_p90=float(np.quantile(rel, 0.9)), points=len(rel),
                     outliers=main.outliers + probe.outliers)


HOST_NAMES = ("host_piece_overhead_s", "inv_host_bw", "inv_ssd_bw", "cache_step_s",
              "cache_slot_s")


def _host_row(r: dict[str, Any]) -> list[float]:
    slots = float(r.get("cache_slots", 0.0))
    return [1.0, float(r["host_bytes"]), float(r["ssd_bytes"]), 1.0 if slots > 0 else 0.0,
            slots]


def fit_host(m: Measurements) -> FitResult | None:
    """cache_miss seconds of host-tier pieces against (1, host bytes, SSD bytes, 1 for a
    cached piece, cache slots); a column the data cannot see (no ssd points) is held at 0
    with no interval. None without points."""
    if not m.host:
        return None
    x = np.array([_host_row(r) for r in m.host])
    t = np.array([float(r["seconds"]) for r in m.host])
    return _fit_seen_columns(x, t, HOST_NAMES)


def _fit_seen_columns(x: np.ndarray, t: np.ndarray, names: tuple[str, ...]) -> FitResult:
    """fit_linear over the columns the data can see (any non-zero); the others held at 0,
    with no interval."""
    keep = [j for j in range(x.shape[1]) if np.any(x[:, j])]
    fit = fit_linear(x[:, keep], t, tuple(names[j] for j in keep))
    if len(keep) == len(names):
        return fit
    vals = dict(zip(fit.names, fit.values, strict=True))
    se = dict(zip(fit.names, fit.stderr, strict=True))
    ci = dict(zip(fit.names, fit.ci95, strict=True))
    return FitResult(names=names, values=tuple(vals.get(n, 0.0) for n in names),
                     stderr=tuple(se.get(n, 0.0) for n in names),
                     ci95=tuple(ci.get(n, (0.0, 0.0)) for n in names),
                     rel_residual_median=fit.rel_residual_median,
                     rel_residual_p90=fit.rel_residual_p90, points=fit.points,
                     outliers=fit.outliers)


def host_residuals_by_tier(m: Measurements, fit: FitResult) -> dict[str, dict[str, float]]:
    """Median and p90 |relative residual| of the host fit per tier (one overhead for every
    host tier: how far each tier's points sit from it)."""
    out: dict[str, dict[str, float]] = {}
    for tier in sorted({str(r["tier"]) for r in m.host}):
        rows = [r for r in m.host if str(r["tier"]) == tier]
        theta = np.array([fit.value(n) for n in HOST_NAMES])
        rel = np.array([abs(float(np.dot(_host_row(r), theta)) / float(r["seconds"]) - 1)
                        for r in rows])
        out[tier] = {"rel_residual_median": float(np.median(rel)),
                     "rel_residual_p90": float(np.quantile(rel, 0.9)), "points": len(rows)}
    return out


COLLECTIVE_NAMES = ("a2a_call_latency_s", "a2a_peer_latency_s", "allreduce_call_latency_s",
                    "allreduce_hop_latency_s", "allreduce_table_hop_s", "inv_link_bw")


def fit_collectives(m: Measurements) -> FitResult:
    """All-to-all t = a2a_call + a2a_peer (W - 1) + bytes * inv_link; ring all-reduce of
    k tables t = ar_call + ar_hop 2 (W - 1) + ar_table_hop k 2 (W - 1) + bytes * inv_link.
    With one world size the per-peer and per-hop terms cannot be told from the call's."""
    a2a = to_arrays(m.alltoall, ("world", "bytes", "seconds"))
    worlds = set(a2a[:, 0].tolist()) | {float(r["world"]) for r in m.allreduce}
    per_peer = len(worlds) > 1
    rows = []
    for w, b, _ in a2a:
        rows.append([1.0, (w - 1) if per_peer else 0.0, 0.0, 0.0, 0.0, b])
    for r in m.allreduce:
        w, hops = float(r["world"]), 2 * (float(r["world"]) - 1)
        rows.append([0.0, 0.0, 1.0, hops if per_peer else 0.0,
                     float(r.get("tables", 1)) * hops, float(r["bytes"])])
    x = np.array(rows)
    t = np.concatenate([a2a[:, 2], [float(r["seconds"]) for r in m.allreduce]])
    return _fit_seen_columns(x, t, COLLECTIVE_NAMES)


def fit_step_alltoall(m: Measurements, peer: float, inv_link: float) -> FitResult | None:
    """The all-to-all's call latency where the executor makes the call: the calibration
    plans' all-to-all phases (executed.a2a_points), t = calls x (call + peer x (W - 1)) +
    bytes x inv_link, with the peer term and the bandwidth the microbenchmarks' (sizes
    to 1 MB and several world sizes see them; a plan's phases of tens of kB on one world size
    do not): `peer` seconds per peer and call, `inv_link` seconds per byte, as the profile
    will price them. None without such points (one rank)."""
    pts = m.step_alltoall
    if not pts:
        return None
    calls = np.array([[float(r["calls"])] for r in pts])
    offset = np.array([float(r["calls"]) * peer * (float(r["world"]) - 1)
                       + float(r["bytes"]) * inv_link for r in pts])
    t = np.array([float(r["seconds"]) for r in pts])
    return fit_linear(calls, t, ("a2a_call_latency_s",), offset=offset)


# The input format's largest bandwidth (planner/spec/hardware.py GBps), GB/s.
_MAX_GBPS = 1e6
# The hardware schema's least bandwidth and efficiency (planner/spec/hardware.py).
_MIN_GBPS, _MIN_EFFICIENCY = 1e-3, 1e-6


def _efficiency(inv_bw: float, peak_gbs: float) -> tuple[float, float] | None:
    """(peak, efficiency) whose product is the fitted bandwidth (1 / inv_bw bytes/s); the peak
    is raised where the fit is faster. None where the data could not see a bandwidth (an
    inverse bandwidth of 0, or past what the input format takes): the preset's are kept."""
    if inv_bw <= 0 or not np.isfinite(inv_bw) or 1e-9 / inv_bw > _MAX_GBPS:
        return None
    eff_gbs = 1e-9 / inv_bw
    if eff_gbs > peak_gbs:
        return eff_gbs, 1.0
    if eff_gbs / peak_gbs < _MIN_EFFICIENCY:
        # Below the least efficiency the hardware schema takes: the fitted bandwidth as the
        # peak (at least the schema's least), or the preset's where even that is past it.
        peak = max(_MIN_GBPS, eff_gbs)
        return (peak, eff_gbs / peak) if eff_gbs / peak >= _MIN_EFFICIENCY else None
    return peak_gbs, eff_gbs / peak_gbs


def fit_overlap(points: list[dict[str, float]]) -> dict[str, Any] | None:
    """pipeline_overlap from bench_overlap's points (module docstring); None without any."""
    shares = np.array([(p["sequential_s"] - p["pipelined_s"]) / p["input_s"]
                       for p in points if p.get("input_s")])
    if len(shares) == 0:
        return None
    rng = np.random.default_rng(0)  # deterministic resamples
    boot = np.median(rng.choice(shares, size=(2000, len(shares))), axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    raw = float(np.median(shares))
    ci = [min(1.0, max(0.0, float(lo))), min(1.0, max(0.0, float(hi)))]
    # The raw interval, before clipping, must be narrow and a share a step can have.
    inside = float(lo) >= -OVERLAP_SLACK and float(hi) <= 1 + OVERLAP_SLACK
    return {"value": min(1.0, max(0.0, raw)), "median_share": raw, "ci95": ci,
            "ci95_raw": [float(lo), float(hi)],
            "determined": bool(float(hi) - float(lo) <= OVERLAP_MAX_INTERVAL and inside),
            "points": len(shares), "shares": shares.tolist()}


def build_profile(preset: str, m: Measurements, device: str, command: str
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(hardware spec dict for --hardware, provenance dict with every fit)."""
    cache, tried = choose_device_cache(m, cache_levels())
    kern = tried[cache]
    hfit = fit_host(m)
    # One rank (or one GPU) measures no collective: their constants stay the preset's.
    coll = fit_collectives(m) if m.alltoall and m.allreduce else None
    spec = preset_dict(preset)
    consts = dict(spec.get("constants", {}))
    kept: list[str] = []
    hbm = _efficiency(kern.value("inv_hbm_bw"), float(spec["gpu"]["hbm_bandwidth_gb_per_s"]))
    if hbm is None:
        kept.append("hbm_efficiency")
    else:
        spec["gpu"] = {**spec["gpu"], "hbm_bandwidth_gb_per_s": hbm[0]}
        consts["hbm_efficiency"] = hbm[1]
        # The backward's bandwidth as a share of the forward's (at most 1: a faster
        # backward than forward is noise, not a finding).
        inv_b = kern.value("inv_backward_bw")
        consts["backward_efficiency"] = (max(1e-6, min(1.0, kern.value("inv_hbm_bw") / inv_b))
                                         if inv_b > 0 else 1.0)
        consts["device_cache_bytes"] = cache
        for name, slow, fast in _CACHE_FACTORS:
            # How many times faster the cache serves (1 to 1e4, the input's range).
            s, f = kern.value(slow), kern.value(fast)
            consts[name] = (1.0 if cache == 0 or s <= 0 else
                            1e4 if f <= 0 else min(1e4, max(1.0, s / f)))
    link = (_efficiency(coll.value("inv_link_bw"), float(spec["links"]["nvlink_gb_per_s"]))
            if coll else None)
    if link is None:
        kept.append("nvlink_efficiency")
    else:
        spec["links"] = {**spec["links"], "nvlink_gb_per_s": link[0]}
        consts["nvlink_efficiency"] = link[1]
    # The call's latency where the executor makes it, when the calibration plans ran on
    # several ranks (executed.py), with the link the profile prices (the preset's where the
    # microbenchmarks could not see one); else the microbenchmarks'.
    step = None
    if coll is not None:
        eff_link = float(spec["links"]["nvlink_gb_per_s"]) * 1e9 * float(consts.get(
            "nvlink_efficiency", CostConstants().nvlink_efficiency))
        step = fit_step_alltoall(m, coll.value("a2a_peer_latency_s"), 1.0 / eff_link)
    if hfit is None:
        kept += ["pcie_efficiency", "ssd_efficiency", "host_piece_overhead_s"]
    else:
        g = int(spec.get("gpus_per_host", 1))
        pcie = _efficiency(hfit.value("inv_host_bw"), float(spec["links"]["pcie_gb_per_s"]))
        if pcie is None:
            kept.append("pcie_efficiency")
        else:
            spec["links"] = {**spec["links"], "pcie_gb_per_s": pcie[0]}
            consts["pcie_efficiency"] = pcie[1]
            # eff_host_read_bw = min(PCIe, DDR's share): keep DDR's share at or above the
            # fitted rate, so the fitted rate is what the model reads.
            need = pcie[0] * pcie[1] * g
            ddr_bw = float(spec["host"]["ddr_bandwidth_gb_per_s"])
            ddr_eff = float(consts.get("ddr_efficiency", CostConstants().ddr_efficiency))
            if ddr_bw * ddr_eff < need:
                if ddr_bw >= need:
                    consts["ddr_efficiency"] = need / ddr_bw
                else:
                    spec["host"] = {**spec["host"], "ddr_bandwidth_gb_per_s": need}
                    consts["ddr_efficiency"] = 1.0
        # A GPU's share of the host's SSD rate at the profile's gpus_per_host.
        inv_ssd = hfit.value("inv_ssd_bw")
        ssd = _efficiency(inv_ssd / g, float(spec["host"]["ssd_bandwidth_gb_per_s"])) \
            if inv_ssd > 0 else None
        if ssd is None:
            kept.append("ssd_efficiency")
        else:
            spec["host"] = {**spec["host"], "ssd_bandwidth_gb_per_s": ssd[0]}
            consts["ssd_efficiency"] = ssd[1]
    fits = [f for f in (kern, hfit, coll) if f is not None]
    if coll is None:
        kept += [n for n in COLLECTIVE_NAMES if not n.startswith("inv_")]
    for fit in (*fits, *([step] if step else [])):  # the step's call after the microbenchmarks'
        for name, value in zip(fit.names, fit.values, strict=True):
            if not name.startswith("inv_"):
                consts[name] = min(float(value), 1.0)
    overlap = fit_overlap(m.overlap)
    if overlap is None or not overlap["determined"]:
        kept.append("pipeline_overlap")
    else:
        consts["pipeline_overlap"] = overlap["value"]
    spec["constants"] = consts
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    host = socket.gethostname()
    spec["name"] = f"{spec.get('name', preset)}-calibrated-{device}"
    spec["description"] = (f"{preset} with constants fitted by planner calibrate on {host} "
                           f"({device}), {now}")
    spec["sources"] = [
        *spec.get("sources", []),
        f"Calibrated: `{command}` on {host}, {now}, torch {torch.__version__}, device "
        f"{device}; fitted: {', '.join(n for f in fits for n in f.names)}"
        + ("; a2a_call_latency_s on the calibration plans' all-to-all phases"
           if step else "")
        + (f", pipeline_overlap ({overlap['value']:.3g}, 95% {overlap['ci95'][0]:.3g} .. "
           f"{overlap['ci95'][1]:.3g}, over {overlap['points']} ranks)"
           if overlap and overlap["determined"] else "")
        + ".",
        "Fit residuals (relative): " + "; ".join(
            f"{k} median {f.rel_residual_median:.3f}, p90 {f.rel_residual_p90:.3f} over "
            f"{f.points} points" for k, f in (("kernels", kern), ("host tiers", hfit),
                                              ("collectives", coll),
                                              ("all-to-all calls in the plans' steps", step))
            if f is not None) + ". Every interval: the provenance file beside this one."
        + (f" Not seen by the data, kept from {preset}: {', '.join(kept)}." if kept else ""),
    ]
    provenance = {
        "command": command,
        "date": now,
        "host": host,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gloo": torch.distributed.is_gloo_available(),
        "device": device,
        "cuda": (torch.cuda.get_device_name(0)
                 if device == "cuda" and torch.cuda.is_available() else None),
        "base_preset": preset,
        # Compute timed as the ranks time their timed steps (bench.py), no memory probe.
        "compute_clock": ("wall time after a device synchronize" if device == "cuda" else
                          "thread CPU time (time.thread_time), as comm.Timer"),
        # The microbenchmarks' collectives: wall time after a barrier, each rank's lower
        # quartile (bench.py); the calibration plans' all-to-alls: executed.step_clock.
        "step_alltoall_clock": step_clock(device) if step else None,
        "device_cache_tried": {str(c): f.rel_residual_median for c, f in tried.items()},
        "fits": {"kernels": kern.as_dict(),
                 "host": ({**hfit.as_dict(), "by_tier": host_residuals_by_tier(m, hfit)}
                          if hfit else None),
                 "collectives": coll.as_dict() if coll else None,
                 # Its a2a_call_latency_s is the profile's (the collectives' own is the
                 # microbenchmarks' alone).
                 "step_alltoall": step.as_dict() if step else None,
                 "overlap": overlap},
        "effective_bandwidth_gb_per_s": {
            k: (1e-9 / v if v > 0 else None) for k, v in (
                ("hbm", kern.value("inv_hbm_bw")), ("backward", kern.value("inv_backward_bw")),
                ("host_read", hfit.value("inv_host_bw") if hfit else 0.0),
                ("ssd", hfit.value("inv_ssd_bw") if hfit else 0.0),
                ("link", coll.value("inv_link_bw") if coll else 0.0))},
        "kept_from_preset": kept,
        "measurements": {"lookup": m.lookup, "backward": m.backward, "host": m.host,
                         "alltoall": m.alltoall, "allreduce": m.allreduce,
                         "overlap": m.overlap, "step_alltoall": m.step_alltoall},
    }
    return spec, provenance
