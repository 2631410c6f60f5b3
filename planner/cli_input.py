"""Reading the CLI's inputs: a file, '-' for stdin, or a bundled model fixture's name."""

import json
import sys
from pathlib import Path
from typing import Any

from planner.errors import BadInputError


def read_input(path: str, what: str) -> str:
    """The text at `path`; for a model, a bundled fixture's name works too."""
    if path == "-":
        return sys.stdin.read()
    p = Path(path)
    if p.is_file():
        return p.read_text()
    if what == "model":
        from planner.presets import fixture_names, fixture_text

        if path in fixture_names():
            return fixture_text(path)
    raise BadInputError(what, f"no such file: {path}")


def load_json(text: str, what: str, want_object: bool = True) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInputError(what, f"not valid JSON: {exc}") from None
    if want_object and not isinstance(value, dict):
        raise BadInputError(what, "expected a JSON object")
    return value
