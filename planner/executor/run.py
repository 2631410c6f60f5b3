"""`execute`: scale the plan, launch the ranks, compare what they measured with the cost model
and what they computed with the unsharded reference, and say which checks pass."""

import math
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cost_models import ShardingType, UniformAccess, ZipfAccess
from cost_models.types import CommPrecision
from planner.executor.job import RunOptions, tensors_file, write_job
from planner.executor.launch import launch
from planner.executor.layout import ExecLayout, check_wire_widths, exec_layout
from planner.executor.predict import predict
from planner.executor.scale import scaled_plan
from planner.plan_model import Plan

# Tolerances when communication is below fp32. Outputs: largest |sharded - reference| at step
# 0 (the forward rounding alone) relative to the table's largest |reference| value. One
# rounding of a vector costs at most 2^-11 (fp16) or 2^-8 (bf16) of each element, half a step,
# amax/254 (int8), or 2^-4 (fp8 e4m3) of the row's largest element; a row-split output adds
# up to W such partial sums. Weights: |sharded - reference| / |reference - initial| (Frobenius
# norms) after all steps: the error relative to how far training moved the table. A norm,
# not a maximum, because Adagrad and Adam normalise each element's update, so the rounding of
# a near-zero gradient element can flip its whole lr-sized step while the rest barely move.
OUTPUT_TOLERANCE = {CommPrecision.FP16: 2e-3, CommPrecision.BF16: 1.6e-2,
                    CommPrecision.INT8: 1.6e-2, CommPrecision.FP8: 1.3e-1}
WEIGHT_TOLERANCE = {CommPrecision.FP16: 2e-2, CommPrecision.BF16: 1e-1,
                    CommPrecision.INT8: 1e-1, CommPrecision.FP8: 5e-1}
HIT_RATE_POINTS = 0.02
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
    opts = RunOptions(**{**asdict(opts), "scale_rows": scale_rows,
                         "keep_outputs": opts.keep_outputs and reference})
    lay = exec_layout(run)
    check_wire_widths(lay)
    write_job(run_dir, run, opts)
    return lay.world


def collect(run_dir: Path) -> ExecutionReport:
    """The report of a finished run: what every rank wrote to run_dir, against the model."""
    import json

    from planner.executor.job import read_job, result_file

    run, opts = read_job(run_dir)
    lay = exec_layout(run)
    measured = [json.loads(result_file(run_dir, r).read_text()) for r in range(lay.world)]
    rep = ExecutionReport(run.plan_hash, lay.world, lay.batch, opts.steps, opts.scale_rows,
                          opts.device)
    _compare_model(rep, run, lay, measured)
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
    for m, p in zip(measured, ranks_pred, strict=True):
        col = m["collectives"]
        get = lambda name, side, c=col: c.get(name, {}).get(side, 0.0)  # noqa: E731
        meas = {"input_lengths": get("input_lengths", "recv"),
                "input_ids": get("input_ids", "recv"), "output_fwd": get("output_fwd", "sent"),
                "output_bwd": get("output_bwd", "recv"), "allreduce": get("allreduce", "sent")}
        if not _close(meas["input_lengths"], p.bytes["input_lengths"]):
            len_bad.append(m["rank"])
        if not _close(meas["output_fwd"], p.bytes["output_fwd"]):
            fwd_bad.append(m["rank"])
        if not _close(meas["output_bwd"], p.bytes["output_bwd"]):
            bwd_bad.append(m["rank"])
        if not _close(meas["allreduce"], p.bytes["allreduce"]):
            ar_rank_bad.append(m["rank"])
        ar_meas += meas["allreduce"]
        ar_pred += p.bytes["allreduce"]
        mem = {k: m["memory"][k] for k in ("hbm", "ddr", "ssd")}
        if mem != p.memory:
            mem_bad.append(f"rank {m['rank']}: {mem} vs {p.memory}")
        rep.ranks.append({
            "rank": m["rank"], "device": m["device"],
            "bytes": {k: {"measured": meas[k], "predicted": p.bytes[k]} for k in meas},
            "collectives": col,  # every collective's bytes sent and received, per step
            "seconds_measured": m["seconds"], "seconds_predicted": p.seconds,
            "memory": {k: {"measured": mem[k], "predicted": p.memory[k]} for k in mem},
            "executor_extra_ddr": m["memory"]["extra_ddr"],
        })
    rep.checks.append(Check("bytes: input all-to-all, bag lengths, per rank", not len_bad,
                            f"differ on ranks {len_bad}" if len_bad else "equal on every rank"))
    rep.checks.append(Check("bytes: output all-to-all forward, per rank", not fwd_bad,
                            f"differ on ranks {fwd_bad}" if fwd_bad else "equal on every rank"))
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
            hits.append(f"{pp.table}[{pp.key}] {measured_hit:.4f} vs {pp.hit_rate:.4f}")
            if isinstance(t.access, ZipfAccess) and abs(measured_hit - pp.hit_rate) > \
                    HIT_RATE_POINTS:
                hit_bad.append(pp.key)
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
    rep.checks.append(Check(f"cache hit rate within {HIT_RATE_POINTS * 100:g} points (zipf)",
                            not hit_bad, "; ".join(hits) or "no cached pieces"))


