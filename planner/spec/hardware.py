"""Input model of the cluster: hosts, GPUs, memories, links and the cost model's constants.

Bandwidths are GB/s, 1e9 bytes per second; capacities are bytes (ByteSize: "80GiB" or an int).
"""

import math
from fractions import Fraction
from typing import Annotated, Any

from pydantic import (
    BeforeValidator,
    ByteSize,
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from cost_models import CostConstants, HardwareProfile
from planner.spec.table import StrictModel, drop_absent

# At least 1 MB/s: every real link is faster, and 1/bandwidth must stay finite (a subnormal
# bandwidth made every cost inf; found by the service's schemathesis run).
GBps = Annotated[float, Field(strict=True, ge=1e-3, le=1e6, allow_inf_nan=False)]
# At least 1e-6 (as `planner calibrate` clamps its fits): a subnormal share overflowed the
# cost model's sums and divisions into tracebacks.
Efficiency = Annotated[float, Field(strict=True, ge=1e-6, le=1.0, allow_inf_nan=False)]


def _byte_count(v: Any) -> Any:
    """What ByteSize takes, or a message saying what is wrong (its own for -1, 1e999, 4.7e9+
    0.1 or null was "could not parse value and unit from byte string")."""
    if isinstance(v, str):
        return v
    if v is None or isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError("a number of bytes or a string such as '80GiB' is required")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError("must be a finite number of bytes")
    if v < 0:
        raise ValueError("must be at least 0 bytes")
    if isinstance(v, float) and not v.is_integer():
        raise ValueError("must be a whole number of bytes")
    return v


Capacity = Annotated[ByteSize, BeforeValidator(_byte_count), Field(ge=0)]
Seconds = Annotated[float, Field(strict=True, ge=0.0, le=1.0, allow_inf_nan=False)]
# How many times faster a device cache serves reads than the memory behind it.
CacheFactor = Annotated[float, Field(strict=True, ge=1.0, le=1e4, allow_inf_nan=False)]
Share = Annotated[float, Field(strict=True, ge=0.0, le=1.0, allow_inf_nan=False)]

_DEFAULT_CONSTANTS = CostConstants()


class GpuSpec(StrictModel):
    name: str = Field(description="GPU model name (informational).")
    hbm_capacity_bytes: Capacity = Field(
        description=(
            'HBM per GPU, in bytes (an integer, or a size such as "80GiB" or "80GB").'))
    hbm_reserved_bytes: Capacity = Field(
        ByteSize(0), description=(
            "HBM per GPU kept for the dense model, activations and the framework, in bytes; "
            "the embeddings and their step buffers may use the rest."))
    # The reservation as a share of the capacity, as TorchRec's HeuristicalStorageReservation
    # takes it (its `percentage` is this fraction). Left out of the JSON when absent, so
    # requests and plans written before it keep their hashes.
    hbm_reserved_fraction: Annotated[
        float, Field(strict=True, ge=0.0, lt=1.0, allow_inf_nan=False)] | None = Field(
        None, description=(
            "HBM per GPU kept for the dense model, activations and the framework, as a "
            "fraction of hbm_capacity_bytes in [0, 1) (0.15: 15%), as TorchRec's "
            "HeuristicalStorageReservation(percentage) takes it; the bytes reserved are the "
            "fraction of the capacity rounded up to a whole byte. Instead of "
            "hbm_reserved_bytes: give one or the other."))
    hbm_bandwidth_gb_per_s: GBps = Field(
        description=(
            "Peak HBM bandwidth per GPU, in GB/s (1e9 bytes per second)."))

    @field_validator("hbm_reserved_fraction")
    @classmethod
    def _one_reservation(cls, fraction: float | None, info: ValidationInfo) -> float | None:
        if fraction is not None and info.data.get("hbm_reserved_bytes"):
            raise ValueError("give either hbm_reserved_fraction or hbm_reserved_bytes, not both "
                             f"(hbm_reserved_bytes is {int(info.data['hbm_reserved_bytes'])})")
        return fraction

    @model_validator(mode="after")
    def _reserve_below_capacity(self) -> "GpuSpec":
        if self.hbm_reserved() >= self.hbm_capacity_bytes:
            if self.hbm_reserved_fraction is None:
                raise ValueError("hbm_reserved_bytes must be smaller than hbm_capacity_bytes")
            raise ValueError(f"hbm_reserved_fraction {self.hbm_reserved_fraction:g} of "
                             f"hbm_capacity_bytes {int(self.hbm_capacity_bytes)} leaves no HBM: "
                             "the reservation must be smaller than hbm_capacity_bytes")
        return self

    @model_serializer(mode="wrap")
    def _drop_absent_fraction(self, handler: SerializerFunctionWrapHandler) -> Any:
        return drop_absent(handler(self), ("hbm_reserved_fraction",))

    def hbm_reserved(self) -> int:
        """The HBM reservation per GPU in bytes, however it was given: the one place a
        fraction becomes bytes (exactly: the fraction of the capacity, rounded up, as
        TorchRec leaves int((1 - fraction) * capacity) to the embeddings)."""
        if self.hbm_reserved_fraction is None:
            return int(self.hbm_reserved_bytes)
        return math.ceil(Fraction(self.hbm_reserved_fraction) * int(self.hbm_capacity_bytes))


class HostSpec(StrictModel):
    ddr_capacity_bytes: Capacity = Field(description="Host DDR memory per host, in bytes.")
    ddr_reserved_bytes: Capacity = Field(
        ByteSize(0), description=(
            "DDR per host kept for other uses, in bytes."))
    ddr_bandwidth_gb_per_s: GBps = Field(
        description=(
            "Host DDR bandwidth per host, in GB/s; each GPU gets 1/gpus_per_host of it."))
    ssd_capacity_bytes: Capacity = Field(
        ByteSize(0), description=(
            "SSD capacity per host, in bytes (0: no SSD tier)."))
    ssd_bandwidth_gb_per_s: GBps = Field(
        1.0, description=(
            "SSD read bandwidth per host, in GB/s; each GPU gets 1/gpus_per_host of it."))

    @model_validator(mode="after")
    def _reserve_below_capacity(self) -> "HostSpec":
        if self.ddr_capacity_bytes and self.ddr_reserved_bytes >= self.ddr_capacity_bytes:
            raise ValueError("ddr_reserved_bytes must be smaller than ddr_capacity_bytes")
        return self


class LinkSpec(StrictModel):
    """Per GPU, per direction."""

    nvlink_gb_per_s: GBps = Field(
        description=(
            "GPU-to-GPU bandwidth inside a host (NVLink), per GPU and direction, in GB/s."))
    nic_gb_per_s: GBps = Field(
        description=(
            "Inter-host network bandwidth of each GPU's NIC, per direction, in GB/s."))
    pcie_gb_per_s: GBps = Field(
        description=(
            "Host-to-GPU bandwidth (PCIe) per GPU and direction, in GB/s."))


class ConstantsSpec(StrictModel):
    """The cost model's named constants; see cost_models.hardware.CostConstants for sources."""

    hbm_efficiency: Efficiency = Field(
        _DEFAULT_CONSTANTS.hbm_efficiency, description=(
            "Share of peak HBM bandwidth the embedding lookup kernels reach on random rows (a"
            " fraction in (0, 1])."))
    pcie_efficiency: Efficiency = Field(
        _DEFAULT_CONSTANTS.pcie_efficiency, description=(
            "Share of PCIe bandwidth that reads of host-resident rows reach (a fraction in "
            "(0, 1])."))
    ddr_efficiency: Efficiency = Field(
        _DEFAULT_CONSTANTS.ddr_efficiency, description=(
            "Share of host DDR bandwidth that random row reads reach (a fraction in (0, 1])."))
    ssd_efficiency: Efficiency = Field(
        _DEFAULT_CONSTANTS.ssd_efficiency, description=(
            "Share of the SSD's read bandwidth that random page reads reach (a fraction in "
            "(0, 1])."))
    nvlink_efficiency: Efficiency = Field(
        _DEFAULT_CONSTANTS.nvlink_efficiency, description=(
            "Share of NVLink bandwidth an all-to-all reaches (a fraction in (0, 1])."))
    nic_efficiency: Efficiency = Field(
        _DEFAULT_CONSTANTS.nic_efficiency, description=(
            "Share of NIC bandwidth an all-to-all reaches (a fraction in (0, 1])."))
    ssd_read_granularity_bytes: Annotated[int, Field(strict=True, ge=1, le=1 << 24)] = Field(
        _DEFAULT_CONSTANTS.ssd_read_granularity_bytes, description=(
            "Least bytes the SSD reads (and writes) per missed row: one page, in bytes."))
    id_bytes: Annotated[int, Field(strict=True, ge=1, le=16)] = Field(
        _DEFAULT_CONSTANTS.id_bytes, description=(
            "Bytes per sparse id in the input all-to-all (8: int64)."))
    length_bytes: Annotated[int, Field(strict=True, ge=0, le=8)] = Field(
        _DEFAULT_CONSTANTS.length_bytes, description=(
            "Bytes per bag length in the input all-to-all, one per sample and piece (4: "
            "int32)."))
    cache_metadata_bytes_per_row: Annotated[int, Field(strict=True, ge=0, le=1024)] = Field(
        _DEFAULT_CONSTANTS.cache_metadata_bytes_per_row, description=(
            "Bytes of bookkeeping per cache slot (the cached row's index and its LRU/LFU "
            "stamp), in bytes."))
    piece_overhead_s: Seconds = Field(
        _DEFAULT_CONSTANTS.piece_overhead_s, description=(
            "Fixed time each piece adds to its GPU per step (its forward lookup kernel's "
            "launch), in seconds."))
    update_launch_s: Seconds = Field(
        _DEFAULT_CONSTANTS.update_launch_s, description=(
            "Launch overhead of each piece's backward update (unique ids, row gradients, "
            "optimizer) per step, in seconds."))
    backward_efficiency: Efficiency = Field(
        _DEFAULT_CONSTANTS.backward_efficiency, description=(
            "Share of the lookups' effective HBM bandwidth the backward and its fused "
            "optimizer update reach (a fraction in (0, 1])."))
    a2a_call_latency_s: Seconds = Field(
        _DEFAULT_CONSTANTS.a2a_call_latency_s, description=(
            "Latency of one all-to-all call (alpha), paid by every GPU per call, in seconds."))
    a2a_peer_latency_s: Seconds = Field(
        _DEFAULT_CONSTANTS.a2a_peer_latency_s, description=(
            "Latency an all-to-all call adds per peer (W - 1 peers), in seconds."))
    allreduce_call_latency_s: Seconds = Field(
        _DEFAULT_CONSTANTS.allreduce_call_latency_s, description=(
            "Latency of one all-reduce call (one gradient bucket), in seconds."))
    allreduce_hop_latency_s: Seconds = Field(
        _DEFAULT_CONSTANTS.allreduce_hop_latency_s, description=(
            "Latency of one hop of a ring all-reduce (2 (W - 1) hops a call), in seconds."))
    allreduce_table_hop_s: Seconds = Field(
        _DEFAULT_CONSTANTS.allreduce_table_hop_s, description=(
            "Time per ring hop of each data-parallel table beside the call's latency (its "
            "chunk encoded, decoded and added apart), in seconds (0: none; planner calibrate "
            "fits it)."))
    allreduce_bucket_bytes: Annotated[int, Field(strict=True, ge=1, le=1 << 40)] = Field(
        _DEFAULT_CONSTANTS.allreduce_bucket_bytes, description=(
            "Largest data-parallel gradient bucket all-reduced in one call (DDP's "
            "bucket_cap_mb), in bytes."))
    host_piece_overhead_s: Seconds = Field(
        _DEFAULT_CONSTANTS.host_piece_overhead_s, description=(
            "Fixed time per step of each piece whose rows live in host memory (ddr, "
            "hbm_cache, ssd tiers), charged to cache_miss beside its bytes: its host-side "
            "gathers, scatters and cache upkeep, in seconds (0: bytes only; planner "
            "calibrate fits it)."))
    update_row_s: Seconds = Field(
        _DEFAULT_CONSTANTS.update_row_s, description=(
            "Backward time per row the update reads and writes (a piece's distinct rows of "
            "the batch, a replica's every row), beside its bytes, in seconds (0: bytes "
            "only; planner calibrate fits it)."))
    backward_id_s: Seconds = Field(
        _DEFAULT_CONSTANTS.backward_id_s, description=(
            "Backward time per id looked up (sorting the ids, routing each gradient to its "
            "row), beside its bytes, in seconds (0: bytes only; planner calibrate fits it)."))
    lookup_id_s: Seconds = Field(
        _DEFAULT_CONSTANTS.lookup_id_s, description=(
            "Lookup time per id a piece serves from HBM (hbm, hbm_cache), beside its bytes "
            "(a random row access each), in seconds (0: bytes only; planner calibrate fits "
            "it)."))
    device_cache_bytes: Annotated[int, Field(strict=True, ge=0, le=1 << 40)] = Field(
        _DEFAULT_CONSTANTS.device_cache_bytes, description=(
            "A device's own cache (a CPU's or GPU's L2): an hbm piece whose rows fit is read "
            "from it, the share of its rows that fit, in bytes (0: no such term; planner "
            "calibrate picks it among the machine's cache levels)."))
    device_cache_fwd_factor: CacheFactor = Field(
        _DEFAULT_CONSTANTS.device_cache_fwd_factor, description=(
            "How many times faster than HBM the device cache serves a lookup's row reads "
            "(1: as fast; planner calibrate fits it)."))
    device_cache_bwd_factor: CacheFactor = Field(
        _DEFAULT_CONSTANTS.device_cache_bwd_factor, description=(
            "How many times faster than HBM the device cache serves the backward's row reads "
            "and writes (1: as fast; planner calibrate fits it)."))
    cache_probe_s: Seconds = Field(
        _DEFAULT_CONSTANTS.cache_probe_s, description=(
            "Lookup time per id of an hbm_cache piece: finding it among the cached rows "
            "and counting it, in seconds (0: bytes only; planner calibrate fits it)."))
    cache_step_s: Seconds = Field(
        _DEFAULT_CONSTANTS.cache_step_s, description=(
            "Fixed cache upkeep per step of each cached piece (hbm_cache, ssd), charged to "
            "cache_miss, in seconds (0: none; planner calibrate fits it)."))
    cache_slot_s: Seconds = Field(
        _DEFAULT_CONSTANTS.cache_slot_s, description=(
            "Cache upkeep per cache slot per step, charged to cache_miss (the executor "
            "re-ranks its held rows once a batch), in seconds (0: none; planner calibrate "
            "fits it)."))
    lookup_start_s: Seconds = Field(
        _DEFAULT_CONSTANTS.lookup_start_s, description=(
            "Extra time of a GPU's first lookup of a step, which follows an all-to-all; "
            "once per GPU and step, in seconds (0: none; planner calibrate fits it)."))
    backward_start_s: Seconds = Field(
        _DEFAULT_CONSTANTS.backward_start_s, description=(
            "Extra time of a GPU's first backward update of a step, which follows an "
            "all-to-all; once per GPU and step, in seconds (0: none; planner calibrate fits "
            "it)."))
    pipeline_overlap: Share = Field(
        _DEFAULT_CONSTANTS.pipeline_overlap, description=(
            "Share of the next batch's input all-to-all a pipelined step's work hides (1: "
            "all of it, the exchange on engines of its own beside the kernels; 0: none, a "
            "pipelined step costs a sequential one's; planner calibrate measures it)."))

    @model_serializer(mode="wrap")
    def _drop_unset_new_constants(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Constants added after plans were hashed are left out of the JSON at their default
        (0: no term), so a request that does not set them hashes as before."""
        data = drop_absent(handler(self), ("host_piece_overhead_s", "update_row_s",
                                           "backward_id_s", "lookup_id_s", "cache_probe_s",
                                           "cache_step_s", "cache_slot_s",
                                           "allreduce_table_hop_s", "device_cache_bytes",
                                           "lookup_start_s", "backward_start_s"),
                           absent=0.0)
        return drop_absent(data, ("device_cache_fwd_factor", "device_cache_bwd_factor",
                                  "pipeline_overlap"), absent=1.0)


class HardwareSpec(StrictModel):
    name: str = Field("custom", description="Hardware name (informational).")
    description: str = Field("", description="Free text (informational).")
    sources: list[str] = Field(
        default_factory=list, description=(
            "Where the numbers come from (informational)."))
    hosts: Annotated[int, Field(strict=True, ge=1, le=4096)] = Field(description="Number of hosts.")
    gpus_per_host: Annotated[int, Field(strict=True, ge=1, le=64)] = Field(
        description=(
            "GPUs per host."))
    gpu: GpuSpec = Field(description="Each GPU (all are identical).")
    host: HostSpec = Field(description="Each host's memories (all hosts are identical).")
    links: LinkSpec = Field(
        description=(
            "Bandwidths of the links between GPUs, hosts and host memory."))
    constants: ConstantsSpec = Field(
        ConstantsSpec(), description=(
            "The cost model's named constants (defaults and their sources: "
            "cost_models/hardware.py, CostConstants)."))

    def profile(self) -> HardwareProfile:
        """The cost model's view: bandwidths in bytes per second, the HBM reservation in
        bytes (a fraction resolved here, GpuSpec.hbm_reserved): every consumer's view."""
        gb = 1e9
        return HardwareProfile(
            hosts=self.hosts,
            gpus_per_host=self.gpus_per_host,
            hbm_bytes=int(self.gpu.hbm_capacity_bytes),
            hbm_reserved_bytes=self.gpu.hbm_reserved(),
            hbm_bw=self.gpu.hbm_bandwidth_gb_per_s * gb,
            ddr_bytes=int(self.host.ddr_capacity_bytes),
            ddr_reserved_bytes=int(self.host.ddr_reserved_bytes),
            ddr_bw=self.host.ddr_bandwidth_gb_per_s * gb,
            ssd_bytes=int(self.host.ssd_capacity_bytes),
            ssd_bw=self.host.ssd_bandwidth_gb_per_s * gb,
            nvlink_bw=self.links.nvlink_gb_per_s * gb,
            nic_bw=self.links.nic_gb_per_s * gb,
            pcie_bw=self.links.pcie_gb_per_s * gb,
            constants=CostConstants(**self.constants.model_dump()),
        )


class HardwareRef(StrictModel):
    """A named preset, a host count, and overrides of any preset field (merged deeply)."""

    preset: str = Field(
        description=(
            "Name of a bundled hardware preset (`planner presets` lists them, e.g. h100, "
            "h200, zionex_a100)."))
    hosts: Annotated[int, Field(strict=True, ge=1, le=4096)] | None = Field(
        None, description=(
            "Number of hosts (default: the preset's)."))
    overrides: dict[str, Any] = Field(
        default_factory=dict, description=(
            "Preset fields to replace, as a nested object merged deeply into the preset, e.g."
            ' {"gpu": {"hbm_reserved_bytes": "16GiB"}}.'))
