"""`execute`: scale the plan, launch the ranks, compare what they measured with the cost model
and what they computed with the unsharded reference, and say which checks pass."""

import math
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cost_models import ShardingType, UniformAccess, cache_rows
from cost_models.sizes import comm_row_bytes
from cost_models.types import CommPrecision
from planner.executor.job import RunOptions, tensors_file, write_job
from planner.executor.launch import launch
from planner.executor.layout import ExecLayout, check_wire_widths, exec_layout
from planner.executor.predict import predict
from planner.executor.scale import scaled_plan, with_cache_policy
from planner.executor.warmup import warmup_steps
from planner.plan_model import Plan

# The reference (reference.py) is float64 and shares no code with the ranks, so nothing is
# bit-identical: every comparison has a tolerance derived from the precisions involved.
#
# Pooled outputs at step 0 (same weights on both sides; the forward's rounding alone), per
# element, |sharded - reference| <= bound, where the bound adds:
# - fp32 accumulation: the ranks sum a bag of n rows, fold W row-split partial sums and
#   dequantize: at most (n + W + 1) additions/products in fp32, each off by at most u = 2^-24
#   of the running magnitude, so (n_max + W + 1) * u * sum over the bag of |w| (recursive
#   summation's bound, gamma_n ~ n*u, with the reference's own sum of |w|); for weights
#   stored as fp16/bf16, whose fused pooling runs in their dtype, u = (n + 1) * u_storage;
# - the wire, once for every partial sum sent (row-split: one per row range; table-row-wise
#   and grid add the host-reduced sum): fp16/bf16 round each element to nearest, at most
#   u_p * |x| (u_p = 2^-11, 2^-8; fp16 subnormals add 2^-25 absolute); int8 rounds to the
#   nearest of 127 steps of the row's largest |x|, at most amax/254 per element; fp8 e4m3 at
#   most 2^-4 * |x| plus a half subnormal step, amax/448 * 2^-10;
# times 1.001. A 1% dequantization scale error costs 0.01*|x| on an element: over 2.5x the
# int8 bound on the row's largest element, 20x the fp16 bound on every element.
#
# Weights, optimizer states and later outputs: relative Frobenius error, |sharded - ref| /
# |ref - initial| (weights), / |ref| (states, outputs of steps >= 1), at most
#   ERROR_GAIN * steps * u_eff,
# u_eff the largest unit roundoff on the path: the wire's each way (fp16 2^-11, bf16 2^-8,
# int8 2^-8 = half of 1/127, fp8 2^-4), the storage's (fp16/bf16 weights rounded after every
# update) and fp32's accumulation (n_max + W + 1) * 2^-24. A norm, not a maximum: Adagrad and
# Adam normalise each element's update, so an element whose gradient is near zero can see its
# relative error grow without bound while the table's barely moves. ERROR_GAIN bounds how
# much an update amplifies its inputs' relative error (the loss's gradient feeds back the
# forward's error; the adaptive optimizers divide by a rounded sqrt): measured at most 2.43
# (the data-parallel Adam table, int8 backward) over every optimizer, tier and precision the
# tests run; set to 8.
#
# int8 weights (stored.py; the reference quantizes apart, in float64): both sides quantize
# every row they update with the same rule, so the quantization itself is no error between
# them; what differs is (a) the dequantized values, fp32 against float64 (scale rounded to
# fp32, code * scale + bias): 2^-21 of |bias| + 255 * scale per element (reference.py
# INT8_DEQUANT), and (b) codes that round the other way: where an element's argument t =
# (x - bias) / scale lies within the two sides' difference of a rounding boundary, they pick
# adjacent codes, one code step (scale) apart. At step 0 the weights are the same fp32
# numbers on both sides, so (b) happens only where t is within 2^-13 (7 fp32 roundings of t <=
# 255) of a boundary: the reference marks those elements and the output bound adds, per
# element, the bag's sum of the marked rows' steps and of (a). After updates t differs by the
# pre-quantization difference delta too, a flip having probability <= 2 * (2^-13 + |delta| /
# step) per quantized element; with |delta|_F <= A = tol * |ref - initial| (the float terms
# above) and Cauchy-Schwarz, the expected flips are at most
#   E = (steps + 1) * 2 * 2^-13 * N + steps * 2 * A * sqrt(sum 1 / step^2)
# (N elements, steps from the reference). Allowed: k = 2 + 4 * E whole flips of the largest
# step, at most one per element and quantization ((steps + 1) * N: rounding two values to one
# grid moves them at most one step further apart), W = sqrt(k) * step_max, so
# - weights: |sharded - ref|_F <= A + (steps + 1) * 2^-21 * |bias + 255 scale|_F + W;
# - later outputs: each output sums <= bag_max rows and a row reaches <= lookups_max outputs
#   a step (|pooling|_2 <= sqrt(bag_max * lookups_max)): + sqrt((steps - 1) * bag_max *
#   lookups_max) * (W + dequantization) on top of tol * |ref|;
# - optimizer states: the flips' relative change of the loss gradient, u_flip =
#   sqrt(bag_max * lookups_max) * (W + dequantization) / min over steps |pooled - target|_F,
#   amplified as above: + ERROR_GAIN * steps * u_flip.
# With fp32 communication (the mutation suite) this allows about 2 flips of the largest step
# per table, against ~N/2 one-step errors when codes are truncated instead of rounded and
# ~1.3 steps on most elements when the stored scale is 1% off.
UNIT_ROUNDOFF = {CommPrecision.FP32: 2.0**-24, CommPrecision.FP16: 2.0**-11,
                 CommPrecision.BF16: 2.0**-8, CommPrecision.INT8: 2.0**-8,
                 CommPrecision.FP8: 2.0**-4}
