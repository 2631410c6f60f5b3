"""Microbenchmarks on this machine through the executor's own code paths.

- lookups: a piece's whole lookup as `RankExecutor.step` runs it (rank.py): the bag offsets
  from the received lengths (`kernels.bag_offsets`), then `DenseStore.pool`
  (kernels.pool_bags, torch's fused embedding_bag), timed against rows, dim, pooling and
  batch; the model's bytes are hbm_fwd = lookups * (row + id) bytes.
- backward: `kernels.row_grads_bags` then `DenseStore.update` with each optimizer, as the
  ranks run a piece's backward; bytes = the distinct rows read and written with their state
  plus the pooled gradients read per lookup (traffic.py).
- host tiers: a ddr, hbm_cache or ssd piece's steps through the executor's stores
  (`make_store`: DenseStore in host memory, CachedStore), with the rank's spans: a ddr or
  ssd piece's pool and update inside `cache_miss`, a cache's misses, write-backs and
  re-admission (`end_step`) inside it by the store's own `host_span`, timed by the rank's
  `comm.Timer` as the rank times its `cache_miss` phase; the model's bytes are
  cost_models.traffic.piece_traffic's `host` and `ssd` for the same shape.
- collectives: `Comm.alltoall` and `Comm.ring_allreduce` over gloo (CPU) or NCCL (CUDA) on
  loopback ranks, against message size and world size.

Compute is timed as the ranks time it (comm.Timer): on CPU the thread's own CPU time, and
inside the profiler the executor's CPU memory probe keeps running in every rank
(memprobe.MemProbe: torch.profiler with profile_memory, which adds its recording to every
operator); on CUDA wall time after a device synchronize. Each figure is the median of `reps`
timed runs after one untimed run; a collective's time is the slowest rank's median (every
rank waits for it).
"""

import contextlib
import os
import queue
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cost_models.sizes import optimizer_state_row_bytes
from cost_models.types import CommPrecision, Optimizer, Tier

ID_BYTES = 8  # the executor's ids are int64
GRAD_BYTES = 4  # pooled gradients are fp32


@dataclass(frozen=True)
class BenchConfig:
    rows: tuple[int, ...] = (10_000, 200_000)
    dims: tuple[int, ...] = (16, 64)
    poolings: tuple[int, ...] = (1, 8)
    batches: tuple[int, ...] = (256, 2048)
    optimizers: tuple[Optimizer, ...] = tuple(Optimizer)
    a2a_bytes: tuple[int, ...] = (64, 16_384, 262_144, 1_048_576)  # per peer
    allreduce_rows: tuple[int, ...] = (64, 4_096, 65_536)  # of 16 fp32 columns
    world_sizes: tuple[int, ...] = (2, 3)
    # Host tiers (ddr, hbm_cache, ssd pieces): shapes and cache ratios of the cached tiers.
    host_tiers: tuple[Tier, ...] = (Tier.DDR, Tier.HBM_CACHE, Tier.SSD)
    host_rows: tuple[int, ...] = (10_000, 200_000)
    host_dims: tuple[int, ...] = (16, 64)
    host_poolings: tuple[int, ...] = (1, 8)
    host_batches: tuple[int, ...] = (256, 2048)
    host_cache_ratios: tuple[float, ...] = (0.05, 0.3)
    reps: int = 9
    seed: int = 0
    # Time compute inside the profiler the executor's CPU memory probe runs in every rank
    # (memprobe.MemProbe), as the ranks' timings are taken (CPU only).
    executor_probe: bool = True

    @staticmethod
    def smoke() -> "BenchConfig":
        """Seconds, for tests: few shapes, one world size (its constants are rough)."""
        return BenchConfig(rows=(10_000,), dims=(16, 64), poolings=(1, 8), batches=(256,),
                           optimizers=(Optimizer.SGD, Optimizer.ADAM),
                           a2a_bytes=(64, 262_144), allreduce_rows=(64, 16_384),
                           world_sizes=(2,), host_rows=(10_000,), host_dims=(16,),
                           host_batches=(256,), host_cache_ratios=(0.1,), reps=2)

    @staticmethod
    def long(world: int) -> "BenchConfig":
        """A longer run: more shapes and sizes, more repeats (minutes)."""
        return BenchConfig(rows=(10_000, 200_000, 2_000_000), dims=(8, 32, 128),
                           poolings=(1, 4, 16), batches=(256, 1024, 4096),
                           a2a_bytes=(64, 4_096, 65_536, 262_144, 1_048_576, 4_194_304),
                           allreduce_rows=(64, 1_024, 16_384, 131_072),
                           world_sizes=tuple(range(2, max(world, 2) + 1)), reps=9)


