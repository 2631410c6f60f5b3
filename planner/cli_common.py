"""Shared by the CLI commands: reading inputs (a file, '-' for stdin, or a bundled model
fixture's name) and failing with one stderr line and an exit code."""

import codecs
import sys
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console

from planner.errors import BadInputError
from planner.validation import parse_json


def read_input(path: str, what: str) -> str:
    """The text at `path`; for a model, a bundled fixture's name works too. UTF-8, or UTF-16
    or UTF-8 with a byte-order mark (as Notepad saves); anything else is refused plainly."""
    if path == "-":
        return sys.stdin.read()
    p = Path(path)
    if p.is_file():
        return decode_text(p.read_bytes(), what)
    if what == "model":
        # The same lookup as `"model": NAME` in a request (planner/spec/request.py).
        from planner.presets import fixture_names, fixture_text, unknown_fixture_message

        if path in fixture_names():
            return fixture_text(path)
        raise BadInputError(what, f"no such file, and {unknown_fixture_message(path)}")
    raise BadInputError(what, f"no such file: {path}")


def decode_text(data: bytes, what: str) -> str:
    for bom, codec in ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
                       (codecs.BOM_UTF16_BE, "utf-16")):
        if data.startswith(bom):
            try:
                return data.decode(codec)
            except UnicodeDecodeError as exc:
                raise BadInputError(what, f"not valid {codec} text: {exc.reason} at byte "
                                          f"{exc.start}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInputError(what, f"not a JSON text file (not UTF-8, nor UTF-16 with a "
                                  f"byte-order mark): byte 0x{data[exc.start]:02x} at offset "
                                  f"{exc.start}") from None


def load_json(text: str, what: str, want_object: bool = True) -> Any:
    value = parse_json(text, what)
    if want_object and not isinstance(value, dict):
        raise BadInputError(what, "expected a JSON object")
    return value


def hardware_input(hardware: Path | None, preset: str | None, hosts: int | None
                   ) -> dict[str, Any]:
    """The request's `hardware` from --hardware FILE or --preset NAME (default preset), with
    --hosts overriding the host count."""
    from planner.presets import DEFAULT_PRESET

    if hardware is not None:
        if preset is not None:
            raise BadInputError("--preset", "give either --hardware or --preset, not both")
        hw: dict[str, Any] = load_json(read_input(str(hardware), "hardware"), "hardware")
    else:
        hw = {"preset": preset or DEFAULT_PRESET}
    if hosts is not None:
        hw["hosts"] = hosts
    return hw


_err = Console(stderr=True, soft_wrap=True)


def fail(message: object, code: int) -> NoReturn:
    """One line on stderr, `error: message`, then exit with `code`."""
    _err.print(f"[red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def check_output(path: Path | None, option: str = "--output") -> None:
    """Refuse, before any work, an output path that cannot be a file: its directory missing,
    or a directory itself (exit 2)."""
    if path is None:
        return
    if path.is_dir():
        fail(f"{option}: {path} is a directory", 2)
    if not path.parent.is_dir():
        fail(f"{option}: cannot write {path}: no such directory {path.parent}", 2)


def write_output(path: Path, text: str, option: str = "--output") -> None:
    """Write `text` to `path`; a path that cannot be written fails with one line (exit 2),
    not a traceback."""
    check_output(path, option)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"{option}: cannot write {path}: {exc.strerror or exc}", 2)