STORAGE_ROUNDOFF = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}
ERROR_GAIN = 8.0
HIT_RATE_POINTS = 0.02
HIT_SIGMAS = 3.0
# Row-split pieces receive the ids that fall in their rows: a random count whose expectation is
# the model's figure. Allowed deviation for uniform access: this many standard deviations.
ID_SIGMAS = 5.0
_BYTES_REL = 1e-9


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class ExecutionReport:
    plan_hash: str
    world: int
    batch: int
    steps: int
    scale_rows: float
    device: str
    ranks: list[dict[str, Any]] = field(default_factory=list)
    pieces: list[dict[str, Any]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    errors: dict[str, dict[str, float]] = field(default_factory=dict)
    warmup_steps: int = 0  # forward-only steps before the measured ones (caches warmed)
    # Seconds per rank and phase, predicted beside measured (compare.compare): collectives
    # in wall time after a barrier; in compare_cpu, in their threads' CPU time (comm.py).
    compare: dict[str, Any] = field(default_factory=dict)
    compare_cpu: dict[str, Any] = field(default_factory=dict)
    # The ranks' embedding kernels ("torch" or "fbgemm", RunOptions.kernels resolved), and
    # with fbgemm, per piece: "fbgemm", or "torch: " and why the TBE does not serve it.
    kernels: str = "torch"
    piece_kernels: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["ok"] = self.ok
        return body


def execute(plan: Plan, opts: RunOptions, scale_rows: float = 1.0, batch: int | None = None,
            run_dir: Path | None = None, timeout_s: float = 600.0,
            reference: bool = True, start: str = "forkserver") -> ExecutionReport:
    """Run `plan` (scaled) on this machine, one process per rank, and check it. `start`:
    how ranks start (launch.launch)."""
    with tempfile.TemporaryDirectory(prefix="planner-exec-") as tmp:
        rd = run_dir or Path(tmp)
        world = prepare(plan, opts, rd, scale_rows, batch, reference)
        launch(rd, world, timeout_s, start)
        return collect(rd)


def prepare(plan: Plan, opts: RunOptions, run_dir: Path, scale_rows: float = 1.0,
            batch: int | None = None, reference: bool = True) -> int:
    """Write the job (the scaled plan and options) for the ranks; returns the world size."""
    run = scaled_plan(plan, scale_rows, batch)
    if opts.cache_policy is not None:
        run = with_cache_policy(run, opts.cache_policy)
    # The warm-up the caches of the plan that runs need, unless the caller fixed one.
    warm = warmup_steps(run) if opts.warmup_steps is None else opts.warmup_steps
    lay = exec_layout(run)
    check_wire_widths(lay)
    check_pooling_modes(lay)
    from planner.executor.fbgemm import resolve

    opts = RunOptions(**{**asdict(opts), "scale_rows": scale_rows, "warmup_steps": warm,
                         "keep_outputs": opts.keep_outputs and reference,
                         "kernels": resolve(opts.kernels)})
    write_job(run_dir, run, opts)
    return lay.world


def check_pooling_modes(lay: ExecLayout) -> None:
    """What the executor runs, refused before any rank starts (exit 2 from the CLI)
    otherwise: sum-pooled and sequence tables (every data type trains; int8 rows as FBGEMM's
    training TBE stores and updates them, planner/executor/stored.py)."""
    for t in lay.tables:
        if t.pooling_mode == "mean":
            raise ValueError(
                f"table '{t.name}' has pooling_mode mean: planner execute runs sum-pooled "
                f"and sequence (none) tables only; execute a copy of the plan with this "
                f"table's pooling_mode sum (the same bytes and memory)")


def collect(run_dir: Path) -> ExecutionReport:
    """The report of a finished run: what every rank wrote to run_dir, against the model."""
    import json

    from planner.executor.job import read_job, result_file

    run, opts = read_job(run_dir)
    lay = exec_layout(run)
    measured = [json.loads(result_file(run_dir, r).read_text()) for r in range(lay.world)]
    rep = ExecutionReport(run.plan_hash, lay.world, lay.batch, opts.steps, opts.scale_rows,
                          opts.device)
    rep.warmup_steps = opts.warmup_steps or 0
    rep.kernels = opts.kernels
    for m in measured:
        rep.piece_kernels.update(m.get("kernels", {}))
    _compare_model(rep, run, lay, measured)
    _compare_peak(rep, run, measured)
    from planner.executor.compare import compare

    rep.compare = compare(run, rep.ranks, opts.device)
    rep.compare_cpu = compare(run, rep.ranks, opts.device, collective_clock="cpu")
    if opts.keep_outputs:
        _compare_reference(rep, lay, opts, run_dir)
    return rep


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_BYTES_REL, abs_tol=1e-6)


