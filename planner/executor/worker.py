"""The process of one rank: `python -m planner.executor.worker RUN_DIR [RANK]`.

Started by `planner execute` (which sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or by
`torchrun ... -m planner.executor.worker RUN_DIR` on every host (torchrun sets the same
variables, and LOCAL_RANK). It writes rankN.json (measurements), rankN.pt (outputs and weights
for the reference check), rankN.hb (heartbeat) and, if it fails, rankN.err.
"""

import datetime
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path


def _watch_launcher(pid: int) -> None:
    """Exit if the launcher dies, so no rank outlives it (ranks run in their own sessions)."""
    while True:
        time.sleep(1.0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(70)


def _apply_fault(fault: str | None, rank: int, step: int) -> None:
    if not fault or fault.startswith("alloc:"):  # alloc: the rank's memory hook (rank.py)
        return
    kind, r, s = fault.split(":")
    if int(r) != rank or int(s) != step:
        return
    if kind == "die":
        os._exit(13)
    if kind == "kill":  # as `kill -9` from outside
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        time.sleep(3600)


def run(run_dir: Path, rank: int, world: int, local_rank: int) -> dict:
    import torch
    import torch.distributed as dist

    from planner.executor.comm import Comm, Heartbeat, pin_rank
    from planner.executor.job import heartbeat_file, read_job, tensors_file
    from planner.executor.layout import exec_layout
    from planner.executor.rank import RankExecutor
    from planner.executor.thread_clock import GroupClock, threads_made_by

    plan, opts = read_job(run_dir)
    if opts.mutants:
        from planner.executor.mutants import apply

        apply(opts.mutants)
    lay = exec_layout(plan)
    if lay.world != world:
        raise ValueError(f"the plan has {lay.world} ranks, the launcher started {world}")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    if opts.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    hb = Heartbeat(heartbeat_file(run_dir, rank))
    hb.mark(-1, "init")
    if opts.device != "cuda":
        pin_rank(local_rank, world)  # before init: gloo's threads too
    # Each group's threads, so that a collective's CPU time is its own group's work
    # (thread_clock.py): a pipelined rank runs two groups' collectives at once.
    _, default_threads = threads_made_by(lambda: dist.init_process_group(
        backend, rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=opts.collective_timeout_s)))
    ex = None
    try:
        comm = Comm(rank, world, device, hb, clock=GroupClock(default_threads))
        # Pipelined: the next step's input all-to-all on a group of its own (input_lane.py).
        lane = None
        if lay.pipelined:
            group, lane_threads = threads_made_by(lambda: dist.new_group(backend=backend))
            lane = Comm(rank, world, device, hb, group=group, clock=GroupClock(lane_threads))
        ex = RankExecutor(lay, rank, device, comm, opts, run_dir, lane_comm=lane)
        # Each block of steps (warm-up, measured, timed) prefetches inside itself only, so
        # that its counters and timings hold its own steps' inputs.
        warm = [-1 - i for i in range(opts.warmup_steps or 0)]  # prepare() resolved None
        for i, s in enumerate(warm):
            ex.step(s, train=False, following=_next(warm, i))
        ex.reset_counters()
        outputs = {}
        measured = list(range(opts.steps))
        # The memory probe's steps: on CPU their inputs run in turn, for torch.profiler
        # records no allocation made on another thread (the lane's; tested), so a lane
        # there would hide bytes from the check; CUDA's allocator counts every thread's.
        lane_measured = lane is not None and device.type == "cuda"
        for i, s in enumerate(measured):
            _apply_fault(opts.fault, rank, s)
            outs = ex.step(s, train=True,
                           following=_next(measured, i) if lane_measured else None)
            if opts.keep_outputs:
                # Kept as numpy copies: harness memory outside torch's allocator, so that on
                # CPU the memory probe does not count the outputs kept for the reference.
                for ti, o in outs.items():
                    outputs[f"out{s}.{ti}"] = o.detach().cpu().numpy().copy()
        peak = ex.mem.finish()
        dist.barrier()
        result = _measurements(ex, opts.steps, device)
        result["peak_memory"] = peak
        result["pipelined_measured_steps"] = lane_measured
        # What coll_proc_cpu holds: its group's threads' CPU time, or the process's.
        clocks = [comm.clock, *([lane.clock] if lane is not None else [])]
        result["collective_cpu_clock"] = ("group threads" if all(c.per_thread for c in clocks)
                                          else "process")
        result["software"] = _software(device)
        if opts.keep_outputs:  # the weights the reference checks: before the timed steps
            kept = {k: torch.from_numpy(v) for k, v in outputs.items()}
            torch.save({**kept, **ex.dump()}, tensors_file(run_dir, rank))
        # Time comes from steps of its own, the memory probe stopped (job.RunOptions).
        ex.start_timing()
        timed = opts.steps if opts.timed_steps is None else opts.timed_steps
        timed_steps = list(range(opts.steps, opts.steps + timed))
        for i, s in enumerate(timed_steps):
            ex.step(s, train=True, following=_next(timed_steps, i))
        hb.mark(opts.steps + timed, "done")
        result["timed_steps"] = timed
        result["seconds"] = {k: v / max(timed, 1) for k, v in ex.seconds.items()}
        result["timing"] = _timing(ex)
        return result
    finally:
        if ex is not None and ex.lane is not None:
            ex.lane.close()
        dist.destroy_process_group()


def _next(steps: list[int], i: int) -> int | None:
    return steps[i + 1] if i + 1 < len(steps) else None


