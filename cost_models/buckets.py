"""How data-parallel gradients are grouped into all-reduce calls, as DDP's reducer does.

Torch-free on purpose: the cost model counts a plan's all-reduce calls with it
(latency.plan_allreduce_calls) and the executor makes its buckets with it (rank.py), so the
two agree on one definition.

DDP (torch 2.13, torch/nn/parallel/distributed.py and reducer.cpp) rebuilds its buckets
after the first iteration in the order gradients became ready: the first bucket holds up to
`dist._DEFAULT_FIRST_BUCKET_BYTES` (1 MiB), every later one up to `bucket_cap_mb` (25 MiB by
default); a gradient joins the open bucket, and the bucket closes once it holds at least its
limit (so a bucket may pass its limit by its last gradient, and a gradient larger than the
limit has a bucket to itself). Sizes are the parameters' bytes in their own dtype.
"""

from collections.abc import Sequence

MIB = 2**20
# DDP's default bucket_cap_mb (torch.nn.parallel.DistributedDataParallel).
ALLREDUCE_BUCKET_BYTES = 25 * MIB
# DDP's first bucket after the rebuild (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES).
ALLREDUCE_FIRST_BUCKET_BYTES = 1 * MIB


def bucket_assignment(sizes: Sequence[int], first_bytes: int = ALLREDUCE_FIRST_BUCKET_BYTES,
                      bytes_cap: int = ALLREDUCE_BUCKET_BYTES) -> list[list[int]]:
    """Buckets as lists of indices into `sizes` (gradient bytes in ready order), in the order
    they are all-reduced: one all-reduce call per bucket."""
    buckets: list[list[int]] = []
    current: list[int] = []
    held = 0
    for i, n in enumerate(sizes):
        current.append(i)
        held += n
        if held >= (first_bytes if not buckets else bytes_cap):
            buckets.append(current)
            current, held = [], 0
    if current:
        buckets.append(current)
    return buckets


def allreduce_calls(sizes: Sequence[int], first_bytes: int = ALLREDUCE_FIRST_BUCKET_BYTES,
                    bytes_cap: int = ALLREDUCE_BUCKET_BYTES) -> int:
    """How many all-reduce calls a step makes for replicas of these gradient sizes."""
    return len(bucket_assignment(sizes, first_bytes, bytes_cap))
