"""Input model of a DLRM's sparse part: its tables and the training settings that cost them."""

from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator

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
            "Whether the next batch's input all-to-all runs beside this batch's work, as "
            "TorchRec's sparse-dist train pipeline runs it: a GPU's step time is then "
            "communication + max(0, compute - input all-to-all) instead of compute + "
            "communication."))
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

    @field_validator("tables")
    @classmethod
    def _features(cls, tables: list[TableSpec], info: ValidationInfo) -> list[TableSpec]:
        """Feature names are unique across the model (a table without `features` is read by
        one feature named as the table, as TorchRec's keys are), and no feature's batch is
        larger than the model's."""
        batch = info.data.get("batch_size_per_gpu")
        owner: dict[str, tuple[int, str]] = {}
        for i, t in enumerate(tables):
            for j, f in enumerate(t.features or ()):
                if batch is not None and f.batch_size_per_gpu is not None \
                        and f.batch_size_per_gpu > batch:
                    raise ValueError(
                        f"tables[{i}].features[{j}].batch_size_per_gpu: feature '{f.name}' of "
                        f"table '{t.name}' has {f.batch_size_per_gpu} samples per GPU, more "
                        f"than the model's batch_size_per_gpu {batch}")
            for name in t.feature_names():
                if name in owner:
                    k, other = owner[name]
                    raise ValueError(
                        f"feature name '{name}' of table '{t.name}' (tables[{i}]) is also a "
                        f"feature of table '{other}' (tables[{k}]); feature names must be "
                        "unique across the model")
                owner[name] = (i, t.name)
        return tables
