"""Input model of a DLRM's sparse part: its tables and the training settings that cost them."""

from typing import Annotated

from pydantic import Field, field_validator

from cost_models import CommPrecision
from planner.spec.table import StrictModel, TableSpec

MAX_TABLES = 100_000


class Provenance(StrictModel):
    repo: str
    path: str
    commit: str | None = None
    what: str | None = None


class ModelSpec(StrictModel):
    name: str = "model"
    description: str = ""
    provenance: list[Provenance] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    batch_size_per_gpu: Annotated[int, Field(strict=True, ge=1, le=10_000_000)]
    fwd_comm_precision: CommPrecision = CommPrecision.FP32
    bwd_comm_precision: CommPrecision = CommPrecision.FP32
    pipelined: Annotated[bool, Field(strict=True)] = False
    tables: Annotated[list[TableSpec], Field(min_length=1, max_length=MAX_TABLES)]

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
