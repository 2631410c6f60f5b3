"""Bundled hardware presets and model fixtures, and expanding a preset reference.

The one place names are resolved: the CLI, the service and `planner.plan()` all read a
preset name (or alias) through `preset_dict` and a model fixture's name through
`fixture_text` / `fixture_model`, so they accept the same names and refuse the rest alike."""

import difflib
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
# The most characters of an unknown name an error message quotes.
_NAME_SHOWN = 64


def _fixture_dir(kind: str) -> Any:
    return resources.files("fixtures").joinpath(kind)


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".json") for p in _fixture_dir("hardware").iterdir()
                  if p.name.endswith(".json"))


def fixture_names() -> list[str]:
    return sorted(p.name.removesuffix(".json") for p in _fixture_dir("models").iterdir()
                  if p.name.endswith(".json"))


def preset_aliases() -> dict[str, str]:
    """Short preset names users may type, each with the preset it stands for."""
    return dict(_ALIASES)


def preset_choices() -> list[str]:
    """Every name a request's `hardware.preset` accepts: the presets and their aliases."""
    return sorted(preset_names() + list(_ALIASES))


def preset_dict(name: str) -> dict[str, Any]:
    canonical = _ALIASES.get(name, name)
    if canonical not in preset_names():
        known = ", ".join(preset_choices())
        raise BadInputError("hardware.preset", f"unknown preset '{name}' (known: {known})")
    text = _fixture_dir("hardware").joinpath(f"{canonical}.json").read_text()
    return dict(json.loads(text))


def unknown_fixture_message(name: str) -> str:
    """Why `name` names no bundled model fixture, with the closest name and the known ones."""
    names = fixture_names()
    if len(name) > _NAME_SHOWN:  # a request's string can be megabytes: quote only its start
        return f"no bundled fixture named '{name[:_NAME_SHOWN]}...' (fixtures: {', '.join(names)})"
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean the fixture '{close[0]}'?" if close else ""
    return f"no bundled fixture named '{name}'{hint} (fixtures: {', '.join(names)})"


def fixture_text(name: str, field: str = "model") -> str:
    """A bundled model fixture's JSON text; BadInputError on `field` for an unknown name."""
    if name not in fixture_names():
        raise BadInputError(field, unknown_fixture_message(name))
    return str(_fixture_dir("models").joinpath(f"{name}.json").read_text())


def fixture_model(name: str, field: str = "model") -> dict[str, Any]:
    """A bundled model fixture as a JSON object: what `"model": NAME` in a request stands for."""
    model: dict[str, Any] = json.loads(fixture_text(name, field))
    return model


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


# The two ways to give the HBM reservation (GpuSpec allows one at a time).
_HBM_RESERVATION = ("hbm_reserved_bytes", "hbm_reserved_fraction")


def _without_replaced_reservation(preset: dict[str, Any], overrides: dict[str, Any]
                                  ) -> dict[str, Any]:
    """The preset less its HBM reservation when the overrides give it the other way: an
    override of `hbm_reserved_fraction` replaces a preset's `hbm_reserved_bytes` (and the
    reverse) instead of clashing with it. Overrides giving both are left to validation."""
    gpu_over = overrides.get("gpu")
    gpu = preset.get("gpu")
    if not isinstance(gpu_over, dict) or not isinstance(gpu, dict):
        return preset
    given = [k for k in _HBM_RESERVATION if gpu_over.get(k) is not None]
    if len(given) != 1:
        return preset
    return {**preset, "gpu": {k: v for k, v in gpu.items() if k not in _HBM_RESERVATION}}


def resolve_hardware(hw: HardwareSpec | HardwareRef) -> HardwareSpec:
    """A full spec from a preset, its host count and overrides; a full spec passes through."""
    if isinstance(hw, HardwareSpec):
        return hw
    merged = preset_dict(hw.preset)
    if hw.hosts is not None:
        over = hw.overrides.get("hosts")
        if over is not None and over != hw.hosts:
            # Two host counts: neither silently wins.
            raise BadInputError("hardware.overrides.hosts",
                                f"{over!r} contradicts hardware.hosts {hw.hosts}: give one")
        merged["hosts"] = hw.hosts
    merged = _deep_merge(_without_replaced_reservation(merged, hw.overrides), hw.overrides)
    try:
        return HardwareSpec.model_validate(merged)
    except ValidationError as exc:
        raise bad_input_from(exc, prefix="hardware.overrides", raw=None) from None