def _compare_model(rep: ExecutionReport, run: Plan, lay: ExecLayout,
                   measured: list[dict[str, Any]]) -> None:
    ranks_pred, pieces_pred = predict(run)
    len_bad, fwd_bad, bwd_bad, ar_rank_bad, mem_bad = [], [], [], [], []
    ar_meas = ar_pred = 0.0
    # A row-wise piece of a sequence table sends one vector per id it got from another rank:
    # the model's count is an expectation (the ids in its range vary), checked with the ids
    # (_compare_pieces). Its output bytes are compared given the ids it measured: exactly
    # one vector (and one gradient back) per id.
    given: dict[int, list[float]] = {}
    for pp in pieces_pred:
        ti, j = (int(x) for x in pp.key.split("."))
        t = lay.tables[ti]
        if t.sequence and t.row_split:
            got = measured[pp.rank]["pieces"].get(pp.key, {}).get("ids_bytes", 0.0)
            n = got / lay.id_bytes
            cols = t.pieces[j].cols
            adj = given.setdefault(pp.rank, [0.0, 0.0])
            adj[0] += n * comm_row_bytes(lay.fwd_precision, cols) - pp.out_fwd_bytes
            adj[1] += n * comm_row_bytes(lay.bwd_precision, cols) - pp.out_bwd_bytes
    for m, p in zip(measured, ranks_pred, strict=True):
        adj_fwd, adj_bwd = given.get(m["rank"], (0.0, 0.0))
        col = m["collectives"]
        get = lambda name, side, c=col: c.get(name, {}).get(side, 0.0)  # noqa: E731
        meas = {"input_lengths": get("input_lengths", "recv"),
                "input_ids": get("input_ids", "recv"), "output_fwd": get("output_fwd", "sent"),
                "output_bwd": get("output_bwd", "recv"), "allreduce": get("allreduce", "sent")}
        if not _close(meas["input_lengths"], p.bytes["input_lengths"]):
            len_bad.append(m["rank"])
        if not _close(meas["output_fwd"], p.bytes["output_fwd"] + adj_fwd):
            fwd_bad.append(m["rank"])
        if not _close(meas["output_bwd"], p.bytes["output_bwd"] + adj_bwd):
            bwd_bad.append(m["rank"])
        if not _close(meas["allreduce"], p.bytes["allreduce"]):
            ar_rank_bad.append(m["rank"])
        ar_meas += meas["allreduce"]
        ar_pred += p.bytes["allreduce"]
        mem = {k: m["memory"][k] for k in ("hbm", "ddr", "ssd")}
        # The caches' policy state (per-row counts or stamps) is host memory the model counts
        # in DDR (cost_models.memory.POLICY_STATE_BYTES_PER_ROW).
        mem["ddr"] += m["memory"]["extra_ddr"]
        if mem != p.memory:
            mem_bad.append(f"rank {m['rank']}: {mem} vs {p.memory}")
        rep.ranks.append({
            "rank": m["rank"], "device": m["device"],
            "bytes": {k: {"measured": meas[k], "predicted": p.bytes[k]} for k in meas},
            "collectives": col,  # every collective's bytes sent and received, per step
            "seconds_measured": m["seconds"], "seconds_predicted": p.seconds,
            "memory": {k: {"measured": mem[k], "predicted": p.memory[k]} for k in mem},
            "executor_extra_ddr": m["memory"]["extra_ddr"],
            # per timed step and phase (comm.PhaseTime): the steps after the measured ones,
            # the memory probe stopped (job.RunOptions.timed_steps)
            "timing": m.get("timing", []),
            "timed_steps": m.get("timed_steps", 0),
            "buckets": m.get("buckets", []),  # replicas' all-reduce buckets (table indices)
            # Pipelined plans: whether the memory probe's steps ran their inputs on the lane
            # (CUDA) or in turn (CPU: the profiler sees no other thread's allocations).
            "pipelined_measured_steps": m.get("pipelined_measured_steps", False),
            # What the collectives' coll_proc_cpu holds: "group threads" (the caller and its
            # process group's threads) or "process" (thread_clock.py).
            "collective_cpu_clock": m.get("collective_cpu_clock"),
        })
    rep.checks.append(Check("bytes: input all-to-all, bag lengths, per rank", not len_bad,
                            f"differ on ranks {len_bad}" if len_bad else "equal on every rank"))
    seq_note = ("; row-wise pieces of sequence tables: one vector per id they received"
                if given else "")
    rep.checks.append(Check("bytes: output all-to-all forward, per rank", not fwd_bad,
                            (f"differ on ranks {fwd_bad}" if fwd_bad else "equal on every rank")
                            + seq_note))
    rep.checks.append(Check("bytes: output all-to-all backward, per rank", not bwd_bad,
                            f"differ on ranks {bwd_bad}" if bwd_bad else "equal on every rank"))
    uneven = any(t.data_parallel and t.rows % lay.world for t in lay.tables)
    ar_ok = _close(ar_meas, ar_pred) and (uneven or not ar_rank_bad)
    rep.checks.append(Check(
        "bytes: data-parallel all-reduce", ar_ok,
        f"total {ar_meas:.0f} measured, {ar_pred:.0f} predicted" + (
            "; per rank they differ by the uneven ring chunks" if uneven and ar_rank_bad
            else "; equal on every rank" if not ar_rank_bad else f"; ranks {ar_rank_bad}")))
    rep.checks.append(Check("memory held per rank (HBM, DDR, SSD)", not mem_bad,
                            "; ".join(mem_bad) or "equal on every rank"))
    _compare_pieces(rep, lay, measured, pieces_pred)