def _measurements(ex: "object", steps: int, device: "object") -> dict:
    from planner.executor.rank import RankExecutor

    assert isinstance(ex, RankExecutor)
    per = 1.0 / steps
    stores = {p.key: ex.stores[p.key] for p in ex.pieces}
    mem = [st.memory() for st in [*ex.stores.values(), *ex.replicas.values()]]
    return {
        "rank": ex.rank,
        "device": str(device),
        "steps": steps,
        "buckets": ex.buckets,
        "collectives": _collectives(ex, per),
        "pieces": {k: {"ids_bytes": s.ids_bytes * per, "lengths_bytes": s.lengths_bytes * per,
                       "own_ids": s.own_ids * per,
                       "out_fwd_bytes": s.out_fwd_bytes * per,
                       "out_bwd_bytes": s.out_bwd_bytes * per}
                   for k, s in ex.stats.items()},
        "cache": {k: {"hits": st.hits, "lookups": st.lookups} for k, st in stores.items()},
        # --kernels fbgemm: which pieces the TBE served (the others: torch, and why), and
        # the bytes of the TBEs' own bookkeeping tensors (not in the memory model).
        "kernels": ({p.key: ("fbgemm" if p.key not in ex.torch_why
                             else f"torch: {ex.torch_why[p.key]}") for p in ex.pieces}
                    if ex.opts.kernels == "fbgemm" else {}),
        "tbe_bookkeeping_bytes": sum(g.bookkeeping() for g in ex.tbe_groups),
        "memory": {f: sum(getattr(m, f) for m in mem) for f in ("hbm", "ddr", "ssd",
                                                                "extra_ddr")},
    }


def _collectives(ex: "object", per: float) -> dict[str, dict[str, float]]:
    """Bytes per step by collective, the input lane's (pipelined) with the step's."""
    from planner.executor.rank import RankExecutor

    assert isinstance(ex, RankExecutor)
    counts = [ex.comm.counts, *([ex.lane.comm.counts] if ex.lane is not None else [])]
    raw: dict[str, list[int]] = {}
    for cs in counts:
        for k, c in cs.items():
            o = raw.setdefault(k, [0, 0])
            o[0] += c.sent
            o[1] += c.recv
    return {k: {"sent": s * per, "recv": r * per} for k, (s, r) in raw.items()}


def _timing(ex: "object") -> list[dict[str, dict[str, float]]]:
    """Per timed step and phase: cpu (the thread's own, nested phases taken out), wall,
    coll_wall / coll_cpu (inside the phase's collectives), calls (comm.PhaseTime)."""
    from dataclasses import asdict

    from planner.executor.rank import RankExecutor

    assert isinstance(ex, RankExecutor)
    return [{ph: asdict(t) for ph, t in rec.items()} for rec in ex.timer.steps]


def _software(device: "object") -> dict:
    import platform

    import torch

    out = {"torch": torch.__version__, "python": platform.python_version()}
    if getattr(device, "type", "") == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)  # type: ignore[arg-type]
        out["cuda"] = torch.version.cuda
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        props = torch.cuda.get_device_properties(device)  # type: ignore[arg-type]
        out["hbm_total_bytes"] = props.total_memory
    return out


def rank_main(run_dir: Path, rank: int, world: int, local_rank: int) -> int:
    """Run one rank and record how it ended; the process exit code."""
    from planner.executor.comm import CollectiveError
    from planner.executor.job import error_file, result_file

    try:
        result = run(run_dir, rank, world, local_rank)
    except CollectiveError as exc:
        error_file(run_dir, rank).write_text(json.dumps(
            {"kind": "collective", "message": str(exc)}))
        return 3
    except Exception as exc:
        # A dead or hung peer shows up as a torch.distributed error (barrier, teardown);
        # anything else that escapes is this rank's own failure.
        import torch.distributed as dist

        peer = isinstance(exc, dist.DistError) or any(
            m in str(exc) for m in ("Connection closed", "Connection reset", "Timed out"))
        kind = "collective" if peer else "own"
        error_file(run_dir, rank).write_text(json.dumps(
            {"kind": kind, "message": f"{type(exc).__name__}: {exc}",
             "traceback": traceback.format_exc()}))
        return 3 if kind == "collective" else 1
    result_file(run_dir, rank).write_text(json.dumps(result))
    return 0


def launched_rank(run_dir: Path, rank: int, env: dict[str, str]) -> None:
    """Entry of a rank started by `planner execute` (forked from a server that has torch
    loaded already): a session of its own, its output to files, the launcher watched."""
    os.setsid()
    os.environ.update(env)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        f = os.open(run_dir / f"rank{rank}.{name}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    threading.Thread(target=_watch_launcher, args=(int(env["PLANNER_EXECUTOR_LAUNCHER"]),),
                     daemon=True).start()
    code = rank_main(run_dir, rank, int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    """Entry under torchrun (or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK)."""
    run_dir = Path(sys.argv[1])
    rank = int(os.environ.get("RANK", sys.argv[2] if len(sys.argv) > 2 else "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if "PLANNER_EXECUTOR_LAUNCHER" in os.environ:  # started by `planner execute`
        threading.Thread(target=_watch_launcher,
                         args=(int(os.environ["PLANNER_EXECUTOR_LAUNCHER"]),),
                         daemon=True).start()
    sys.exit(rank_main(run_dir, rank, world, local_rank))


if __name__ == "__main__":
    main()
