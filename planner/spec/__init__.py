"""Input models (pydantic v2) of the planner: tables, model, hardware, request."""

from planner.spec.hardware import GpuSpec, HardwareRef, HardwareSpec, HostSpec, LinkSpec
from planner.spec.model import ModelSpec, Provenance
from planner.spec.request import PlanOptions, PlanRequest, ResolvedRequest
from planner.spec.table import FeatureSpec, TableConstraints, TableSpec

__all__ = [
    "FeatureSpec",
    "GpuSpec",
    "HardwareRef",
    "HardwareSpec",
    "HostSpec",
    "LinkSpec",
    "ModelSpec",
    "PlanOptions",
    "PlanRequest",
    "Provenance",
    "ResolvedRequest",
    "TableConstraints",
    "TableSpec",
]
