"""benchmarks/vs_torchrec's planning-time summary: where TorchRec's planner ran past its
limit, the speedup is reported as a floor (the limit over our time), never as a figure, and
the target is judged on the floor only when the floor reaches it."""

import pytest

from benchmarks.vs_torchrec import (
    CASE_TIMEOUT_S,
    TARGET_SPEEDUP,
    speed_cell,
    speed_line,
    summarise,
)


def _row(fixture: str, gpus: int, ours_s: float, torchrec_s: float | str) -> dict:
    return {"fixture": fixture, "gpus": gpus, "hosts": gpus // 8, "tables": 200,
            "ours_plan_time_s": ours_s, "torchrec_plan_time_s": torchrec_s}


def test_floor_where_torchrec_ran_past_its_limit() -> None:
    rows = [_row("hugectr_200", 16, 0.5, f">{CASE_TIMEOUT_S}"), _row("a", 8, 1.0, 3.0),
            _row("b", 8, 1.0, 5.0)]
    summary = summarise(rows)
    assert summary["speedup_200_tables_16_gpus"] is None
    assert summary["speedup_200_tables_16_gpus_floor"] == CASE_TIMEOUT_S / 0.5
    assert summary["median_speedup"] == 4.0  # of 3 and 5: the finished cases only
    assert summary["median_speedup_floor"] == 5.0  # of 3, 5 and 360
    text = speed_line(summary)
    assert f"more than {CASE_TIMEOUT_S / 0.5:.0f}x" in text and "target 50x: holds" in text
    assert "at least 5.0x" in text
    assert speed_cell(rows[0]) == f">{CASE_TIMEOUT_S / 0.5:.0f}"
    assert speed_cell(rows[1]) == "3.0"


def test_floor_under_the_target_says_unknown() -> None:
    slow = CASE_TIMEOUT_S / (TARGET_SPEEDUP / 2)  # our time: the floor is half the target
    rows = [_row("hugectr_200", 16, slow, f">{CASE_TIMEOUT_S}")]
    text = speed_line(summarise(rows))
    assert "unknown: the floor is under it" in text and "holds" not in text


def test_measured_speedup_judged_as_measured() -> None:
    rows = [_row("hugectr_200", 16, 1.0, TARGET_SPEEDUP - 1)]
    text = speed_line(summarise(rows))
    assert f"{TARGET_SPEEDUP - 1:.1f}x (target 50x: MISSED)" in text


def test_referee_summary_in_each_clock() -> None:
    """benchmarks/referee.summary: the median ratio and, over the cases more than 5% apart
    measured, how often the predicted ratio is on the same side of 1; each clock's ratio
    judged on its own (a case within 5% in one clock is left out there only)."""
    from benchmarks.referee import markdown, summary

    rows = [{"measured_ratio": 0.6, "measured_ratio_cpu": 0.7, "predicted_ratio": 0.5},
            {"measured_ratio": 1.2, "measured_ratio_cpu": 1.02, "predicted_ratio": 0.99},
            {"measured_ratio": 0.9, "measured_ratio_cpu": 1.1, "predicted_ratio": 0.8},
            {"measured_ratio": 1.06, "measured_ratio_cpu": 1.01, "predicted_ratio": 1.0},
            {"torchrec_error": "PlannerError"}]
    wall, cpu = summary(rows, "measured_ratio"), summary(rows, "measured_ratio_cpu")
    # The predicted tie (1.0) names neither plan: a miss where the measured ratios differ.
    assert wall["median_measured_ratio"] == pytest.approx(0.98)
    assert cpu["median_measured_ratio"] == pytest.approx(1.015)
    assert (wall["model_picks_the_faster"], cpu["model_picks_the_faster"]) == ((2, 4), (1, 2))
    ref = {"cases": [], "seconds": 1.0, "runs": 5, "hardware": "x", **wall,
           **{f"{k}_cpu": v for k, v in cpu.items()}}
    assert "faster plan named in 1 of 2" in "\n".join(markdown(ref))