def _compare_reference(rep: ExecutionReport, lay: ExecLayout, opts: RunOptions,
                       rd: Path) -> None:
    import torch

    from planner.executor.reference import run_reference

    ref = run_reference(lay, opts.seed, opts.steps, opts.lr)
    dumps = [torch.load(tensors_file(rd, r)) for r in range(lay.world)]
    fwd, bwd = lay.fwd_precision, lay.bwd_precision
    exact_out = fwd is CommPrecision.FP32
    exact_w = exact_out and bwd is CommPrecision.FP32
    out_err: dict[str, float] = {}
    w_err: dict[str, float] = {}
    out_bad, w_bad = [], []
    all_err: dict[str, float] = {}
    for t in lay.tables:
        first = worst = 0.0
        scale = max(float(v.abs().max()) for (_, _, ti), v in ref.outputs.items()
                    if ti == t.index) or 1.0
        for s in range(opts.steps):
            for r in range(lay.world):
                d = dumps[r][f"out{s}.{t.index}"]
                e = ref.outputs[(s, r, t.index)]
                if exact_out and not torch.equal(d, e):
                    out_bad.append(f"{t.name} step {s} rank {r}")
                err = float((d - e).abs().max())
                worst = max(worst, err)
                first = max(first, err) if s == 0 else first
        # Step 0 shows the forward rounding alone; later steps add the backward's through
        # the weights, which the weight check bounds.
        out_err[t.name] = first / scale
        all_err[t.name] = worst / scale
        if not exact_out and first / scale > OUTPUT_TOLERANCE[fwd]:
            out_bad.append(f"{t.name} {first / scale:.3g}")
        got_w, got_s = _assemble(t, dumps)
        delta = ref.weights[t.index] - _initial(t, opts.seed)
        moved = float(delta.norm()) or 1.0
        werr = max(float((g - ref.weights[t.index]).norm()) for g in got_w)
        w_err[t.name] = werr / moved
        same = all(torch.equal(g, ref.weights[t.index]) for g in got_w) and all(
            torch.equal(v, ref.states[k]) for k, v in got_s.items())
        if exact_w and not same:
            w_bad.append(t.name)
        tol = max(WEIGHT_TOLERANCE.get(bwd, 0.0), WEIGHT_TOLERANCE.get(fwd, 0.0))
        if not exact_w and werr / moved > tol:
            w_bad.append(f"{t.name} {werr / moved:.3g}")
    rep.errors = {"outputs_rel_step0": out_err, "outputs_rel_all_steps": all_err,
                  "weights_rel": w_err}
    how = "bit-identical" if exact_out else f"step 0 within {OUTPUT_TOLERANCE[fwd]:g}"
    rep.checks.append(Check(f"pooled outputs vs unsharded reference ({how})", not out_bad,
                            f"differ: {out_bad[:5]}" if out_bad else "all tables, steps, ranks"))
    how_w = "bit-identical" if exact_w else "within tolerance"
    rep.checks.append(Check(f"weights after {opts.steps} steps vs reference ({how_w})",
                            not w_bad, f"differ: {w_bad}" if w_bad else "all tables"))


def _initial(t: Any, seed: int) -> Any:
    import torch

    from planner.executor import synthetic

    return torch.from_numpy(synthetic.init_weights(seed, t.index, t.dim, 0, t.rows, 0, t.dim))


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
