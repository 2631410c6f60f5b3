"""Kernel timings from the executor itself: small table-wise plans run by `planner execute`.

A piece's lookup and backward were first timed by microbenchmarks that called the executor's
kernels (bench.py, until 1501bfd). However close those came to a rank's step (pinned ranks,
a process group, all-to-alls between the phases), the executor's ranks ran their lookups
about a third slower and their backwards 20-35% faster than the fit said
(benchmarks/fidelity, e44ea03; re-scored in benchmarks/results/fidelity_rescore.md), for
reasons not found. So the kernels are now timed where the plans run: each calibration plan
gives every rank a few table-wise pieces of one shape (rows, dim, pooling, optimizer), or
ten or more tables of many sizes as a real plan's rank holds (MIXED), the executor runs it
(its warm-up, then timed steps: compute in the rank thread's CPU time, each phase's median
over the steps and over `reps` executions, as `planner execute --compare` measures), and
each rank's lookup and backward phase becomes one point: the sum, over its pieces, of the
cost model's own terms (traffic.piece_traffic: bytes, ids, distinct rows), beside the
measured seconds. The fit is then the model's form over the executor's own phases. The
shapes span what scaled-down fixtures hold (1 to 200,000 rows, dims 16 to 128, bags of 1 to
80 ids, every optimizer); none is a plan benchmarks/fidelity scores.

The same executions time the all-to-all's call where the plans make it (a2a_points): two
calls a phase, each after an untimed barrier, with the step's packing between them. There a
call cost 0.25-0.30 ms of its threads' CPU time on this 2-core machine, against 0.20-0.24
ms for the same small message timed alone after a lookup (bench.py's microbenchmark), and
the fidelity plans' all-to-alls ran 16-21% over the microbenchmark's fit (9c318a0's run). The
microbenchmarks still give the bandwidth and the per-peer term (sizes to 1 MB; the peer term
only where they ran two or more world sizes); the call's latency is fitted on these phases
with those held (profile.fit_step_alltoall), so it absorbs whatever the held terms miss.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cost_models.latency import INPUT_A2A_CALLS, OUTPUT_A2A_CALLS
from cost_models.traffic import piece_traffic
from cost_models.types import Optimizer
from planner.plan_model import Plan
from planner.presets import preset_dict

if TYPE_CHECKING:
    from planner.executor.run import ExecutionReport

# (pieces on the rank, rows, dim, pooling, optimizer): a rank of some calibration plan holds
# that many tables of one shape, one piece each, table-wise in HBM (RANK_SETS).
SHAPES: tuple[tuple[int, int, int, int, Optimizer], ...] = (
    (4, 100, 16, 1, Optimizer.ROWWISE_ADAGRAD),
    (4, 4_000, 32, 20, Optimizer.ROWWISE_ADAGRAD),
    (4, 10_000, 16, 1, Optimizer.SGD),
    (3, 8_000, 128, 10, Optimizer.ADAGRAD),
    (4, 4_000, 32, 80, Optimizer.ROWWISE_ADAGRAD),
    (4, 1_000, 64, 4, Optimizer.ADAM),
    (8, 1_000, 16, 1, Optimizer.ROWWISE_ADAGRAD),
    (2, 50_000, 64, 8, Optimizer.SGD),
    (4, 20_000, 32, 20, Optimizer.ADAM),
    (6, 200, 16, 2, Optimizer.ROWWISE_ADAGRAD),
    (3, 8_000, 128, 30, Optimizer.ROWWISE_ADAGRAD),
    (4, 4_000, 16, 40, Optimizer.ADAGRAD),
    (1, 200_000, 64, 8, Optimizer.ROWWISE_ADAGRAD),
    (6, 30, 32, 1, Optimizer.SGD),
    (2, 2_000, 128, 4, Optimizer.ROWWISE_ADAGRAD),
    (5, 500, 64, 16, Optimizer.ADAM),
)
# Ranks as real plans' ranks are: ten or more tables of many sizes, most of them small
# (a feature's vocabulary runs from a handful of ids to millions). With the one-shape ranks
# alone the fit priced the fidelity plans' lookups 25-49% short on ranks of 13 such tables
# (477d27a's run); these carry that into the fit. (rows, dim, pooling, optimizer) per table.
_R = Optimizer.ROWWISE_ADAGRAD
MIXED: tuple[tuple[tuple[int, int, int, Optimizer], ...], ...] = (
    tuple((rows, 16, 1, _R) for rows in (1, 2, 6, 15, 40, 100, 250, 650, 1_600, 4_000,
                                         10_000, 20_000)),
    tuple((rows, 128, 1 + k % 10, _R) for k, rows in enumerate(
        (2, 5, 20, 60, 200, 700, 2_500, 9_000, 3, 30, 400, 6_000))),
    tuple((rows, 64, 4, Optimizer.ADAM if k % 2 else Optimizer.SGD) for k, rows in
          enumerate((10, 33, 100, 330, 1_000, 3_300, 10_000, 20_000, 35_000, 50_000))),
    tuple((rows, 32, (1, 5, 20)[k % 3], _R if k % 2 else Optimizer.ADAGRAD) for k, rows in
          enumerate((1, 3_000, 4, 1_000, 9, 300, 25, 100, 60, 30, 150, 10, 400, 3, 800, 2,
                     1_500, 5, 2_000, 7))),
)
# What rank r of calibration plan i holds: RANK_SETS[(i * ranks + r) % len(RANK_SETS)].
RANK_SETS: tuple[tuple[tuple[int, int, int, Optimizer], ...], ...] = (
    *(((rows, dim, pooling, opt),) * count for count, rows, dim, pooling, opt in SHAPES),
    *MIXED)
# Samples per rank of calibration plan i: BATCHES[i % len(BATCHES)] (times batch_scale).
BATCHES = (128, 128, 32, 256, 64, 48, 96, 160)
# On a GPU the batches above are all launch: a 256-sample lookup of 80 ids of 32 floats reads
# ~2.6 MB, under a microsecond of HBM. 64 times more samples (2,048 to 16,384 per rank, a
# real per-GPU batch's order) puts the bytes in the measured phase beside the launches.
CUDA_BATCH_SCALE = 64
# Steps of each execution: measured (memory probe on, not timed), then timed.
STEPS, TIMED_STEPS, WARMUP_STEPS = 2, 9, 2


def plans_needed(ranks: int, plans: int | None = None) -> int:
    """Calibration plans to run: `plans`, or (None) as many as give every rank set to some
    rank once."""
    return -(-len(RANK_SETS) // max(1, ranks)) if plans is None else plans


def calibration_request(i: int, ranks: int, hardware: dict[str, Any], batch_scale: int = 1,
                        pipelined: bool = False
                        ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(request, table plans) of calibration plan i on one host of `ranks` GPUs of
    `hardware` (a hardware spec dict): rank r's tables are RANK_SETS[(i * ranks + r) %
    len(RANK_SETS)], each rank's batch BATCHES[i % len(BATCHES)] * batch_scale;
    `pipelined`: the step pipelined (bench_overlap)."""
    tables, layout = [], []
    for r in range(ranks):
        for j, (rows, dim, pooling, opt) in enumerate(
                RANK_SETS[(i * ranks + r) % len(RANK_SETS)]):
            name = f"r{r}_{j}"
            tables.append({"name": name, "num_embeddings": rows, "embedding_dim": dim,
                           "pooling_factor": float(pooling),
                           "access_frequency": {"kind": "uniform"}, "data_type": "fp32",
                           "optimizer": str(opt)})
            layout.append({"name": name, "sharding_type": "table_wise", "tier": "hbm",
                           "pieces": [{"rank": r, "host": 0, "row_offset": 0,
                                       "row_count": rows, "col_offset": 0,
                                       "col_count": dim}]})
    request = {"model": {"name": f"calibration_{i}", "tables": tables,
                         "batch_size_per_gpu": BATCHES[i % len(BATCHES)] * batch_scale,
                         "pipelined": pipelined},
               "hardware": {**hardware, "hosts": 1, "gpus_per_host": ranks},
               "options": {"solver": "greedy"}}
    return request, layout


