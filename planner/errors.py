"""The two ways a request fails without a stack trace: bad input, or no plan exists."""

from dataclasses import dataclass


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
        where = f"table '{self.table}': " if self.table else ""
        return f"{where}{self.field}: {self.message}"


@dataclass
class InfeasibleError(PlannerError):
    """No plan fits: which table, which cap, and how many bytes it is short."""

    reason: str
    table: str | None = None
    cap: str | None = None
    short_bytes: int | None = None
    exit_code = 3

    def __str__(self) -> str:
        return f"infeasible: {self.reason}"
