"""Fixtures of the interop tests (helpers in interop_helpers.py)."""

import logging
import warnings
from collections.abc import Iterator

import pytest

from tests.interop.interop_helpers import make_layout

__all__ = ["make_layout", "quiet_torchrec"]


@pytest.fixture
def quiet_torchrec() -> Iterator[None]:
    """TorchRec's planner logs and warns at length; keep the test output readable."""
    logging.disable(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    logging.disable(logging.NOTSET)
