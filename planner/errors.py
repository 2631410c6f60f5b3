"""The ways a request fails without a stack trace: bad input; no plan exists (with a
certificate); or no plan was found within the budget (and none was proved impossible)."""

from dataclasses import dataclass, field
from typing import Any


class PlannerError(Exception):
    """Base of the errors the CLI and the service turn into a message and a status."""

    exit_code = 1


@dataclass
class BadInputError(PlannerError):
    """The request is malformed: a field, and the table it belongs to when there is one."""

    field: str
    message: str
    table: str | None = None
    exit_code = 2

    def __str__(self) -> str:
        where = f"table '{_clip(self.table)}': " if self.table else ""
        return f"{where}{self.field}: {self.message}"


def _clip(name: str, keep: int = 80) -> str:
    """A name as an error message shows it: a name too long to be valid (10,000 characters
    were echoed whole) cut to its start and its length."""
    return name if len(name) <= keep else f"{name[:keep]}... ({len(name):,} characters)"


@dataclass
class InfeasibleError(PlannerError):
    """No plan fits: which table, which cap, how many bytes it is short, and the certificate
    (planner/infeasibility.py) that anyone can recompute from the request."""

    reason: str
    table: str | None = None
    cap: str | None = None
    short_bytes: int | None = None
    certificate: dict[str, Any] | None = None
    exit_code = 3

    def __str__(self) -> str:
        return f"infeasible: {self.reason}"


@dataclass
class NoPlanFoundError(PlannerError):
    """Neither a plan nor a proof that none exists within the budget: not "infeasible"."""

    reason: str
    tried: list[str] = field(default_factory=list)
    exit_code = 5

    def __str__(self) -> str:
        return f"no plan found within the budget: {self.reason}"
