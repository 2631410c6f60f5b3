"""Microbenchmarks on this machine through the executor's own code paths.

- lookups and backward: not here. They are timed in the executor itself, running small
  table-wise plans (executed.py): a rank's phase there is what the fit reads.
- host tiers: a ddr, hbm_cache or ssd piece's steps through the executor's stores
  (`make_store`: DenseStore in host memory, CachedStore), with the rank's spans: a ddr or
  ssd piece's pool and update inside `cache_miss`, a cache's misses, write-backs and
  re-admission (`end_step`) inside it by the store's own `host_span`, timed by the rank's
  `comm.Timer` as the rank times its `cache_miss` phase; the model's bytes are
  cost_models.traffic.piece_traffic's `host` and `ssd` for the same shape.
- collectives: `Comm.alltoall` and `Comm.ring_allreduce` over gloo (CPU) or NCCL (CUDA) on
  loopback ranks, against message size and world size.

Compute is timed as the ranks time their timed steps (comm.Timer, the memory probe stopped):
on CPU the thread's own CPU time, on CUDA wall time after a device synchronize. Each figure
is the median of `reps` timed runs after one untimed run; a collective's time is the mean over
ranks of each rank's lower quartile (compare.collective_figure, as `planner execute
--compare` reads a rank's collectives).
"""

import os
import queue
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from cost_models.traffic import PieceTraffic
from cost_models.types import CommPrecision, Optimizer, Tier

if TYPE_CHECKING:
    from planner.executor.comm import Comm


@dataclass(frozen=True)
class BenchConfig:
    a2a_bytes: tuple[int, ...] = (64, 16_384, 262_144, 1_048_576)  # per peer
    allreduce_rows: tuple[int, ...] = (64, 4_096, 65_536)  # of 16 fp32 columns
    world_sizes: tuple[int, ...] = (2, 3)
    # Host tiers (ddr, hbm_cache, ssd pieces): shapes and cache ratios of the cached tiers.
    host_tiers: tuple[Tier, ...] = (Tier.DDR, Tier.HBM_CACHE, Tier.SSD)
    host_rows: tuple[int, ...] = (1_000, 10_000, 200_000)
    host_dims: tuple[int, ...] = (16, 64)
    host_poolings: tuple[int, ...] = (1, 8)
    host_batches: tuple[int, ...] = (256, 2048)
    host_cache_ratios: tuple[float, ...] = (0.05, 0.3)
    reps: int = 9
    # Collectives are cheap and their latency noisy (a peer's thread wakes a scheduler tick
    # late now and then): more repeats.
    collective_reps: int = 25
    seed: int = 0
    # Ranks the host-tier microbenchmarks and the executed calibration plans run in (one
    # per core on CPU, one per GPU), each pinned and in a process group as the executor's
    # ranks (1: the host tiers in the calling process).
    compute_ranks: int = 1
    # The executed calibration plans (executed.py): how many (None: every shape once) and
    # how many executions of each, in rounds (each phase the median over them).
    executed_plans: int | None = None
    executed_reps: int = 3
    # Calibration plans run both in turn and pipelined for pipeline_overlap (needs two
    # compute ranks: the input all-to-all between them).
    overlap_plans: int = 4

    @staticmethod
    def smoke() -> "BenchConfig":
        """Seconds, for tests: few shapes, one world size (its constants are rough)."""
        return BenchConfig(a2a_bytes=(64, 262_144), allreduce_rows=(64, 16_384),
                           world_sizes=(2,), host_rows=(10_000,), host_dims=(16,),
                           host_batches=(256,), host_cache_ratios=(0.1,), reps=2,
                           collective_reps=5, executed_plans=4, executed_reps=1,
                           overlap_plans=1)

    @staticmethod
    def long(world: int) -> "BenchConfig":
        """A longer run: more sizes and repeats (minutes)."""
        return BenchConfig(a2a_bytes=(64, 4_096, 65_536, 262_144, 1_048_576, 4_194_304),
                           allreduce_rows=(64, 1_024, 16_384, 131_072),
                           world_sizes=tuple(range(2, max(world, 2) + 1)), reps=9,
                           executed_reps=5)


