"""Start one process per rank on this machine, watch them, and never leave one behind.

Each rank runs in its own session (its own process group), on loopback with a free port.
The launcher polls: when a rank exits with an error, it waits a moment for the others to
notice, then names the culprit: a rank that died by itself (killed, crashed, or failed in its
own code) rather than one whose collective failed because a peer went away; if only
collective failures are seen, a rank that is still running (hung) or the one with the least
progress in its heartbeat. At the overall deadline, the rank with the least progress is the
hung one. In every case all process groups are killed before returning.
"""

import contextlib
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path

from planner.executor.job import error_file, heartbeat_file, result_file

_POLL_S = 0.05
_GRACE_S = 1.5  # after a first failure: time for the other ranks to report theirs


class RankFailure(RuntimeError):
    def __init__(self, ranks: list[int], message: str) -> None:
        super().__init__(message)
        self.ranks = ranks


class _Proc:
    """A rank's process, started by subprocess or by a multiprocessing forkserver."""

    def __init__(self, rank: int, proc: "subprocess.Popen[bytes] | BaseProcess") -> None:
        self.rank, self.proc = rank, proc

    @property
    def pid(self) -> int:
        pid = self.proc.pid
        assert pid is not None
        return pid

    def poll(self) -> int | None:
        if isinstance(self.proc, subprocess.Popen):
            return self.proc.poll()
        return self.proc.exitcode

    def wait(self) -> None:
        if isinstance(self.proc, subprocess.Popen):
            self.proc.wait()
        else:
            self.proc.join()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _progress(run_dir: Path, rank: int) -> tuple[int, str]:
    try:
        n, step, phase = heartbeat_file(run_dir, rank).read_text().split()
        return int(n), f"step {step}, {phase}"
    except (OSError, ValueError):
        return -1, "not started"


def _error(run_dir: Path, rank: int) -> dict[str, str] | None:
    try:
        return json.loads(error_file(run_dir, rank).read_text())
    except (OSError, ValueError):
        return None


def _stderr_tail(run_dir: Path, rank: int, chars: int = 600) -> str:
    try:
        return (run_dir / f"rank{rank}.stderr").read_text()[-chars:].strip()
    except OSError:
        return ""


def _kill_all(procs: list[_Proc]) -> None:
    for p in procs:
        # The whole group: the rank and anything it started.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()


def _cause(code: int, err: dict[str, str] | None) -> str:
    """Why a rank ended, in words."""
    if err is not None:
        return err["message"]
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}, no report"
    return f"exit code {code}, no report"


def _diagnose(run_dir: Path, procs: list[_Proc], hung: bool) -> RankFailure:
    codes = {p.rank: p.poll() for p in procs}
    lines = []
    own: list[int] = []
    causes: dict[int, str] = {}
    for r, code in codes.items():
        err = _error(run_dir, r)
        where = _progress(run_dir, r)[1]
        if code is None:
            lines.append(f"rank {r}: still running, last seen at {where}")
        elif code != 0:
            kind = err["kind"] if err else "died"
            causes[r] = _cause(code, err)
            lines.append(f"rank {r}: {kind} failure, last seen at {where}: {causes[r]}")
            if kind != "collective":
                own.append(r)
    if own and not hung:
        what = "died" if all(_error(run_dir, r) is None for r in own) else "failed"
        tails = "\n".join(f"--- rank {r} stderr ---\n{_stderr_tail(run_dir, r)}" for r in own
                          if _stderr_tail(run_dir, r))
        head = f"rank {', '.join(map(str, own))} {what}: " + "; ".join(
            f"{causes[r]} (last seen at {_progress(run_dir, r)[1]})" if len(own) == 1
            else f"rank {r}: {causes[r]}" for r in own)
        return RankFailure(own, head + "\n" + "\n".join(lines) + ("\n" + tails if tails else ""))
    running = [r for r, c in codes.items() if c is None]
    pool = running if running and not hung else list(codes)
    low = min(_progress(run_dir, r)[0] for r in pool)
    culprits = [r for r in pool if _progress(run_dir, r)[0] == low]
    why = ("the run's deadline passed" if hung else
           "its peers' collectives timed out waiting for it")
    head = (f"rank {', '.join(map(str, culprits))} hung: no progress past "
            f"{_progress(run_dir, culprits[0])[1]} ({why})")
    return RankFailure(culprits, head + "\n" + "\n".join(lines))


_PRELOAD = ["torch", "torch.distributed", "torch._inductor.config", "planner.executor.worker",
            "planner.executor.rank", "planner.executor.layout"]


def launch(run_dir: Path, world: int, timeout_s: float, start: str = "forkserver"
           ) -> list[dict]:
    """Run `world` ranks on the job in run_dir; their measurements, or RankFailure.

    start="forkserver": ranks fork from a server process that has imported torch once (a
    rank then starts in milliseconds, not seconds); start="subprocess": each rank is a fresh
    `python -m planner.executor.worker`, as torchrun would start it."""
    port = free_port()
    procs: list[_Proc] = []
    env_base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "WORLD_SIZE": str(world), "PLANNER_EXECUTOR_LAUNCHER": str(os.getpid()),
                "OMP_NUM_THREADS": "1"}
    (run_dir / "pids").unlink(missing_ok=True)
    try:
        for r in range(world):
            env = {**env_base, "RANK": str(r), "LOCAL_RANK": str(r)}
            procs.append(_Proc(r, _start(run_dir, r, env, start)))
            with open(run_dir / "pids", "a") as f:
                f.write(f"{procs[-1].pid}\n")
        deadline = time.monotonic() + timeout_s
        failed_at = None
        while True:
            codes = [p.poll() for p in procs]
            if all(c == 0 for c in codes):
                break
            now = time.monotonic()
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = now
            if failed_at is not None and (now - failed_at > _GRACE_S or all(
                    c is not None for c in codes)):
                raise _diagnose(run_dir, procs, hung=False)
            if now > deadline:
                raise _diagnose(run_dir, procs, hung=True)
            time.sleep(_POLL_S)
    finally:
        _kill_all(procs)
    return [json.loads(result_file(run_dir, r).read_text()) for r in range(world)]


def _start(run_dir: Path, rank: int, env: dict[str, str], start: str
           ) -> "subprocess.Popen[bytes] | BaseProcess":
    if start == "subprocess":
        with open(run_dir / f"rank{rank}.stdout", "wb") as out, \
                open(run_dir / f"rank{rank}.stderr", "wb") as err:
            return subprocess.Popen(
                [sys.executable, "-m", "planner.executor.worker", str(run_dir), str(rank)],
                env={**os.environ, **env}, stdout=out, stderr=err, start_new_session=True)
    from planner.executor.worker import launched_rank

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    proc = ctx.Process(target=launched_rank, args=(run_dir, rank, env), daemon=False)
    with _main_hidden():
        proc.start()
    return proc


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """multiprocessing re-runs the caller's __main__ script in the server and every child
    unless it is guarded by `if __name__ == "__main__"`; the rank's entry point lives in
    planner.executor.worker, so hide __main__ while starting: callers need no guard."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main