def _compare_peak(rep: ExecutionReport, run: Plan, measured: list[dict[str, Any]],
                  predicted: list[int] | None = None) -> None:
    """What the allocator measured at its peak, per rank and phase, against the memory
    model's peak for the rank: what its pieces hold (weights, optimizer state, caches and
    their metadata) plus its step buffers at the step's peak over the phases
    (cost_models.memory.step_peak, from the executor's own buffers). A CPU run keeps every
    tier in one memory: there HBM plus DDR. The plan's per-GPU figure (the planner's bound,
    summed per piece) is reported beside it. Neither side counts the hardware's fixed reserve
    (CUDA context, NCCL), so the error is the one above it. `predicted`: per rank, instead
    of the model's (tests)."""
    gpus = {g.rank: g for g in run.gpus}
    # One device per run: a CPU run keeps every tier in one memory and its own allocator.
    on_cpu = any(not str(m["device"]).startswith("cuda") for m in measured)
    model = {rp.rank: rp for rp in predict(run, "cpu" if on_cpu else "cuda")[0]}
    bad, rounding = [], []
    for i, (m, r) in enumerate(zip(measured, rep.ranks, strict=True)):
        pm = m.get("peak_memory")
        if pm is None:  # a run from before the probe
            continue
        g, rp = gpus[m["rank"]], model[m["rank"]]
        held = rp.memory["hbm"] + (rp.memory["ddr"] if on_cpu else 0)
        pred = predicted[i] if predicted is not None else held + rp.step_peak
        # CUDA: the requested bytes (the allocator's rounding is not the plan's; memprobe.py)
        req = pm.get("phase_requested_peak")
        peaks = req or pm["phase_peak"]
        step_peak = max(peaks.values(), default=0) if req else pm["step_peak"]
        extra = pm["step_peak"] - step_peak  # the allocator's rounding (0 off CUDA)
        r["peak_memory"] = {
            "how": pm["how"] + ("; compared: requested_bytes, the bytes the tensors asked for"
                                if req else ""),
            "predicted": pred,
            "predicted_is": ("model peak: hbm + ddr held (one memory on CPU) + step buffers"
                             if on_cpu else "model peak: hbm held + step buffers"),
            "predicted_held": held,
            "predicted_step_buffers": rp.step_peak,
            "predicted_buffer_terms": rp.buffer_terms,
            "plan_bound": g.hbm_bytes + (g.ddr_bytes if on_cpu else 0),
            "measured_step_peak": step_peak,
            "ratio": step_peak / pred if pred else float("inf"),
            "error": (pred - step_peak) / step_peak if step_peak else float("inf"),
            "phase_peak": peaks,
            "phase_transient": pm["phase_transient"],
            "step_start": pm["step_start"],
            "held_after_init": pm["init_bytes"],
            "init_peak": pm["init_peak"],
            "gpu_hbm_cap_bytes": g.hbm_cap_bytes,
            "rss_hwm": pm.get("rss_hwm"),
            **({"phase_allocated_peak": pm["phase_peak"],
                "allocated_step_peak": pm["step_peak"],
                "allocator_rounding": extra,
                "requested_after_init": pm.get("init_requested")} if req else {}),
            **{k: pm[k] for k in ("phase_reserved_peak", "step_reserved_peak",
                                  "num_alloc_retries", "num_ooms", "peak_blocks", "buffers_watched",
                                  "freed_unseen") if k in pm},
        }
        if req:
            rounding.append(f"; rank {m['rank']}: the allocator's blocks {pm['step_peak']:,} B"
                            f" at the peak (+{extra:,} B of its rounding)")
        over = [(k, v) for k, v in peaks.items() if v > pred]
        if over:
            worst = max(over, key=lambda kv: kv[1])
            bad.append(f"rank {m['rank']}: {worst[1]:,} B in phase {worst[0]} > {pred:,} B "
                       f"predicted ({worst[1] / pred if pred else float('inf'):.3g}x; over "
                       f"in {', '.join(k for k, _ in over)})")
    if any("peak_memory" in r for r in rep.ranks):
        unlaned = run.request.model.pipelined and not all(
            r.get("pipelined_measured_steps") for r in rep.ranks)
        rep.checks.append(Check(
            "memory peak per rank, allocator-measured <= memory model", not bad,
            ("; ".join(bad) or "within the model on every rank and phase")
            + "".join(rounding)
            + ("; a pipelined plan on CPU: the measured steps ran their inputs in turn (the "
               "profiler records no other thread's allocations), so the next batch's ids "
               "held beside a step are the model's figure, not measured" if unlaned else "")))