@dataclass
class Measurements:
    """Every timed point: its features (what the model multiplies) and seconds."""

    lookup: list[dict[str, float]] = field(default_factory=list)
    backward: list[dict[str, float]] = field(default_factory=list)
    alltoall: list[dict[str, float]] = field(default_factory=list)
    allreduce: list[dict[str, float]] = field(default_factory=list)
    host: list[dict[str, Any]] = field(default_factory=list)
    # Per rank of a calibration plan run in turn and pipelined (executed.bench_overlap).
    overlap: list[dict[str, float]] = field(default_factory=list)
    # Per rank and all-to-all phase of the calibration plans (executed.a2a_points).
    step_alltoall: list[dict[str, float]] = field(default_factory=list)


# An all-reduce bucket of 1 table, and the same rows as 8 tables: a call's cost per table.
ALLREDUCE_TABLES = (1, 8)


def _nothing() -> None:
    return None


def _host_traffic(rows: int, dim: int, pooling: int, batch: int, tier: Tier, ratio: float,
                  opt: Optimizer) -> PieceTraffic:
    """What the cost model counts for a table-wise piece of this shape on one GPU
    (cost_models.traffic.piece_traffic's PieceTraffic, uniform ids as the benchmark draws
    them)."""
    from cost_models import (
        CostConstants,
        DataType,
        HardwareProfile,
        ModelGeom,
        ShardingType,
        TableGeom,
        UniformAccess,
        piece_traffic,
    )

    hw = HardwareProfile(hosts=1, gpus_per_host=1, hbm_bytes=1, hbm_reserved_bytes=0,
                         hbm_bw=1.0, ddr_bytes=1, ddr_reserved_bytes=0, ddr_bw=1.0,
                         ssd_bytes=1, ssd_bw=1.0, nvlink_bw=1.0, nic_bw=1.0, pcie_bw=1.0,
                         constants=CostConstants())
    geom = TableGeom(rows=rows, dim=dim, pooling=float(pooling), access=UniformAccess(),
                     data_type=DataType.FP32, optimizer=opt)
    model = ModelGeom(batch_per_gpu=batch, fwd_precision=CommPrecision.FP32,
                      bwd_precision=CommPrecision.FP32, pipelined=False)
    return piece_traffic(geom, ShardingType.TABLE_WISE, tier, ratio, rows, dim, hw, model)


