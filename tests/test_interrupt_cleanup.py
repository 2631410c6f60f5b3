"""Ctrl-C in the middle of the suite leaves nothing running: a pytest run of a real service
test and of a real executor test is interrupted (SIGINT, as Ctrl-C sends) once its server or
ranks are up, and every process it started is gone after it exits."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc."""
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited while we looked
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def _descendants(pid: int) -> set[int]:
    tree, found, todo = _children(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its parent's wait is missing


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")
@pytest.mark.parametrize(("test", "marker"), [
    ("tests/api/test_api_keys.py", "planner.cli serve"),
    ("tests/executor/test_executor_failures.py::test_whole_run_deadline_names_the_hung_rank",
     "multiprocessing"),
], ids=["service", "executor"])
def test_ctrl_c_mid_test_leaves_nothing_running(test: str, marker: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             test], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=dict(os.environ))
    try:
        seen: set[int] = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            seen |= _descendants(proc.pid)
            if any(marker in _cmdline(p) for p in seen):
                break
            time.sleep(0.2)
        assert any(marker in _cmdline(p) for p in seen), f"no '{marker}' process started"
        time.sleep(1.0)  # let it get going
        seen |= _descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        end = time.monotonic() + 10  # children may take a moment to finish exiting
        while time.monotonic() < end and any(_alive(p) for p in seen):
            time.sleep(0.2)
        left = {p: _cmdline(p)[:120] for p in seen if _alive(p)}
        assert not left, f"left running after Ctrl-C: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
