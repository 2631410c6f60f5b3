"""Microbenchmarks on this machine through the executor's own code paths.

- lookups: `DenseStore.pool` (kernels.pool_bags, torch's fused embedding_bag), timed against
  rows, dim, pooling and batch; the model's bytes are hbm_fwd = lookups * (row + id) bytes.
- backward: `kernels.row_grads_bags` then `DenseStore.update` with each optimizer, as the
  ranks run a piece's backward; bytes = the distinct rows read and written with their state
  plus the pooled gradients read per lookup (traffic.py).
- collectives: `Comm.alltoall` and `Comm.ring_allreduce` over gloo (CPU) or NCCL (CUDA) on
  loopback ranks, against message size and world size.

Each figure is the median of `reps` timed runs after one untimed run; a collective's time is
the slowest rank's median (every rank waits for it).
"""

import os
import queue
import statistics
import tempfile
import time
from collections.abc import Callable
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
    reps: int = 9
    seed: int = 0

    @staticmethod
    def smoke() -> "BenchConfig":
        """Seconds, for tests: few shapes, one world size (its constants are rough)."""
        return BenchConfig(rows=(10_000,), dims=(16, 64), poolings=(1, 8), batches=(256,),
                           optimizers=(Optimizer.SGD, Optimizer.ADAM),
                           a2a_bytes=(64, 262_144), allreduce_rows=(64, 16_384),
                           world_sizes=(2,), reps=2)

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


def _median_time(fn: Callable[[], object], reps: int, sync: Callable[[], None]) -> float:
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


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
                        offsets = kernels.bag_offsets(
                            torch.full((batch,), pooling, dtype=torch.int64)).to(device)
                        if opt is cfg.optimizers[0]:
                            t = _median_time(lambda s_=store, i_=ids, o_=offsets:
                                             s_.pool(i_, o_), cfg.reps, sync)
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

                        t = _median_time(backward, cfg.reps, sync)
                        uniq = int(torch.unique(ids).numel())
                        row = dim * 4 + optimizer_state_row_bytes(opt, dim)
                        out.backward.append({"bytes": uniq * 2 * row + n * GRAD_BYTES * dim,
                                             "launches": 1.0, "seconds": t, "rows": rows,
                                             "dim": dim, "pooling": pooling, "batch": batch,
                                             "optimizer": str(opt), "unique": uniq})
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
    return shapes + len(cfg.world_sizes)


def to_arrays(rows: list[dict[str, float]], keys: tuple[str, ...]) -> np.ndarray:
    return np.array([[float(r[k]) for k in keys] for r in rows], dtype=np.float64)