def bench_host(cfg: BenchConfig, device: torch.device, out: Measurements,
               tick: Callable[[], None], work_dir: Path,
               between: Callable[[], None] = _nothing) -> None:
    """A ddr, hbm_cache or ssd piece's steps through the executor's stores, its host-memory
    work timed as rank.py times its `cache_miss` phase (comm.Timer, the same spans): the
    lookup (bag offsets, then the store's pool: a ddr or ssd piece's wholly on the host, an
    hbm_cache's misses), the backward (row gradients, then the store's update: a ddr or ssd
    piece's wholly, an hbm_cache's misses and its state in host memory) and the cache's
    re-admission (end_step). New uniform ids every step, as the ranks draw them. A cache
    starts full, as in a rank's measured steps (warmup.py): an untimed step looks up as many
    distinct rows as it has slots (uniform ids: any rows are the steady state), then `warm`
    untimed steps. A cached piece's lookup phase (its probe and the pool of its hits, the
    misses' host work taken out) is recorded too: the kernels fit prices its probe per id.
    `between`: where a rank's step has its all-to-alls, before each step's lookup and
    before its backward (_host_rank: the rank's collectives)."""
    from contextlib import AbstractContextManager, nullcontext

    from planner.executor import kernels
    from planner.executor.comm import Timer
    from planner.executor.store import CachedStore, make_store

    gen = torch.Generator().manual_seed(cfg.seed + 1)
    opt = Optimizer.ROWWISE_ADAGRAD  # every bundled fixture's optimizer
    cfg_o = kernels.OptimConfig()
    warm = 4
    k = 0
    for tier in cfg.host_tiers:
        ratios = cfg.host_cache_ratios if tier in (Tier.HBM_CACHE, Tier.SSD) else (0.0,)
        for rows in cfg.host_rows:
            for dim in cfg.host_dims:
                w0 = torch.randn(rows, dim, generator=gen)
                s0 = torch.zeros(rows, kernels.state_cols(opt, dim))
                for ratio in ratios:
                    for pooling in cfg.host_poolings:
                        for batch in cfg.host_batches:
                            k += 1
                            store = make_store(w0.clone(), s0.clone(), tier, ratio, device,
                                               "lfu", work_dir / f"host{k}")
                            seconds: dict[str, float] = defaultdict(float)
                            timer = Timer(device, seconds)
                            store.host_span = lambda timer=timer: timer("cache_miss")
                            n = batch * pooling
                            lengths = torch.full((batch,), pooling, dtype=torch.int64
                                                 ).to(device)
                            grad = torch.randn(batch, dim, generator=gen).to(device)

                            def on_host(timer: Timer = timer, tier: Tier = tier
                                        ) -> AbstractContextManager[None]:
                                # rank.py _on_host: a ddr or ssd piece's row traffic.
                                return (timer("cache_miss") if tier in (Tier.DDR, Tier.SSD)
                                        else nullcontext())

                            if isinstance(store, CachedStore):
                                fill = torch.randperm(rows, generator=gen)[:store.slots]
                                store.pool(fill.to(device), torch.arange(
                                    fill.numel(), dtype=torch.int64).to(device))
                                store.end_step()
                            hits = looked = 0
                            for step in range(warm + cfg.reps):
                                if step == warm:
                                    store.hits = store.lookups = 0
                                    timer.reset()
                                ids = torch.randint(0, rows, (n,), generator=gen).to(device)
                                timer.new_step()
                                between()
                                with timer("lookup"):
                                    offsets = kernels.bag_offsets(lengths)
                                    with on_host():
                                        store.pool(ids, offsets)
                                between()
                                with timer("backward"):
                                    uniq, g = kernels.row_grads_bags(ids, offsets, grad)
                                    with on_host():
                                        store.update(uniq, lambda w_, s_, g=g, st=step:
                                                     kernels.apply_optimizer(
                                                         opt, cfg_o, w_, s_, g, st + 1))
                                    with (store.host_span() if isinstance(store, CachedStore)
                                          else nullcontext()):
                                        store.end_step()
                            hits, looked = store.hits, store.lookups
                            t = statistics.median(st["cache_miss"].cpu for st in timer.steps)
                            tr = _host_traffic(rows, dim, pooling, batch, tier, ratio, opt)
                            out.host.append({
                                "tier": str(tier), "rows": rows, "dim": dim,
                                "pooling": pooling, "batch": batch, "cache_ratio": ratio,
                                "optimizer": str(opt), "host_bytes": tr.host,
                                "ssd_bytes": tr.ssd, "cache_slots": tr.cache_slots,
                                "lookups": tr.lookups, "hbm_fwd_bytes": tr.hbm_fwd,
                                "hit_rate": hits / looked if looked else None,
                                "seconds": t,
                                "lookup_seconds": statistics.median(
                                    st["lookup"].cpu for st in timer.steps)})
                            del store
                            tick()


def _rank_start(rank: int, world: int, init_file: str, device_type: str) -> torch.device:
    """A benchmark rank started as worker.py starts an executor rank: one thread,
    deterministic algorithms, pinned to a core of its own before the process group exists
    (gloo's threads with it); returns its device."""
    import torch.distributed as dist

    from planner.executor.comm import pin_rank

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if device_type == "cpu":
        pin_rank(rank, world)
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo",
                            init_method=f"file://{init_file}", rank=rank, world_size=world)
    return torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")


def _comm(rank: int, world: int, init_file: str, device: torch.device) -> "Comm":
    """The rank's Comm, as a rank's timed steps have it (no settling)."""
    from planner.executor.comm import Comm, Heartbeat

    comm = Comm(rank, world, device, Heartbeat(Path(init_file).parent / f"heartbeat{rank}.txt"))
    comm.settle = False  # as in the ranks' timed steps
    return comm


# Bytes per peer of each all-to-all a compute rank runs where a rank's step has its
# all-to-alls (a scaled-down plan's ids or pooled vectors: tens of kB).
STEP_A2A_BYTES = 65_536


