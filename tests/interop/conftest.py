"""Fixtures of the interop tests (helpers in interop_helpers.py)."""

from tests.interop.interop_helpers import make_layout

__all__ = ["make_layout"]