def _compare_pieces(rep: ExecutionReport, lay: ExecLayout, measured: list[dict[str, Any]],
                    pieces_pred: list[Any]) -> None:
    by_rank = {m["rank"]: m for m in measured}
    exact_bad, stat_bad, sum_bad, hit_bad, hits, rounded = [], [], [], [], [], []
    band_meas: dict[tuple[int, int], float] = {}
    band_pred: dict[tuple[int, int], float] = {}
    for pp in pieces_pred:
        ti, j = (int(x) for x in pp.key.split("."))
        t = lay.tables[ti]
        if t.data_parallel:
            continue
        m = by_rank[pp.rank]
        got_piece = m["pieces"].get(pp.key, {})
        got = got_piece.get("ids_bytes", 0.0)
        cache = m["cache"].get(pp.key)
        measured_hit = cache["hits"] / cache["lookups"] if cache and cache["lookups"] else None
        entry = {"key": pp.key, "table": pp.table, "kind": pp.kind, "tier": pp.tier,
                 "rank": pp.rank, "ids_bytes": {"measured": got, "predicted": pp.ids_bytes},
                 "lengths_bytes": {"measured": got_piece.get("lengths_bytes", 0.0),
                                   "predicted": pp.lengths_bytes},
                 "hit_rate": {"measured": measured_hit, "predicted": pp.hit_rate}}
        rep.pieces.append(entry)
        # Each rank draws round(b * pooling) ids per table: the model's b * pooling when that
        # is a whole number, which is what the comparisons ask.
        whole = round(lay.batch * t.pooling)
        drawn = whole / (lay.batch * t.pooling)
        if whole != lay.batch * t.pooling:
            rounded.append(t.name)
        if t.row_split:
            # Which ids fall in a row range depends on the ids drawn: per piece, the model's
            # figure is an expectation. Over a column band the pieces' ids add up to all ids
            # drawn, exactly, on the wire or not.
            piece = t.pieces[j]
            band = (ti, piece.col0)
            band_meas[band] = band_meas.get(band, 0.0) + got / lay.id_bytes + got_piece.get(
                "own_ids", 0.0)
            band_pred[band] = band_pred.get(band, 0.0) + pp.ids_total * drawn
            n = pp.ids_bytes / lay.id_bytes
            share = piece.rows / t.rows
            # Per step, ids landing in the range ~ binomial(total ids, share); averaged.
            sd = math.sqrt(max(n * (1 - share), 1.0) / rep.steps)
            if isinstance(t.access, UniformAccess) and abs(got / lay.id_bytes - n) > \
                    ID_SIGMAS * sd:
                stat_bad.append(f"{pp.key} ({got / lay.id_bytes:.1f} ids vs {n:.1f})")
        elif not _close(got, pp.ids_bytes * drawn):
            exact_bad.append(pp.key)
        if pp.hit_rate is not None and measured_hit is not None:
            allowed = hit_allowance(pp.hit_rate, cache["lookups"], rep.steps,
                                    cache_rows(t.cache_ratio, t.pieces[j].rows))
            entry["hit_rate"]["allowed"] = allowed
            entry["hit_rate"]["policy"] = t.cache_policy.value
            hits.append(f"{pp.table}[{pp.key}] {t.cache_policy.value} {measured_hit:.4f} vs "
                        f"{pp.hit_rate:.4f} (+-{allowed:.3f})")
            if abs(measured_hit - pp.hit_rate) > allowed:
                hit_bad.append(hits[-1])
    for band, pred in band_pred.items():
        if not _close(band_meas[band], pred):
            sum_bad.append(f"{lay.tables[band[0]].name} cols {band[1]}+ "
                           f"({band_meas[band]:.1f} ids vs {pred:.1f})")
    note = (f"; b x pooling is fractional for {sorted(set(rounded))}: compared with "
            f"round(b x pooling) ids per rank" if rounded else "")
    rep.checks.append(Check("bytes: input all-to-all, ids of table-/column-wise pieces, per "
                            "piece", not exact_bad,
                            (f"differ: {exact_bad}" if exact_bad else "equal") + note))
    rep.checks.append(Check(
        "ids: every id of a row-split table served by exactly one piece per column band",
        not sum_bad, "; ".join(sum_bad) or (
            f"equal to the model's b x W x pooling for {len(band_pred)} bands" if band_pred
            else "no row-split tables")))
    rep.checks.append(Check(
        "bytes: input ids of row-split pieces (an expectation), uniform tables",
        not stat_bad, "; ".join(stat_bad) or f"within {ID_SIGMAS:g} standard deviations"))
    rep.checks.append(Check(
        f"cache hit rate per lookup vs its policy's model, within {HIT_RATE_POINTS * 100:g} "
        f"points or {HIT_SIGMAS:g} standard errors", not hit_bad,
        ("off: " + "; ".join(hit_bad)) if hit_bad else ("; ".join(hits) or "no cached pieces")))