def _host_rank(rank: int, world: int, init_file: str, device_type: str,
               cfg: BenchConfig, q: Any) -> None:
    """One rank of the host-tier microbenchmarks: bench_host with the rank's all-to-alls
    between its lookups and backwards, as an executor rank runs its pieces (alone in a
    process, a lookup ran 1.7-2.5x faster than beside a gloo process group's all-to-alls
    on this 2-core machine, measured)."""
    import torch.distributed as dist

    from planner.executor.comm import Timer

    device = _rank_start(rank, world, init_file, device_type)
    try:
        comm = _comm(rank, world, init_file, device)
        # An untimed barrier before each all-to-all, as in a rank's timed steps; nothing
        # recorded (the timer has no step).
        comm.timer = Timer(device, defaultdict(float))
        send = [None if d == rank else torch.zeros(STEP_A2A_BYTES, dtype=torch.uint8)
                for d in range(world)]

        def between() -> None:
            comm.alltoall("step", send, [STEP_A2A_BYTES] * world)

        def tick() -> None:
            if rank == 0:
                q.put(("tick",))

        m = Measurements()
        mine = replace(cfg, seed=cfg.seed + 1009 * rank)  # each rank its own ids
        with tempfile.TemporaryDirectory() as tmp:
            bench_host(mine, device, m, tick, Path(tmp), between)
        q.put(("done", rank, m))
    finally:
        dist.destroy_process_group()


def _mean_points(per_rank: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each point's numbers averaged over the ranks (every rank ran the same shapes in the
    same order); labels and missing values are rank 0's."""
    out = []
    for pts in zip(*per_rank, strict=True):
        point = dict(pts[0])
        for k, v in point.items():
            vals = [p[k] for p in pts]
            if isinstance(v, float | int) and not isinstance(v, bool) and all(
                    isinstance(x, float | int) for x in vals):
                point[k] = statistics.fmean(vals)
        out.append(point)
    return out


def bench_host_tiers(cfg: BenchConfig, device_type: str, out: Measurements,
                     tick: Callable[[], None]) -> None:
    """bench_host: in cfg.compute_ranks ranks with a process group and all-to-alls between
    their phases, each point the ranks' mean (_host_rank); with one rank, in this
    process."""
    if cfg.compute_ranks < 2:
        device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
        with tempfile.TemporaryDirectory() as tmp:
            bench_host(cfg, device, out, tick, Path(tmp))
        return
    ms: list[Measurements] = _in_ranks(cfg.compute_ranks, device_type, _host_rank, cfg, tick)
    out.host += _mean_points([m.host for m in ms])


