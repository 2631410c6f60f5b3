"""Seconds per training step for one piece: its bytes (traffic.py) over effective bandwidths."""

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from cost_models import latency
from cost_models.geometry import ModelGeom, TableGeom
from cost_models.hardware import HardwareProfile
from cost_models.traffic import PieceTraffic, piece_traffic
from cost_models.types import ShardingType, Tier


@dataclass(frozen=True)
class CostBreakdown:
    """Seconds per step, by term. Adds with `+`; compute and communication sum separately so a
    pipelined step can hide the next batch's input all-to-all behind them (`total`)."""

    lookup: float = 0.0  # forward reads served from HBM, plus the per-piece overhead
    backward: float = 0.0  # backward and fused optimizer update served from HBM
    cache_miss: float = 0.0  # everything served from host DDR (PCIe) and SSD, fwd and bwd
    input_a2a: float = 0.0  # ids received
    output_a2a: float = 0.0  # pooled vectors / partial sums sent, and their gradients
    allreduce: float = 0.0  # data-parallel gradient all-reduce
    owner_a2a: float = 0.0  # the sample owners' side of the NIC beyond the pieces' (placement.py)

    def __add__(self, other: "CostBreakdown") -> "CostBreakdown":
        return CostBreakdown(
            *(getattr(self, f.name) + getattr(other, f.name) for f in fields(self))
        )

    @property
    def compute(self) -> float:
        return self.lookup + self.backward + self.cache_miss

    @property
    def comm(self) -> float:
        return self.input_a2a + self.output_a2a + self.allreduce + self.owner_a2a

    def sides(self, pipelined: bool, overlap: float) -> tuple[float, float]:
        """The two figures a GPU's pieces add up to, which `step_time` combines (`sides_of`;
        `overlap`: the profile's pipeline_overlap)."""
        return sides_of(self.compute, self.comm, self.input_a2a, pipelined, overlap)

    def total(self, pipelined: bool, overlap: float) -> float:
        """A GPU's step time (`step_time` of its `sides`)."""
        return float(step_time(*self.sides(pipelined, overlap), pipelined))


def sides_of(compute: Any, comm: Any, input_a2a: Any, pipelined: bool, overlap: float
             ) -> tuple[Any, Any]:
    """(compute, comm), or when pipelined (compute - overlap * input_a2a, comm): the two
    sides `step_time` combines (floats or arrays alike). `overlap` (the profile's
    pipeline_overlap, 0 to 1) is the share of the next batch's input all-to-all a step's
    work can hide: 1 where the exchange runs on engines of its own beside the kernels (GPU
    streams, NICs), less where the two share a core (measured by planner calibrate); at 0 a
    pipelined step costs what a sequential one does."""
    return (compute - overlap * input_a2a if pipelined else compute), comm


def step_time(x: Any, y: Any, pipelined: bool) -> Any:
    """A GPU's step time from its summed `sides` (floats or arrays alike).

    In turn: compute + comm. Pipelined, as TorchRec's sparse-dist train pipeline runs it (and
    the executor with `pipelined`): the next batch's input all-to-all runs beside this batch's
    lookups, output all-to-alls, backward and all-reduce, so the step is the longer of this
    batch's chain without it (compute + comm - input_a2a) and the links' whole load (comm:
    both batches' all-to-alls share them), i.e. comm + max(0, compute - input_a2a) =
    y + max(0, x), with only the profile's pipeline_overlap share of input_a2a hidden
    (`sides_of`). A placement's owner-side wait is comm on both: it adds to y."""
    if pipelined:
        return y + np.maximum(x, 0.0)
    return x + y