def hit_allowance(predicted: float, lookups: int, steps: int, slots: int) -> float:
    """How far a measured hit rate may fall from the model's: HIT_RATE_POINTS, or HIT_SIGMAS
    standard errors where the run's lookups are too few for that. A binomial standard error,
    widened by sqrt(1 + lookups per step / slots): the cache's content is one draw per step
    (it turns over within a step when a step looks up more rows than it holds), so lookups of
    one step are not independent samples. On the store alone (LRU and LFU, uniform and zipf 1.0,
    60 to 2000 rows, 40 seeds per case, 640 runs) the widened |z| stayed within 1.6."""
    if lookups <= 0:
        return 1.0
    per_step = lookups / max(steps, 1)
    var = predicted * (1 - predicted) / lookups * (1 + per_step / max(slots, 1))
    return max(HIT_RATE_POINTS, HIT_SIGMAS * math.sqrt(var))


def output_bound(lay: ExecLayout, t: Any, ref: Any) -> Any:
    """Per element of the global batch's pooled outputs at step 0 ([B, dim]): the most the
    sharded run may differ from the reference (see the tolerances above)."""
    import torch

    u32 = UNIT_ROUNDOFF[CommPrecision.FP32]
    n = ref.max_bag[t.index]
    # fp16/bf16 weights: torch's fused pooling returns (and may accumulate in) their dtype.
    u = max(u32, (n + 1) * STORAGE_ROUNDOFF.get(t.data_type.value, 0.0))
    bound = (n + lay.world + 1) * u * ref.abs_pooled[t.index]
    if t.index in ref.int8_slack0:  # int8: ambiguous codes and fp32 dequantization
        bound = bound + ref.int8_slack0[t.index]
    prec = lay.fwd_precision
    if t.data_parallel or prec is CommPrecision.FP32:
        return bound * 1.001
    for ch in t.chunks:
        parts = list(ref.partials[(t.index, ch.col0)])
        if t.host_reduced:
            parts.append(sum(parts[1:], parts[0]))
        wire = torch.zeros_like(parts[0])
        for x in parts:
            amax = x.abs().amax(dim=1, keepdim=True)
            if prec is CommPrecision.INT8:
                wire += amax / 254
            elif prec is CommPrecision.FP8:
                wire += 2.0**-4 * x.abs() + amax / 448 * 2.0**-10
            else:
                wire += UNIT_ROUNDOFF[prec] * x.abs() + (
                    2.0**-25 if prec is CommPrecision.FP16 else 0.0)
        bound[:, ch.col0:ch.col0 + ch.cols] += wire
    return bound * 1.001


