"""Input model of a DLRM's sparse part: its tables and the training settings that cost them."""

from typing import Annotated

from pydantic import Field, field_validator

from cost_models import CommPrecision
from planner.spec.table import StrictModel, TableSpec

MAX_TABLES = 100_000


class Provenance(StrictModel):
    repo: str = Field(description="Repository the numbers come from (owner/name).")
    path: str = Field(description="File in that repository.")
    commit: str | None = Field(None, description="Commit the file was read at.")
    what: str | None = Field(None, description="What was taken from the file.")


class ModelSpec(StrictModel):
    name: str = Field("model", description="Model name (informational).")
    description: str = Field("", description="Free text (informational).")
    provenance: list[Provenance] = Field(
        default_factory=list, description=(
            "Where the model's numbers come from (informational)."))
    notes: list[str] = Field(
        default_factory=list, description=(
            "Assumptions behind the numbers (informational)."))
    batch_size_per_gpu: Annotated[int, Field(strict=True, ge=1, le=10_000_000)] = Field(
        description=(
            "Training samples per GPU per step (samples); the global batch is this times the "
            "number of GPUs."))
    fwd_comm_precision: CommPrecision = Field(
        CommPrecision.FP32, description=(
            "Precision of the forward output all-to-all (pooled embeddings): fp32 4 bytes per"
            " element, fp16 or bf16 2, fp8 or int8 1 plus a 4-byte scale per vector."))
    bwd_comm_precision: CommPrecision = Field(
        CommPrecision.FP32, description=(
            "Precision of the backward all-to-all (gradients of the pooled embeddings) and of"
            " a data-parallel table's gradient all-reduce; bytes as for fwd_comm_precision."))
    pipelined: Annotated[bool, Field(strict=True)] = Field(
        False, description=(
            "Whether lookups and communication overlap: a GPU's step time is then "
            "max(compute, communication) instead of their sum."))
    tables: Annotated[list[TableSpec], Field(min_length=1, max_length=MAX_TABLES)] = Field(
        description=(
            "The embedding tables, with unique names."))

    @field_validator("tables")
    @classmethod
    def _unique_names(cls, tables: list[TableSpec]) -> list[TableSpec]:
        seen: dict[str, int] = {}
        for i, t in enumerate(tables):
            if t.name in seen:
                raise ValueError(
                    f"duplicate table name '{t.name}' (tables[{seen[t.name]}] and tables[{i}])"
                )
            seen[t.name] = i
        return tables