def fixed_floors(fixed: CostBreakdown, pipelined: bool, overlap: float
                 ) -> tuple[float, float]:
    """What the fixed seconds every GPU pays (`step_fixed`) add to two floors of a GPU's
    step: (on the sum of its pieces' two sides, on its pieces' comm side alone or one piece's
    own step_time). In turn the step is X + Y, so both rise by fx + fy. Pipelined it is
    Y + max(0, X), which is at least Y + X (both rise by fx + fy), but the comm side and one
    piece's y + max(0, x) rise by fx + fy only where fx <= 0 (max(0, fx + x) >= max(0, x) +
    fx needs it): a calibrated profile's phase starts can make fx positive, and then they
    rise by fy alone."""
    fx, fy = fixed.sides(pipelined, overlap)
    whole = fx + fy
    return whole, (fy + min(fx, 0.0) if pipelined else whole)


def traffic_cost(t: PieceTraffic, hw: HardwareProfile) -> CostBreakdown:
    """Divide each byte count by the effective bandwidth of the link or memory it uses.

    The data-parallel all-reduce runs at the ring's bus bandwidth (hardware.eff_allreduce_bw).
    """
    c = hw.constants
    # The device cache's share of the HBM bytes runs device_cache_*_factor times faster.
    fwd_scale = 1.0 - t.resident_fwd + t.resident_fwd / c.device_cache_fwd_factor
    bwd_scale = 1.0 - t.resident_bwd + t.resident_bwd / c.device_cache_bwd_factor
    return CostBreakdown(
        # Launch overheads: one lookup kernel forward, one update backward, per piece; the
        # per-row and per-id terms are 0 in the presets (calibration fits them).
        lookup=t.hbm_fwd * fwd_scale / hw.eff_hbm_bw + c.piece_overhead_s
        + c.cache_probe_s * t.cache_probes
        + (c.lookup_id_s * t.lookups if t.hbm_fwd > 0 else 0.0),
        backward=t.hbm_bwd * bwd_scale / (hw.eff_hbm_bw * c.backward_efficiency)
        + c.update_launch_s
        + c.update_row_s * t.updated_rows + c.backward_id_s * t.lookups,
        # Bytes, plus the fixed host-side work of a piece that touches host memory.
        cache_miss=t.host / hw.eff_host_read_bw + t.ssd / hw.eff_ssd_bw
        + (c.host_piece_overhead_s if t.host > 0 or t.ssd > 0 else 0.0)
        + (c.cache_step_s + c.cache_slot_s * t.cache_slots if t.cache_slots > 0 else 0.0),
        input_a2a=t.ids_intra / hw.eff_nvlink_bw + t.ids_inter / hw.eff_nic_bw,
        output_a2a=(t.out_fwd_intra + t.out_bwd_intra) / hw.eff_nvlink_bw
        + (t.out_fwd_inter + t.out_bwd_inter) / hw.eff_nic_bw,
        allreduce=t.allreduce / hw.eff_allreduce_bw
        + latency.allreduce_latency_s(hw, t.allreduce_calls)
        + (c.allreduce_table_hop_s * 2 * (hw.world_size - 1) if t.allreduce_calls > 0
           else 0.0),
    )


def step_fixed(hw: HardwareProfile) -> CostBreakdown:
    """Seconds every GPU pays per step whatever it holds: the all-to-all calls' latency
    (latency.py) and its compute phases' start after them (lookup_start_s,
    backward_start_s). The partitioner's loads start from it (LoadState), the bound counts
    it."""
    inp, out = latency.step_a2a_s(hw)
    c = hw.constants
    return CostBreakdown(input_a2a=inp, output_a2a=out, lookup=c.lookup_start_s,
                         backward=c.backward_start_s)


def piece_cost(
    table: TableGeom,
    kind: ShardingType,
    tier: Tier,
    cache_ratio: float,
    piece_rows: int,
    piece_cols: int,
    hw: HardwareProfile,
    model: ModelGeom,
) -> CostBreakdown:
    """Seconds per step one piece adds to its GPU."""
    traffic = piece_traffic(table, kind, tier, cache_ratio, piece_rows, piece_cols, hw, model)
    return traffic_cost(traffic, hw)