@dataclass
class Measurements:
    """Every timed point: its features (what the model multiplies) and seconds."""

    lookup: list[dict[str, float]] = field(default_factory=list)
    backward: list[dict[str, float]] = field(default_factory=list)
    alltoall: list[dict[str, float]] = field(default_factory=list)
    allreduce: list[dict[str, float]] = field(default_factory=list)
    host: list[dict[str, Any]] = field(default_factory=list)


def _clock(device: torch.device) -> Callable[[], float]:
    """The clock the ranks time compute by (comm.Timer): the thread's CPU time on CPU (one
    thread per rank, so other processes' load is not counted), wall time on CUDA."""
    return time.perf_counter if device.type == "cuda" else time.thread_time


def _median_time(fn: Callable[[], object], reps: int, sync: Callable[[], None],
                 clock: Callable[[], float] = time.perf_counter) -> float:
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = clock()
        fn()
        sync()
        times.append(clock() - t0)
    return statistics.median(times)


@contextlib.contextmanager
def executor_probe(device: torch.device, on: bool) -> Iterator[None]:
    """The profiler a CPU rank runs under from its start to its end (memprobe.MemProbe:
    torch.profiler, CPU activities, profile_memory), so that each operator costs here what it
    costs in a rank. Nothing on CUDA (the probe reads the allocator's statistics per phase
    there, not per operator)."""
    if not on or device.type != "cpu":
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
        yield


