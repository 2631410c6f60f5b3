"""The request `planner.plan()` takes: a model, the hardware (a preset or a full spec), options."""

from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    model_serializer,
)
from pydantic_core import PydanticCustomError

from planner.errors import BadInputError
from planner.spec.hardware import HardwareRef, HardwareSpec
from planner.spec.model import ModelSpec
from planner.spec.table import StrictModel, drop_absent


def _hardware_kind(value: Any) -> str:
    if isinstance(value, HardwareRef):
        return "preset"
    if isinstance(value, dict) and "preset" in value:
        return "preset"
    return "spec"


HardwareInput = Annotated[
    Annotated[HardwareRef, Tag("preset")] | Annotated[HardwareSpec, Tag("spec")],
    Discriminator(_hardware_kind),
]


def _fixture_enum(schema: dict[str, Any]) -> None:
    from planner.presets import fixture_names  # planner.presets imports this package

    schema["enum"] = fixture_names()


def _named_fixture(value: Any) -> Any:
    """A bundled model fixture's name stands for that fixture's model spec; anything else is
    validated as a model spec. The service and `planner.plan()` read `"model": NAME` here,
    the CLI's `planner plan NAME` through the same planner.presets functions, so all three
    accept (and refuse) the same names in the same words."""
    if not isinstance(value, str):
        return value
    from planner.presets import fixture_model

    try:
        return fixture_model(value)
    except BadInputError as exc:
        raise PydanticCustomError("unknown_fixture", "{reason}", {"reason": exc.message}) from None


FixtureName = Annotated[str, Field(
    json_schema_extra=_fixture_enum,
    description="The name of a bundled model fixture (GET /v1/presets and `planner presets` "
                "list them), standing for its model spec.")]
# A model spec, or a bundled fixture's name (expanded to its spec when validated, so what a
# request resolves to, its hash and its plan are the same either way).
ModelInput = Annotated[ModelSpec, BeforeValidator(_named_fixture,
                                                  json_schema_input_type=ModelSpec | FixtureName)]
_MODEL_DESCRIPTION = ("The model's sparse part: its tables and training settings; or the name "
                      'of a bundled model fixture (e.g. "criteo_kaggle") standing for its spec.')


class PlanOptions(StrictModel):
    solver: Literal["auto", "greedy", "ilp"] = Field(
        "auto", description=(
            "auto: the heuristic, then, when the plan is more than 1% above the lower bound, "
            "CP-SAT (when its model is small enough) and ruin and recreate; greedy: the "
            "heuristic only; ilp: the heuristic, then CP-SAT always and ruin and recreate."))
    # The search's budget in deterministic seconds (CP-SAT's work counters, ruin and
    # recreate's charged placements; about a second each on one core), so the same request
    # gives the same plan whatever the machine's load.
    time_limit_s: Annotated[float, Field(strict=True, gt=0.0, le=3600.0,
                                         allow_inf_nan=False)] = Field(
        2.0, description=(
            "The search's budget after the heuristic in deterministic seconds (CP-SAT's work "
            "counters and ruin and recreate's charged placements, about one second each on "
            "one core), so the plan does not depend on the machine or its load."))
    seed: Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)] = Field(
        0, description=(
            "CP-SAT's and ruin and recreate's random seed; the same request and seed give "
            "the same plan."))
    estimator: Literal["analytic", "torchrec"] = Field(
        "analytic", description=(
            "What prices a piece, for the search, the plan's figures, the checker and the "
            "executor's prediction: analytic (our cost model over the hardware profile, a "
            "preset or a `planner calibrate` profile) or torchrec (TorchRec's "
            "EmbeddingPerfEstimator over the same hardware, as its own planner prices "
            "shards; needs torchrec installed)."))

    @model_serializer(mode="wrap")
    def _drop_default_estimator(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Left out of the JSON when analytic, so requests that do not set it hash as
        before the field existed."""
        return drop_absent(handler(self), ("estimator",), absent="analytic")


class PlanRequest(StrictModel):
    model: ModelInput = Field(description=_MODEL_DESCRIPTION)
    hardware: HardwareInput = Field(
        description=(
            'The cluster: a preset reference ({"preset": NAME, "hosts": N, "overrides": '
            "{...}}) or a full hardware spec."))
    options: PlanOptions = Field(PlanOptions(), description="How the planner searches.")


class ResolvedRequest(StrictModel):
    """A request with its hardware preset expanded: what a plan records and is checked against."""

    model: ModelInput = Field(description=_MODEL_DESCRIPTION)
    hardware: HardwareSpec = Field(
        description=(
            "The full hardware spec (a preset reference expanded)."))
    options: PlanOptions = Field(PlanOptions(), description="How the planner searches.")
