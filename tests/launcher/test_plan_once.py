"""A job plans once: under torchrun (rank 0 broadcasts) and through the file-locked cache."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = "tests.launcher.plan_once_worker"


def _results(out: Path, n: int) -> list[dict[str, object]]:
    got = [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]
    assert [g["rank"] for g in got] == list(range(n))
    return got


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Nothing left running: the process and everything in its session."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env.pop("PLANNER_PLAN_CACHE", None)
    return env


@pytest.mark.timeout(240)
def test_torchrun_four_ranks_plan_once(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    # A session of its own, so a timeout kills torchrun and every rank it started.
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
         "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), "--module", WORKER,
         str(tmp_path), "dist"],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        _, err = proc.communicate(timeout=200)
    finally:
        _kill_group(proc)
    assert proc.returncode == 0, err[-3000:]
    got = _results(tmp_path, 4)
    assert sum(bool(g["planned"]) for g in got) == 1
    assert got[0]["planned"] and all(g["source"] == "broadcast from rank 0" for g in got[1:])
    assert len({g["hash"] for g in got}) == 1


@pytest.mark.timeout(240)
def test_file_cache_four_processes_plan_once(tmp_path: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-m", WORKER, str(tmp_path), "file", str(r)],
                              cwd=ROOT, env=_env(), stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
             for r in range(4)]
    try:
        for p in procs:
            _, err = p.communicate(timeout=200)
            assert p.returncode == 0, err[-3000:]
    finally:
        for p in procs:
            _kill_group(p)
    got = _results(tmp_path, 4)
    assert sum(bool(g["planned"]) for g in got) == 1
    assert len({g["hash"] for g in got}) == 1
    # The cache holds one plan, whole, and a later caller reads it without planning.
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1
    assert not list((tmp_path / "cache").glob("*.tmp"))


def test_cached_plan_that_fails_its_hash_is_refused(tmp_path: Path) -> None:
    from planner.launcher import plan_once, request_key

    model = json.loads((ROOT / "fixtures/models/criteo_kaggle.json").read_text())
    request = {"model": model, "hardware": {"preset": "h100", "hosts": 1}}
    first = plan_once(request, cache_dir=tmp_path)
    assert first.planned
    path = tmp_path / f"{request_key(request).removeprefix('sha256:')}.json"
    data = json.loads(path.read_text())
    data["summary"]["step_time_s"] *= 0.5  # a tampered figure under the old hash
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="does not match its own hash"):
        plan_once(request, cache_dir=tmp_path)
