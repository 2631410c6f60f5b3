"""What every rank reads before it starts: the (scaled) plan and the run options, one JSON file
in the run directory, plus the names of the files each rank writes there."""

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from planner.plan_model import Plan

JOB_FILE = "job.json"


@dataclass(frozen=True)
class RunOptions:
    steps: int = 5
    # Training steps timed after the measured ones, with the CPU memory probe stopped: the
    # profiler it runs records every operator and adds about half to a CPU rank's compute
    # (measured), so time is never read from the steps the memory is read from. None: as
    # many as `steps`.
    timed_steps: int | None = None
    # Forward-only steps first: caches warm up, weights do not change. None: as many as the
    # plan's caches need (warmup.warmup_steps), fixed by `prepare` before the ranks start.
    warmup_steps: int | None = None
    seed: int = 0
    lr: float = 0.01
    eps: float = 1e-8  # of the Adagrad, row-wise Adagrad and Adam updates
    device: str = "cpu"  # "cpu" (gloo) or "cuda" (NCCL, one GPU per rank)
    # "lfu" or "lru" for every cached table, in place of each table's own (its spec's
    # cache_policy, lfu when absent); None: the tables' own.
    cache_policy: str | None = None
    collective_timeout_s: float = 60.0
    keep_outputs: bool = True  # keep pooled outputs and weights for the reference check
    # Test hook: "die:RANK:STEP" (the rank exits), "kill:RANK:STEP" (SIGKILL, as kill -9),
    # "hang:RANK:STEP" (the rank sleeps),
    # or "alloc:RANK:BYTES" (the rank allocates BYTES more in every measured lookup phase).
    fault: str | None = None
    scale_rows: float = 1.0  # what the plan was scaled by (recorded for the report)
    # The ranks' embedding kernels: "torch" (kernels.py), "fbgemm" (FBGEMM's TBE for the
    # pieces it serves, planner/executor/fbgemm.py) or "auto" (fbgemm where fbgemm_gpu
    # imports); `prepare` resolves auto before the ranks start.
    kernels: str = "torch"
    # Test hook: names of deliberate bugs (planner/executor/mutants.py) every rank runs with.
    mutants: tuple[str, ...] = ()


def write_job(run_dir: Path, plan: Plan, opts: RunOptions) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / JOB_FILE
    path.write_text(json.dumps({"plan": plan.model_dump(mode="json"), "options": asdict(opts)}))
    return path


def read_job(run_dir: Path) -> tuple[Plan, RunOptions]:
    body = json.loads((run_dir / JOB_FILE).read_text())
    return Plan.model_validate(body["plan"]), RunOptions(**body["options"])


def result_file(run_dir: Path, rank: int) -> Path:
    return run_dir / f"rank{rank}.json"


def tensors_file(run_dir: Path, rank: int) -> Path:
    return run_dir / f"rank{rank}.pt"


def heartbeat_file(run_dir: Path, rank: int) -> Path:
    return run_dir / f"rank{rank}.hb"


def error_file(run_dir: Path, rank: int) -> Path:
    return run_dir / f"rank{rank}.err"
