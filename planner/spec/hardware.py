"""Input model of the cluster: hosts, GPUs, memories, links and the cost model's constants.

Bandwidths are GB/s, 1e9 bytes per second; capacities are bytes (ByteSize: "80GiB" or an int).
"""

from typing import Annotated, Any

from pydantic import ByteSize, Field, model_validator

from cost_models import CostConstants, HardwareProfile
from planner.spec.table import StrictModel

# At least 1 MB/s: every real link is faster, and 1/bandwidth must stay finite (a subnormal
# bandwidth made every cost inf; found by the service's schemathesis run).
GBps = Annotated[float, Field(ge=1e-3, le=1e6, allow_inf_nan=False)]
Efficiency = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
Capacity = Annotated[ByteSize, Field(ge=0)]

_DEFAULT_CONSTANTS = CostConstants()


class GpuSpec(StrictModel):
    name: str
    hbm_capacity_bytes: Capacity
    hbm_reserved_bytes: Capacity = ByteSize(0)
    hbm_bandwidth_gb_per_s: GBps

    @model_validator(mode="after")
    def _reserve_below_capacity(self) -> "GpuSpec":
        if self.hbm_reserved_bytes >= self.hbm_capacity_bytes:
            raise ValueError("hbm_reserved_bytes must be smaller than hbm_capacity_bytes")
        return self


class HostSpec(StrictModel):
    ddr_capacity_bytes: Capacity
    ddr_reserved_bytes: Capacity = ByteSize(0)
    ddr_bandwidth_gb_per_s: GBps
    ssd_capacity_bytes: Capacity = ByteSize(0)
    ssd_bandwidth_gb_per_s: GBps = 1.0

    @model_validator(mode="after")
    def _reserve_below_capacity(self) -> "HostSpec":
        if self.ddr_capacity_bytes and self.ddr_reserved_bytes >= self.ddr_capacity_bytes:
            raise ValueError("ddr_reserved_bytes must be smaller than ddr_capacity_bytes")
        return self


class LinkSpec(StrictModel):
    """Per GPU, per direction."""

    nvlink_gb_per_s: GBps
    nic_gb_per_s: GBps
    pcie_gb_per_s: GBps


class ConstantsSpec(StrictModel):
    """The cost model's named constants; see cost_models.hardware.CostConstants for sources."""

    hbm_efficiency: Efficiency = _DEFAULT_CONSTANTS.hbm_efficiency
    pcie_efficiency: Efficiency = _DEFAULT_CONSTANTS.pcie_efficiency
    ddr_efficiency: Efficiency = _DEFAULT_CONSTANTS.ddr_efficiency
    ssd_efficiency: Efficiency = _DEFAULT_CONSTANTS.ssd_efficiency
    nvlink_efficiency: Efficiency = _DEFAULT_CONSTANTS.nvlink_efficiency
    nic_efficiency: Efficiency = _DEFAULT_CONSTANTS.nic_efficiency
    ssd_read_granularity_bytes: Annotated[int, Field(strict=True, ge=1, le=1 << 24)] = (
        _DEFAULT_CONSTANTS.ssd_read_granularity_bytes
    )
    id_bytes: Annotated[int, Field(strict=True, ge=1, le=16)] = _DEFAULT_CONSTANTS.id_bytes
    length_bytes: Annotated[int, Field(strict=True, ge=0, le=8)] = (
        _DEFAULT_CONSTANTS.length_bytes
    )
    cache_metadata_bytes_per_row: Annotated[int, Field(strict=True, ge=0, le=1024)] = (
        _DEFAULT_CONSTANTS.cache_metadata_bytes_per_row
    )
    piece_overhead_s: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = (
        _DEFAULT_CONSTANTS.piece_overhead_s
    )


class HardwareSpec(StrictModel):
    name: str = "custom"
    description: str = ""
    sources: list[str] = Field(default_factory=list)
    hosts: Annotated[int, Field(strict=True, ge=1, le=4096)]
    gpus_per_host: Annotated[int, Field(strict=True, ge=1, le=64)]
    gpu: GpuSpec
    host: HostSpec
    links: LinkSpec
    constants: ConstantsSpec = ConstantsSpec()

    def profile(self) -> HardwareProfile:
        """The cost model's view: bandwidths in bytes per second."""
        gb = 1e9
        return HardwareProfile(
            hosts=self.hosts,
            gpus_per_host=self.gpus_per_host,
            hbm_bytes=int(self.gpu.hbm_capacity_bytes),
            hbm_reserved_bytes=int(self.gpu.hbm_reserved_bytes),
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

    preset: str
    hosts: Annotated[int, Field(strict=True, ge=1, le=4096)] | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)
