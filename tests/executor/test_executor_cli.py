"""`planner execute` from the command line, as a user runs it (a subprocess): a rank killed
with SIGKILL or hung ends the run with exit 4 and a plain `error: rank N ...` line naming the
rank and the cause; gloo's bracketed text is printed as it is, not read as markup."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from planner.executor.demo import small_plan

_CLI = [sys.executable, "-c", "from planner.cli import app; app()", "execute"]


def test_dead_and_hung_ranks_exit_4_from_the_cli_with_rank_and_cause(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(small_plan().model_dump_json())
    cases = {  # fault -> how stderr starts
        "kill:1:1": "error: rank 1 died: killed by SIGKILL",
        "hang:0:2": "error: rank 0 hung: no progress past step",
    }
    env = {**os.environ, "COLUMNS": "200"}
    procs = {f: subprocess.Popen(
        [*_CLI, str(plan), "--steps", "3", "--warmup-steps", "1", "--collective-timeout", "3",
         "--timeout", "60", "--no-reference", "--fault", f,
         "--run-dir", str(tmp_path / f.replace(":", "_"))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for f in cases}
    for fault, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        head = cases[fault]
        assert proc.returncode == 4, (fault, proc.returncode, err[-2000:])
        assert err.startswith(head), (fault, err[:500])
        assert "MarkupError" not in err and "Traceback" not in err, err[-2000:]
        # The peer's collective error, gloo's "[.../gloo/transport/tcp/...]" text verbatim:
        # what rich used to read as markup.
        assert "[/" in err and "gloo" in err, err
        assert out == ""
