"""Bundled hardware presets and model fixtures, and expanding a preset reference."""

import json
from importlib import resources
from typing import Any

from pydantic import ValidationError

from planner.errors import BadInputError
from planner.spec.hardware import HardwareRef, HardwareSpec
from planner.validation import bad_input_from

DEFAULT_PRESET = "h100"
# Short names users type on the command line.
_ALIASES = {"a100": "zionex_a100", "zionex": "zionex_a100"}


def _fixture_dir(kind: str) -> Any:
    return resources.files("fixtures").joinpath(kind)


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".json") for p in _fixture_dir("hardware").iterdir()
                  if p.name.endswith(".json"))


def fixture_names() -> list[str]:
    return sorted(p.name.removesuffix(".json") for p in _fixture_dir("models").iterdir()
                  if p.name.endswith(".json"))


def preset_dict(name: str) -> dict[str, Any]:
    canonical = _ALIASES.get(name, name)
    if canonical not in preset_names():
        known = ", ".join(preset_names() + sorted(_ALIASES))
        raise BadInputError("hardware.preset", f"unknown preset '{name}' (known: {known})")
    text = _fixture_dir("hardware").joinpath(f"{canonical}.json").read_text()
    return dict(json.loads(text))


def fixture_text(name: str) -> str:
    if name not in fixture_names():
        known = ", ".join(fixture_names())
        raise BadInputError("model", f"unknown fixture '{name}' (known: {known})")
    return str(_fixture_dir("models").joinpath(f"{name}.json").read_text())


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def resolve_hardware(hw: HardwareSpec | HardwareRef) -> HardwareSpec:
    """A full spec from a preset, its host count and overrides; a full spec passes through."""
    if isinstance(hw, HardwareSpec):
        return hw
    merged = preset_dict(hw.preset)
    if hw.hosts is not None:
        merged["hosts"] = hw.hosts
    merged = _deep_merge(merged, hw.overrides)
    try:
        return HardwareSpec.model_validate(merged)
    except ValidationError as exc:
        raise bad_input_from(exc, prefix="hardware.overrides", raw=None) from None