def _collective_rank(rank: int, world: int, init_file: str, device_type: str,
                     cfg: BenchConfig, q: Any) -> None:
    """One rank: time every all-to-all size and all-reduce size, and report its figures
    (compare.collective_figure)."""
    import torch.distributed as dist

    from planner.executor.comm import Timer
    from planner.executor.compare import collective_figure

    device = _rank_start(rank, world, init_file, device_type)
    try:
        comm = _comm(rank, world, init_file, device)
        # Timed as the ranks time a collective (comm.Timer): the wall time inside the
        # collective call itself, after an untimed barrier; not the packing around it.
        timer = Timer(device, defaultdict(float))
        comm.timer = timer
        calls: list[Callable[[], object]] = []
        for m in cfg.a2a_bytes:
            send = [None if d == rank else torch.zeros(m, dtype=torch.uint8)
                    for d in range(world)]
            calls.append(lambda send=send, m=m: comm.alltoall("a2a", send, [m] * world))
        for r in cfg.allreduce_rows:
            for k in ALLREDUCE_TABLES:  # the same rows as k tables in one bucket
                xs = [torch.zeros(max(1, r // k), 16, device=device) for _ in range(k)]
                calls.append(lambda xs=xs: comm.ring_allreduce("ar", xs, CommPrecision.FP32))
        # As a rank's collectives come: each after some compute of its step (an untimed
        # lookup over a table larger than the caches), every size once per repetition in
        # turn. Back to back, the same call over and over, the ranks' all-to-alls ran
        # 12-44% over the fitted figures (benchmarks/fidelity, 741b204 and e2b5de9).
        table = torch.randn(200_000, 64, device=device)
        ids = torch.randint(0, 200_000, (16_384,), device=device)
        offsets = torch.arange(0, 16_384, 8, device=device)
        walls: list[list[float]] = [[] for _ in calls]
        for rep in range(cfg.collective_reps + 1):  # the first untimed
            for i, fn in enumerate(calls):
                torch.nn.functional.embedding_bag(ids, table, offsets, mode="sum")
                timer.reset()
                timer.new_step()
                with timer("collective"):
                    fn()
                if rep:
                    walls[i].append(timer.steps[-1]["collective"].coll_wall)
        # Each rank its own figures: the parent takes the ranks' mean, as the model prices a
        # GPU by its own calls (the slowest rank's figure counts a peer's late exit from the
        # barrier: twice the mean at 64 B, measured).
        q.put(("done", rank, [collective_figure(w) for w in walls]))
    finally:
        dist.destroy_process_group()


# Process groups per world size, each point the median over them: a 64-byte all-to-all's
# figure ran 127-196 us from one group to the next here, and the median of 3 groups moved
# from 127 to 207 us between calibrations (measured).
COLLECTIVE_ROUNDS = 7


def _in_ranks(world: int, device_type: str, target: Callable[..., None], cfg: BenchConfig,
              tick: Callable[[], None]) -> list[Any]:
    """`world` processes each running target(rank, world, init_file, device_type, cfg, q);
    a rank puts ("tick",) for a progress tick and ("done", rank, payload) at its end.
    Returns the payloads by rank. Fork on CPU: the ranks start in milliseconds instead of
    re-importing torch (seconds each on a loaded machine); CUDA cannot be forked once
    initialised."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("fork" if device_type == "cpu" else "spawn")
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        q = ctx.Queue()
        procs = [ctx.Process(target=target, args=(r, world, init_file, device_type, cfg, q))
                 for r in range(world)]
        for p in procs:
            p.start()
        got: dict[int, Any] = {}
        try:
            # Poll, so a rank that dies is seen at once rather than at a timeout.
            until = time.monotonic() + 900
            while len(got) < world and time.monotonic() < until:
                try:
                    msg = q.get(timeout=0.5)
                except queue.Empty:
                    if any(p.exitcode not in (None, 0) for p in procs):
                        break
                    continue
                if msg[0] == "tick":
                    tick()
                else:
                    got[msg[1]] = msg[2]
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
        if len(got) < world or any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"a benchmark rank failed (world {world})")
    return [got[r] for r in range(world)]


def _collective_round(world: int, device_type: str, cfg: BenchConfig) -> list[float]:
    """One process group of `world` ranks: every point's figure, the ranks' mean."""
    figures = _in_ranks(world, device_type, _collective_rank, cfg, _nothing)
    return [statistics.fmean(f) for f in zip(*figures, strict=True)]


def bench_collectives(cfg: BenchConfig, device_type: str, out: Measurements,
                      tick: Callable[[], None]) -> None:
    for world in cfg.world_sizes:
        # Each point the median over COLLECTIVE_ROUNDS process groups started afresh.
        rounds = [_collective_round(world, device_type, cfg)
                  for _ in range(COLLECTIVE_ROUNDS)]
        medians = [statistics.median(pt) for pt in zip(*rounds, strict=True)]
        k = len(cfg.a2a_bytes)
        for m, t in zip(cfg.a2a_bytes, medians[:k], strict=True):
            # The model's input/output all-to-all bytes are what a GPU receives: W-1 blocks.
            out.alltoall.append({"world": world, "bytes": float((world - 1) * m),
                                 "seconds": t})
        shapes = [(r, n) for r in cfg.allreduce_rows for n in ALLREDUCE_TABLES]
        for (r, n), t in zip(shapes, medians[k:], strict=True):
            nbytes = max(1, r // n) * n * 16 * 4
            out.allreduce.append({"world": world, "bytes": 2 * (world - 1) / world * nbytes,
                                  "tables": n, "seconds": t})
        tick()


def steps_of(cfg: BenchConfig) -> int:
    """Progress ticks a run makes (host-tier shapes, the calibration plans' executions,
    the overlap pairs' where two ranks run, then one per world size)."""
    from planner.calibration.executed import plans_needed

    plans = plans_needed(cfg.compute_ranks, cfg.executed_plans)
    host = sum(len(cfg.host_cache_ratios) if t in (Tier.HBM_CACHE, Tier.SSD) else 1
               for t in cfg.host_tiers) * len(cfg.host_rows) * len(cfg.host_dims) \
        * len(cfg.host_poolings) * len(cfg.host_batches)
    overlap = 2 * cfg.overlap_plans * cfg.executed_reps if cfg.compute_ranks >= 2 else 0
    return host + plans * cfg.executed_reps + overlap + len(cfg.world_sizes)


def to_arrays(rows: list[dict[str, float]], keys: tuple[str, ...]) -> np.ndarray:
    return np.array([[float(r[k]) for k in keys] for r in rows], dtype=np.float64)