def calibration_plan(i: int, ranks: int, hardware: dict[str, Any], batch_scale: int = 1,
                     pipelined: bool = False) -> Plan:
    """Calibration plan i (calibration_request), priced by the model."""
    from planner.plan_model import PlanLayout
    from planner.planning import evaluate, resolve

    request, layout = calibration_request(i, ranks, hardware, batch_scale, pipelined)
    return evaluate(PlanLayout.model_validate(
        {"schema_version": "1", "request": resolve(request).model_dump(mode="json"),
         "tables": layout}))


def _pieces_of(plan: Plan) -> list[list[dict[str, float]]]:
    """Per rank: each of its pieces' rows, dim, optimizer and the model's forward and
    backward terms (traffic.piece_traffic: hbm bytes, ids, distinct rows updated)."""
    from planner.planning import resolve
    from planner.problem import build_problem

    problem = build_problem(resolve(plan.request))
    out: list[list[dict[str, Any]]] = [[] for _ in range(problem.hw.world_size)]
    for t, info in zip(plan.tables, problem.tables, strict=True):
        for p in t.pieces:
            tr = piece_traffic(info.geom, t.sharding_type, t.tier, 1.0, p.row_count,
                               p.col_count, problem.hw, problem.model)
            out[p.rank].append({"rows": p.row_count, "dim": p.col_count,
                                "optimizer": str(info.geom.optimizer),
                                "fwd_bytes": tr.hbm_fwd, "bwd_bytes": tr.hbm_bwd,
                                "lookups": tr.lookups, "unique": tr.updated_rows})
    return out


