"""One rank of the launcher test: plans with `plan_once` and writes what it got.

Run under torchrun (a gloo process group) or as a plain process (the file cache)."""

import json
import os
import sys
from pathlib import Path

from planner.launcher import plan_once


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    rank = int(os.environ.get("RANK", sys.argv[3] if len(sys.argv) > 3 else "0"))
    model = json.loads(Path("fixtures/models/criteo_kaggle.json").read_text())
    request = {"model": model, "hardware": {"preset": "h100", "hosts": 1}}
    if mode == "dist":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        got = plan_once(request)
        dist.barrier()
        dist.destroy_process_group()
    else:
        got = plan_once(request, cache_dir=out / "cache")
    (out / f"rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "hash": got.plan.plan_hash, "planned": got.planned,
         "source": got.source}))


if __name__ == "__main__":
    main()
