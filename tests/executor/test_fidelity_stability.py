"""The fidelity benchmark's stability by the executions themselves (benchmarks/fidelity.py
`stability`): a pair of plans counts against it only where each run's executions order it
beyond chance (a one-sided exact Mann-Whitney test) and the two runs order it oppositely."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("scipy")

from benchmarks.fidelity import measurably_faster, stability


def _run(steps: dict[str, list[float]]) -> dict[str, dict]:
    """Plans as `reported` reports them: the median execution as the plan's step."""
    return {n: {"by_clock": {"cpu": {"plan": {"measured_step_s": sorted(x)[len(x) // 2]}}},
                "executions_step_s_by_clock": {"cpu": x}} for n, x in steps.items()}


def test_executions_order_a_pair_only_beyond_chance() -> None:
    assert measurably_faster([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])  # p = 1/252
    assert not measurably_faster([6, 7, 8, 9, 10], [1, 2, 3, 4, 5])
    assert not measurably_faster([1, 3, 5, 7, 9], [2, 4, 6, 8, 10])  # interleaved


def test_opposite_orders_beyond_chance_are_contradictions_and_near_ties_are_not() -> None:
    a = _run({"x": [1.0, 1.1, 1.2, 1.3, 1.4], "y": [2.0, 2.1, 2.2, 2.3, 2.4],
              "z": [1.00, 1.21, 1.32, 1.43, 1.54]})
    # y and x swap beyond chance; z against x swaps its median but not beyond chance.
    b = _run({"x": [2.5, 2.6, 2.7, 2.8, 2.9], "y": [1.5, 1.6, 1.7, 1.8, 1.9],
              "z": [1.05, 1.2, 1.25, 1.3, 1.35]})
    got = stability(a, b, "cpu")
    assert not got["same_order"]
    assert got["contradicted"] == [["x", "y"]]
    assert got["pairs"] == 3
    same = stability(a, a, "cpu")
    assert same["same_order"] and same["contradicted"] == []
    assert same["ordered_in_both"] == same["ordered_in_run"][0] >= 2


def test_the_model_is_held_to_the_pairs_the_executions_order() -> None:
    from benchmarks.fidelity import model_on_ordered_pairs

    run = _run({"x": [1.0, 1.1, 1.2, 1.3, 1.4], "y": [2.0, 2.1, 2.2, 2.3, 2.4],
                "z": [1.05, 1.15, 1.25, 1.35, 1.45]})
    predicted = {"x": 3.0, "y": 2.0, "z": 1.0}  # x and y the wrong way; x and z a near-tie
    for n, p in predicted.items():
        run[n]["by_clock"]["cpu"]["plan"]["predicted_step_s"] = p
    got = model_on_ordered_pairs(run, "cpu")
    # Ordered beyond chance: (x, y) and (y, z); x against z is not (interleaved).
    assert got["ordered_pairs"] == 2
    assert got["model_orders_against"] == [["x", "y"]]