def weight_tolerance(lay: ExecLayout, t: Any, steps: int) -> float:
    """Relative error allowed for table t's weights, states and later outputs."""
    u = max(UNIT_ROUNDOFF[lay.fwd_precision], UNIT_ROUNDOFF[lay.bwd_precision],
            STORAGE_ROUNDOFF.get(t.data_type.value, 0.0),
            UNIT_ROUNDOFF[CommPrecision.FP32] * (math.ceil(t.pooling) + lay.world + 1))
    return ERROR_GAIN * max(steps, 1) * u


@dataclass
class Int8Slack:
    """What an int8 table's comparisons allow beyond the float tolerance (see above)."""

    weights_abs: float  # |sharded - ref|_F of the weights, added to tol * |ref - initial|
    outputs_abs: float  # |sharded - ref|_F of the outputs of steps >= 1, to tol * |ref|
    states_rel: float  # relative, added to tol
    flips: float  # k, the whole flips of the largest step allowed


def int8_slack(st: Any, tol: float, moved: float, steps: int) -> Int8Slack:
    """The int8 allowances of a table from the reference's Int8Stats `st`."""
    from planner.executor.reference import INT8_CODE_EPS, INT8_DEQUANT

    step = st.step[st.step > 0]
    n = st.step.numel()
    a = tol * moved
    expected = ((steps + 1) * 2 * INT8_CODE_EPS * n
                + steps * 2 * a * float((1.0 / step ** 2).sum().sqrt()))
    # At most one flip per element and quantization: rounding two values on one grid moves
    # them at most one step further apart than they were.
    k = min(2 + 4 * expected, (steps + 1) * n)
    flips = math.sqrt(k) * st.step_max
    deq = (steps + 1) * INT8_DEQUANT * float(st.mag.norm())
    gain = math.sqrt(max(st.bag_max, 1) * max(st.lookups_max, 1))
    grad = st.grad_norm_min if math.isfinite(st.grad_norm_min) else 0.0
    return Int8Slack(
        weights_abs=deq + flips,
        outputs_abs=math.sqrt(max(steps - 1, 0)) * gain * (flips + deq),
        states_rel=ERROR_GAIN * steps * gain * (flips + deq) / grad if grad else math.inf,
        flips=k)


