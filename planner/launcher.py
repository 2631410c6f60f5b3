"""Plan once per training job, not once per rank.

A job of 1,024 ranks that calls `plan()` on every rank plans 1,024 times (minutes of CPU on
every host) and, should two ranks ever disagree, shards the model two ways. `plan_once`
gives every rank the same plan from one planning run:

- inside a torch.distributed process group: rank 0 plans and broadcasts the plan's JSON
  (its bytes and hash travel together; every rank checks the hash it received);
- with no process group (before `init_process_group`, or several jobs on one machine): a
  file-locked on-disk cache keyed by the resolved request's hash; the first process to take
  the lock plans and writes the plan, the others wait on the lock and read it.

Either way the caller learns whether this process ran the planner (`LaunchedPlan.planned`),
so a launcher can log it and a test can count it.
"""

import fcntl
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.hashing import content_hash, plan_hash_of
from planner.plan_model import Plan
from planner.planning import plan, resolve
from planner.spec import PlanRequest

log = logging.getLogger("planner.launcher")


@dataclass(frozen=True)
class LaunchedPlan:
    plan: Plan
    planned: bool  # this process ran the planner (False: it received or read the plan)
    source: str  # "broadcast from rank 0", "cache <path>" or "planned here"


def request_key(request: PlanRequest | dict[str, Any]) -> str:
    """The resolved request's content hash (presets expanded): what a cache entry is for."""
    return content_hash(resolve(request))


def _checked(text: str, where: str) -> Plan:
    got = Plan.model_validate_json(text)
    if plan_hash_of(got.model_dump(mode="json")) != got.plan_hash:
        raise ValueError(f"the plan from {where} does not match its own hash")
    return got


def plan_once(request: PlanRequest | dict[str, Any], cache_dir: Path | str | None = None,
              group: Any = None) -> LaunchedPlan:
    """Every rank of a job gets the same plan, planned by one process (see the module doc).

    With torch.distributed initialized (and `group` its default or a given group), rank 0
    of the group plans; otherwise `cache_dir` (default: $PLANNER_PLAN_CACHE or the system's
    temporary directory) holds the plan under the request's hash. An error on the planning
    rank (bad input, infeasible) is raised on every rank, with the same message.
    """
    dist = _dist()
    if dist is not None and dist.is_initialized():
        return _broadcast(request, dist, group)
    root = Path(cache_dir or os.environ.get("PLANNER_PLAN_CACHE")
                or Path(tempfile.gettempdir()) / "planner-plans")
    return _cached(request, root)


def _dist() -> Any:
    try:
        import torch.distributed as dist
    except ImportError:  # no torch: only the file cache
        return None
    return dist if dist.is_available() else None


def _broadcast(request: PlanRequest | dict[str, Any], dist: Any, group: Any) -> LaunchedPlan:
    src = dist.get_global_rank(group, 0) if group is not None else 0
    box: list[Any] = [None]
    if dist.get_rank() == src:
        try:
            made = plan(request)
            box[0] = ("plan", made.model_dump_json())
        except Exception as exc:  # the same error on every rank, never a hang
            box[0] = ("error", f"{type(exc).__name__}: {exc}")
            dist.broadcast_object_list(box, src=src, group=group)
            raise
        dist.broadcast_object_list(box, src=src, group=group)
        log.info("planned on rank %d and broadcast %s", src, made.plan_hash)
        return LaunchedPlan(made, True, "planned here")
    dist.broadcast_object_list(box, src=src, group=group)
    kind, text = box[0]
    if kind == "error":
        raise RuntimeError(f"planning on rank {src} failed: {text}")
    return LaunchedPlan(_checked(text, f"rank {src}"), False, f"broadcast from rank {src}")


def _cached(request: PlanRequest | dict[str, Any], root: Path) -> LaunchedPlan:
    root.mkdir(parents=True, exist_ok=True)
    key = request_key(request).removeprefix("sha256:")
    path = root / f"{key}.json"
    with open(root / f"{key}.lock", "w") as lock:
        # One planner per request at a time: the others block here, then read its result.
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if path.exists():
                return LaunchedPlan(_checked(path.read_text(), str(path)), False,
                                    f"cache {path}")
            made = plan(request)
            # Written whole or not at all: a reader never sees half a plan.
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(made.model_dump_json())
            os.replace(tmp, path)
            log.info("planned %s into %s", made.plan_hash, path)
            return LaunchedPlan(made, True, "planned here")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