def _sync_of(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def bench_kernels(cfg: BenchConfig, device: torch.device, out: Measurements,
                  tick: Callable[[], None]) -> None:
    """Lookups and backward updates of one piece, through the executor's store and kernels."""
    from planner.executor import kernels
    from planner.executor.store import DenseStore

    gen = torch.Generator().manual_seed(cfg.seed)
    sync = _sync_of(device)
    clock = _clock(device)
    cfg_o = kernels.OptimConfig()
    for rows in cfg.rows:
        for dim in cfg.dims:
            w = torch.randn(rows, dim, generator=gen)
            for opt in cfg.optimizers:
                s = torch.zeros(rows, kernels.state_cols(opt, dim))
                store = DenseStore(w.clone(), s, Tier.HBM, device)
                for pooling in cfg.poolings:
                    for batch in cfg.batches:
                        n = batch * pooling
                        ids = torch.randint(0, rows, (n,), generator=gen).to(device)
                        lengths = torch.full((batch,), pooling, dtype=torch.int64).to(device)
                        offsets = kernels.bag_offsets(lengths)
                        if opt is cfg.optimizers[0]:
                            # A piece's lookup as rank.py's step runs it: its bag offsets
                            # from the lengths it received, then the store's fused pool.
                            def lookup(s_: DenseStore = store, i_: torch.Tensor = ids,
                                       len_: torch.Tensor = lengths) -> torch.Tensor:
                                return s_.pool(i_, kernels.bag_offsets(len_))

                            t = _median_time(lookup, cfg.reps, sync, clock)
                            out.lookup.append({"bytes": n * (dim * 4 + ID_BYTES),
                                               "launches": 1.0, "seconds": t,
                                               "rows": rows, "dim": dim, "pooling": pooling,
                                               "batch": batch})
                        grad = torch.randn(batch, dim, generator=gen).to(device)

                        def backward(ids: torch.Tensor = ids, offsets: torch.Tensor = offsets,
                                     grad: torch.Tensor = grad, opt: Optimizer = opt,
                                     store: DenseStore = store) -> None:
                            uniq, g = kernels.row_grads_bags(ids, offsets, grad)
                            store.update(uniq, lambda w_, s_: kernels.apply_optimizer(
                                opt, cfg_o, w_, s_, g, 1))

                        t = _median_time(backward, cfg.reps, sync, clock)
                        uniq = int(torch.unique(ids).numel())
                        row = dim * 4 + optimizer_state_row_bytes(opt, dim)
                        out.backward.append({"bytes": uniq * 2 * row + n * GRAD_BYTES * dim,
                                             "launches": 1.0, "seconds": t, "rows": rows,
                                             "dim": dim, "pooling": pooling, "batch": batch,
                                             "optimizer": str(opt), "unique": uniq})
                        tick()


def _host_traffic(rows: int, dim: int, pooling: int, batch: int, tier: Tier, ratio: float,
                  opt: Optimizer) -> tuple[float, float]:
    """(host, ssd) bytes the cost model counts for a table-wise piece of this shape on one
    GPU (cost_models.traffic.piece_traffic, uniform ids as the benchmark draws them)."""
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
    tr = piece_traffic(geom, ShardingType.TABLE_WISE, tier, ratio, rows, dim, hw, model)
    return tr.host, tr.ssd


def bench_host(cfg: BenchConfig, device: torch.device, out: Measurements,
               tick: Callable[[], None], work_dir: Path) -> None:
    """A ddr, hbm_cache or ssd piece's steps through the executor's stores, its host-memory
    work timed as rank.py times its `cache_miss` phase (comm.Timer, the same spans): the
    lookup (bag offsets, then the store's pool: a ddr or ssd piece's wholly on the host, an
    hbm_cache's misses), the backward (row gradients, then the store's update: a ddr or ssd
    piece's wholly, an hbm_cache's misses and its state in host memory) and the cache's
    re-admission (end_step). New uniform ids every step, as the ranks draw them; the caches
    are filled by `warm` untimed steps first (they start empty)."""
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

                            hits = looked = 0
                            for step in range(warm + cfg.reps):
                                if step == warm:
                                    store.hits = store.lookups = 0
                                    timer.reset()
                                ids = torch.randint(0, rows, (n,), generator=gen).to(device)
                                timer.new_step()
                                with timer("lookup"):
                                    offsets = kernels.bag_offsets(lengths)
                                    with on_host():
                                        store.pool(ids, offsets)
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
                            host_b, ssd_b = _host_traffic(rows, dim, pooling, batch, tier,
                                                          ratio, opt)
                            out.host.append({"tier": str(tier), "rows": rows, "dim": dim,
                                             "pooling": pooling, "batch": batch,
                                             "cache_ratio": ratio, "optimizer": str(opt),
                                             "host_bytes": host_b, "ssd_bytes": ssd_b,
                                             "hit_rate": hits / looked if looked else None,
                                             "seconds": t})
                            del store
                            tick()


def _collective_rank(rank: int, world: int, init_file: str, device_type: str,
                     cfg: BenchConfig, q: Any) -> None:
    """One rank: time every all-to-all size and all-reduce size; rank 0 reports the slowest
    rank's medians."""
    import torch.distributed as dist

    from planner.executor.comm import Comm, Heartbeat

    torch.set_num_threads(1)
    backend = "nccl" if device_type == "cuda" else "gloo"
    device = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        hb = Heartbeat(Path(init_file).parent / f"heartbeat{rank}.txt")
        comm = Comm(rank, world, device, hb)
        # The settle wait only keeps the CPU memory probe's frees on this thread; nothing is
        # probed here, and a wait on a buffer the caller still holds would time the timeout.
        comm._settle = lambda *tensors: None  # type: ignore[method-assign]
        sync = _sync_of(device)
        medians: list[float] = []

        def timed(fn: Callable[[], object]) -> float:
            times = []
            for i in range(cfg.reps + 1):
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                sync()
                if i:
                    times.append(time.perf_counter() - t0)
            return statistics.median(times)

        for m in cfg.a2a_bytes:
            send = [None if d == rank else torch.zeros(m, dtype=torch.uint8)
                    for d in range(world)]
            medians.append(timed(lambda send=send, m=m: comm.alltoall("a2a", send,
                                                                      [m] * world)))
        for r in cfg.allreduce_rows:
            x = torch.zeros(r, 16, device=device)
            medians.append(timed(lambda x=x: comm.ring_allreduce("ar", [x],
                                                                 CommPrecision.FP32)))
        worst = torch.tensor(medians, dtype=torch.float64)
        if device_type == "cuda":
            worst = worst.to(device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        if rank == 0:
            q.put(worst.cpu().tolist())
    finally:
        dist.destroy_process_group()


def bench_collectives(cfg: BenchConfig, device_type: str, out: Measurements,
                      tick: Callable[[], None]) -> None:
    import torch.multiprocessing as mp

    # Fork on CPU: the ranks start in milliseconds instead of re-importing torch (seconds
    # each on a loaded machine); CUDA cannot be forked once initialised.
    ctx = mp.get_context("fork" if device_type == "cpu" else "spawn")
    for world in cfg.world_sizes:
        with tempfile.TemporaryDirectory() as tmp:
            init_file = os.path.join(tmp, "init")
            q = ctx.Queue()
            procs = [ctx.Process(target=_collective_rank,
                                 args=(r, world, init_file, device_type, cfg, q))
                     for r in range(world)]
            for p in procs:
                p.start()
            medians = None
            try:
                # Poll, so a rank that dies is seen at once rather than at a timeout.
                until = time.monotonic() + 300
                while medians is None and time.monotonic() < until:
                    try:
                        medians = q.get(timeout=0.5)
                    except queue.Empty:
                        if any(p.exitcode not in (None, 0) for p in procs):
                            break
            finally:
                for p in procs:
                    p.join(timeout=30)
                    if p.is_alive():
                        p.kill()
            if medians is None or any(p.exitcode != 0 for p in procs):
                raise RuntimeError(f"a collective benchmark rank failed (world {world})")
        k = len(cfg.a2a_bytes)
        for m, t in zip(cfg.a2a_bytes, medians[:k], strict=True):
            # The model's input/output all-to-all bytes are what a GPU receives: W-1 blocks.
            out.alltoall.append({"world": world, "bytes": float((world - 1) * m),
                                 "seconds": t})
        for r, t in zip(cfg.allreduce_rows, medians[k:], strict=True):
            nbytes = r * 16 * 4
            out.allreduce.append({"world": world, "bytes": 2 * (world - 1) / world * nbytes,
                                  "seconds": t})
        tick()


def steps_of(cfg: BenchConfig) -> int:
    """Progress ticks a run makes (kernel shapes, then one per world size)."""
    shapes = len(cfg.rows) * len(cfg.dims) * len(cfg.optimizers) * len(cfg.poolings) \
        * len(cfg.batches)
    host = sum(len(cfg.host_cache_ratios) if t in (Tier.HBM_CACHE, Tier.SSD) else 1
               for t in cfg.host_tiers) * len(cfg.host_rows) * len(cfg.host_dims) \
        * len(cfg.host_poolings) * len(cfg.host_batches)
    return shapes + host + len(cfg.world_sizes)


def to_arrays(rows: list[dict[str, float]], keys: tuple[str, ...]) -> np.ndarray:
    return np.array([[float(r[k]) for k in keys] for r in rows], dtype=np.float64)
