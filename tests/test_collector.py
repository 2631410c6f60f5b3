"""planner.collector: the collector is paused while any plan runs and restored after the
last one, as it was before the first."""

import gc
import threading

import pytest

from planner.collector import collector_paused


def test_pauses_nest_and_restore() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()


def test_restored_after_an_error_and_left_off_when_it_was_off() -> None:
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a plan that failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # it was off before: not switched on behind the caller
    finally:
        gc.enable()


def test_overlapping_threads() -> None:
    """Two plans in threads whose pauses overlap: on only when both have ended."""
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with collector_paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with collector_paused():
        t.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the thread's plan still runs
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_plan_runs_paused(monkeypatch) -> None:
    from planner import planning
    from tests.conftest import fixture_request

    seen: list[bool] = []
    real = planning.candidates_for

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(planning, "candidates_for", spy)
    planning.plan(fixture_request("deeprecsys_rm1", 1))
    assert seen == [False] and gc.isenabled()