def rank_points(plan: Plan, measured: list[dict[str, float]]
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(lookup points, backward points) of one calibration plan: per rank, its `measured`
    lookup and backward seconds beside the model's terms summed over its pieces
    (`launches` pieces; `parts` each piece's shape and bytes, for the device-cache split)."""
    lookup, backward = [], []
    for rank, (seconds, parts) in enumerate(zip(measured, _pieces_of(plan), strict=True)):
        shape = {"rank": rank, "launches": float(len(parts)),
                 "lookups": sum(x["lookups"] for x in parts)}
        lookup.append({**shape, "bytes": sum(x["fwd_bytes"] for x in parts),
                       "seconds": seconds["lookup"],
                       "parts": [{"rows": x["rows"], "dim": x["dim"], "bytes": x["fwd_bytes"]}
                                 for x in parts]})
        backward.append({**shape, "bytes": sum(x["bwd_bytes"] for x in parts),
                         "unique": sum(x["unique"] for x in parts),
                         "seconds": seconds["backward"],
                         "parts": [{"rows": x["rows"], "dim": x["dim"],
                                    "optimizer": x["optimizer"], "bytes": x["bwd_bytes"]}
                                   for x in parts]})
    return lookup, backward


def a2a_points(plan: Plan, measured: list[dict[str, float]]) -> list[dict[str, Any]]:
    """Per rank and all-to-all phase of one calibration plan (one host): its `measured`
    seconds beside the model's terms for that phase as `planner execute --compare` predicts
    it (compare.predicted_phases): the calls (cost_models.latency: the input's two; the
    output's four split between its directions by their bytes, as compare splits the output
    term, two each way where the bytes are equal, as in these fp32 plans) and the bytes
    (executor.predict's counts for the rank, the pieces' intra-host traffic the model
    prices over the link): t = calls x (call + peer x (W - 1)) + bytes x inv_link."""
    from planner.executor.compare import forward_share
    from planner.executor.predict import predict

    ranks, _ = predict(plan)
    world = len(ranks)
    out = []
    for rp, seconds in zip(ranks, measured, strict=True):
        b = rp.bytes
        fwd = forward_share(b["output_fwd"], b["output_bwd"])
        for phase, calls, nbytes in (
                ("input_a2a", INPUT_A2A_CALLS, b["input_lengths"] + b["input_ids"]),
                ("output_a2a_fwd", OUTPUT_A2A_CALLS * fwd, b["output_fwd"]),
                ("output_a2a_bwd", OUTPUT_A2A_CALLS * (1 - fwd), b["output_bwd"])):
            out.append({"rank": rp.rank, "phase": phase, "world": float(world),
                        "calls": float(calls), "bytes": float(nbytes),
                        "seconds": seconds[phase]})
    return out


@dataclass(frozen=True)
class ExecutedPoints:
    """What the calibration plans' executions give the fits: per rank, its lookup and
    backward phases (rank_points) and its all-to-all phases (a2a_points)."""

    lookup: list[dict[str, Any]]
    backward: list[dict[str, Any]]
    alltoall: list[dict[str, Any]]


def step_clock(device: str) -> str:
    """The clock a calibration plan's all-to-alls are read in: on CPU the CPU time of the
    threads doing them (their exchange without the wait for a peer's thread to be scheduled,
    which a shared machine adds and a dedicated one does not; benchmarks/fidelity scores that
    clock), on a GPU wall time after a synchronize (NCCL's work is the device's)."""
    return "cpu" if device == "cpu" else "wall"


def bench_executed(ranks: int, device: str, preset: str, reps: int,
                   tick: Callable[[], None], plans: int | None = None) -> ExecutedPoints:
    """One point per rank of each calibration plan for its lookup and backward (its pieces
    summed: `launches` pieces; `parts` each piece's shape and bytes, for the device-cache
    split) and one per rank and all-to-all phase, its seconds the executor's measured phase
    (collectives in step_clock). `plans`: how many (default: every shape once)."""
    lookup, backward, alltoall = [], [], []
    hardware = preset_dict(preset)
    scale = CUDA_BATCH_SCALE if device == "cuda" else 1
    planned = [calibration_plan(i, ranks, hardware, scale)
               for i in range(plans_needed(ranks, plans))]
    runs = _in_rounds(planned, device, reps, tick)
    for i, p in enumerate(planned):
        measured = [{ph: v["measured"] for ph, v in row["phases"].items()}
                    for row in _measured(p, runs[i], device, step_clock(device))]
        lk, bw = rank_points(p, measured)
        lookup += [{"plan": i, **pt} for pt in lk]
        backward += [{"plan": i, **pt} for pt in bw]
        if ranks >= 2:
            alltoall += [{"plan": i, **pt} for pt in a2a_points(p, measured)]
    return ExecutedPoints(lookup, backward, alltoall)


def _in_rounds(planned: list[Plan], device: str, reps: int, tick: Callable[[], None]
               ) -> "list[list[ExecutionReport]]":
    """Each plan executed `reps` times (its ExecutionReports), in rounds, every plan once a
    round: a slow spell of a shared machine (minutes long) falls on every plan alike, not on
    one plan's every execution. A rank that fails raises here (launch.py), as `planner
    execute` reports it. `tick` after each execution."""
    from planner.executor.job import RunOptions
    from planner.executor.run import execute

    opts = RunOptions(steps=STEPS, timed_steps=TIMED_STEPS, warmup_steps=WARMUP_STEPS,
                      device=device, keep_outputs=False, collective_timeout_s=120)
    runs: list[list[ExecutionReport]] = [[] for _ in planned]
    for _ in range(reps):
        for i, p in enumerate(planned):
            runs[i].append(execute(p, opts, reference=False, timeout_s=600))
            tick()
    return runs


def _measured(plan: Plan, runs: "list[ExecutionReport]", device: str, clock: str = "wall"
              ) -> list[dict[str, Any]]:
    """Per rank (in rank order), `planner execute --compare`'s row of `plan` over its
    executions `runs` (each phase the median over them; collectives in `clock`)."""
    from planner.executor.compare import compare

    cmp = compare(plan, runs[0].ranks, device, collective_clock=clock,
                  repeats=[r.ranks for r in runs[1:]])
    return sorted(cmp["ranks"], key=lambda row: row["rank"])


def bench_overlap(ranks: int, device: str, preset: str, reps: int, tick: Callable[[], None],
                  plans: int) -> list[dict[str, Any]]:
    """Points for pipeline_overlap: the first `plans` calibration plans, each run in turn
    and pipelined (the executor's input lane: the next batch's input all-to-all beside the
    step), `reps` times each in rounds. Per rank: its sequential step (every phase), its
    pipelined step (as compare measures it: the phases but the lane's input all-to-all,
    plus the wait for the lane) and its sequential input all-to-all; the share of that
    input the pipelined step saved is (sequential - pipelined) / input."""
    hardware = preset_dict(preset)
    scale = CUDA_BATCH_SCALE if device == "cuda" else 1
    # Each plan in turn, then pipelined, in every round.
    planned = [calibration_plan(i // 2, ranks, hardware, scale, pipelined=bool(i % 2))
               for i in range(2 * plans)]
    runs = _in_rounds(planned, device, reps, tick)
    points = []
    for i in range(plans):
        seq, pipe = 2 * i, 2 * i + 1
        for s_row, p_row in zip(_measured(planned[seq], runs[seq], device),
                                _measured(planned[pipe], runs[pipe], device), strict=True):
            points.append({"plan": i, "rank": s_row["rank"],
                           "sequential_s": s_row["measured_total"],
                           "pipelined_s": p_row["measured_total"],
                           "input_s": s_row["phases"]["input_a2a"]["measured"]})
    return points
