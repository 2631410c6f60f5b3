"""Latency terms: what a step pays per call, per peer and per kernel, beyond bytes/bandwidth.

The alpha-beta form: a collective costs `call + per_peer * peers + bytes / bandwidth`. The
bandwidth part is cost.py's; this module adds the rest, where the executor pays it
(planner/executor/rank.py, comm.py):

- all-to-all: every rank takes part in every call of a step, whatever it holds: the input
  all-to-all is two calls (bag lengths, then ids), the output all-to-all two per direction
  (the flat stage, then the host stage, which the executor always runs). Each call costs
  `a2a_call_latency_s + a2a_peer_latency_s * (W - 1)`. These are the same on every GPU, so
  they are a per-GPU constant (`cost.step_fixed`), which the partitioner's loads start from.
- all-reduce: data-parallel gradients are all-reduced in buckets of at most
  `allreduce_bucket_bytes` (DDP's bucket_cap_mb; the executor packs them the same way,
  cost_models/buckets.py), each call a ring of 2 (W - 1) hops costing
  `allreduce_call_latency_s + 2 (W - 1) allreduce_hop_latency_s`. A replica is charged its
  share, bytes / bucket calls, so the term adds per piece like every other (all replicas sit
  on every GPU, so every GPU pays the same). That is its marginal cost in a training job:
  TorchRec's DMP puts data-parallel tables in DDP beside the dense model's parameters, whose
  buckets are all-reduced anyway, so replicas add calls only as their bytes add buckets. A
  run with no dense part (the executor) makes whole calls for the replicas alone:
  `whole_calls_s` is what it pays beyond the shares (of either sign: one large replica is one
  call however many buckets its bytes would fill), which its prediction adds
  (planner/executor/predict.py).
- kernels: each piece runs one lookup kernel forward (`piece_overhead_s`) and one update
  (unique, row gradients, optimizer) backward (`update_launch_s`).
"""

from collections.abc import Sequence

from cost_models.buckets import ALLREDUCE_FIRST_BUCKET_BYTES
from cost_models.buckets import allreduce_calls as bucket_count
from cost_models.hardware import HardwareProfile

# Calls per training step, as the executor makes them (rank.py).
INPUT_A2A_CALLS = 2  # bag lengths, ids
OUTPUT_A2A_CALLS = 4  # forward flat + host stage, backward host + flat stage


def a2a_call_s(hw: HardwareProfile) -> float:
    """Seconds of latency one all-to-all call costs each GPU (W - 1 peers)."""
    c = hw.constants
    return c.a2a_call_latency_s + c.a2a_peer_latency_s * (hw.world_size - 1)


def step_a2a_s(hw: HardwareProfile) -> tuple[float, float]:
    """(input, output) all-to-all latency every GPU pays each step whatever the placement
    (none on one GPU, where nothing is exchanged); cost.step_fixed as a CostBreakdown."""
    if hw.world_size < 2:
        return 0.0, 0.0
    call = a2a_call_s(hw)
    return INPUT_A2A_CALLS * call, OUTPUT_A2A_CALLS * call


def allreduce_calls(grad_bytes: float, bucket_bytes: int) -> float:
    """A replica's share of the plan's bucketed all-reduce calls: its gradient's bytes over
    the bucket's (module docstring)."""
    return grad_bytes / bucket_bytes


def whole_calls_s(hw: HardwareProfile, grad_bytes: Sequence[float],
                  param_bytes: Sequence[int]) -> float:
    """Latency of the whole calls DDP makes for replicas alone (`param_bytes` in their
    dtype, in ready order: the last table first; DDP's buckets, buckets.py) less that of the
    shares their pieces were charged (`grad_bytes` as traffic.py counts them)."""
    if not param_bytes:
        return 0.0
    cap = hw.constants.allreduce_bucket_bytes
    made = bucket_count(param_bytes, min(ALLREDUCE_FIRST_BUCKET_BYTES, cap), cap)
    charged = sum(allreduce_calls(n, cap) for n in grad_bytes)
    return allreduce_latency_s(hw, made) - allreduce_latency_s(hw, charged)


def allreduce_latency_s(hw: HardwareProfile, calls: float) -> float:
    """Latency of `calls` ring all-reduces over the world: each 2 (W - 1) hops."""
    w = hw.world_size
    if w < 2 or calls <= 0:
        return 0.0
    c = hw.constants
    return calls * (c.allreduce_call_latency_s + 2 * (w - 1) * c.allreduce_hop_latency_s)