def _compare_reference(rep: ExecutionReport, lay: ExecLayout, opts: RunOptions,
                       rd: Path) -> None:
    import torch

    from planner.executor.reference import run_reference

    ref = run_reference(lay, opts.seed, opts.steps, opts.lr, opts.eps)
    dumps = [torch.load(tensors_file(rd, r)) for r in range(lay.world)]
    tols: dict[str, float] = {}
    int8_tols: dict[str, float] = {}  # int8 tables: "table.check" -> tolerance with slack
    out_err: dict[str, float] = {}  # step 0: largest |error| / its bound
    later_err: dict[str, float] = {}
    w_err: dict[str, float] = {}
    s_err: dict[str, float] = {}
    out_bad, later_bad, w_bad, s_bad = [], [], [], []
    for t in lay.tables:
        b = t.outputs  # rows of the table's outputs per rank
        tol = tols[t.name] = weight_tolerance(lay, t, opts.steps)
        bound = output_bound(lay, t, ref)
        worst, where = 0.0, ""
        diff2 = norm2 = 0.0
        for s in range(opts.steps):
            for r in range(lay.world):
                d = dumps[r][f"out{s}.{t.index}"].double()
                e = ref.outputs[(s, r, t.index)]
                if s == 0:
                    ratio = float(((d - e).abs() / bound[r * b:(r + 1) * b]).max())
                    if ratio > worst:
                        worst, where = ratio, f"rank {r}"
                else:
                    diff2 += float(((d - e) ** 2).sum())
                    norm2 += float((e ** 2).sum())
        out_err[t.name] = worst
        if worst > 1.0:
            out_bad.append(f"{t.name} ({where}: {worst:.3g}x the bound)")
        got_w, got_s = _assemble(t, dumps)
        want = ref.weights[t.index]
        moved = float((want - ref.initial[t.index]).norm()) or 1.0
        tol_out = tol_w = tol_s = tol
        if t.index in ref.int8:
            sl = int8_slack(ref.int8[t.index], tol, moved, opts.steps)
            tol_w = tol + sl.weights_abs / moved
            tol_out = tol + (sl.outputs_abs / math.sqrt(norm2) if norm2 else 0.0)
            tol_s = tol + sl.states_rel
            int8_tols.update({f"{t.name}.weights": tol_w, f"{t.name}.outputs": tol_out,
                              f"{t.name}.states": tol_s, f"{t.name}.flips_allowed": sl.flips})
        later_err[t.name] = math.sqrt(diff2 / norm2) if norm2 else 0.0
        if later_err[t.name] > tol_out:
            later_bad.append(f"{t.name} {later_err[t.name]:.3g}")
        werr = max(float((g.double() - want).norm()) for g in got_w) / moved
        w_err[t.name] = werr
        if not werr <= tol_w:  # NaN (a row no piece wrote) fails too
            w_bad.append(f"{t.name} {werr:.3g}")
        for key, st in got_s.items():
            want_s = ref.states[key]
            if want_s.shape[1] == 0:
                continue
            serr = float((st.double() - want_s).norm()) / (float(want_s.norm()) or 1.0)
            s_err[f"{t.name}@{key[1]}"] = serr
            if not serr <= tol_s:
                s_bad.append(f"{t.name} cols {key[1]}+ {serr:.3g}")
    rep.errors = {"outputs_step0_vs_bound": out_err, "outputs_rel_later_steps": later_err,
                  "weights_rel": w_err, "states_rel": s_err, "tolerance_rel": tols}
    if int8_tols:
        rep.errors["tolerance_rel_int8"] = int8_tols
    span = f"{min(tols.values()):.3g}..{max(tols.values()):.3g}" if tols else "-"
    rep.checks.append(Check(
        "pooled outputs at step 0 vs float64 reference, per element within the precision's "
        "bound", not out_bad, f"over: {out_bad[:5]}" if out_bad else
        f"all tables and ranks (worst {max(out_err.values(), default=0):.3g}x the bound)"))
    rep.checks.append(Check(
        f"pooled outputs of steps 1..{opts.steps - 1} vs reference (relative {span})",
        not later_bad, f"differ: {later_bad}" if later_bad else "all tables"))
    rep.checks.append(Check(
        f"weights after {opts.steps} steps vs reference (relative {span})", not w_bad,
        f"differ: {w_bad}" if w_bad else "all tables"))
    rep.checks.append(Check(
        f"optimizer state after {opts.steps} steps vs reference (relative {span})",
        not s_bad, f"differ: {s_bad}" if s_bad else "all tables"))


def _assemble(t: Any, dumps: list[dict[str, Any]]) -> tuple[list[Any], dict[Any, Any]]:
    """The sharded run's whole table (one per replica for data-parallel) and its states."""
    import torch

    if t.kind is ShardingType.DATA_PARALLEL:
        return [d[f"wdp{t.index}"] for d in dumps], {
            (t.index, 0): dumps[0][f"sdp{t.index}"]}
    w = torch.full((t.rows, t.dim), float("nan"))
    states: dict[Any, Any] = {}
    for p in t.pieces:
        d = dumps[p.rank]
        w[p.row0:p.row0 + p.rows, p.col0:p.col0 + p.cols] = d[f"w{p.key}"]
        key = (t.index, p.col0)
        if key not in states:
            states[key] = torch.full((t.rows, d[f"s{p.key}"].shape[1]), float("nan"))
        states[key][p.row0:p.row0 + p.rows] = d[f"s{p.key}"]
    return [w], states
