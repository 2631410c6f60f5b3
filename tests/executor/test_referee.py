"""benchmarks/referee.py, a quick slice: both planners plan the scaled-down job that runs, and
both plans are executed and measured."""

import json

import pytest

pytest.importorskip("torchrec")


def test_referee_plans_and_runs_the_scaled_job(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import referee
    from planner.presets import fixture_text, preset_dict

    monkeypatch.setattr(referee, "RUNS", 1)
    scale, batch = 0.001, 64
    row = referee.run_case("criteo_kaggle", 1, 2, scale, batch, preset_dict("h100"))
    assert "torchrec_error" not in row, row.get("torchrec_error")
    for who in ("ours", "torchrec"):
        assert not row.get(f"{who}_run_error"), row.get(f"{who}_run_error")
        assert len(row[f"{who}_measured_s"]) == 1 and row[f"{who}_measured_s"][0] > 0
    assert row["measured_ratio"] > 0 and row["predicted_ratio"] > 0
    # The plans were made for the scaled job: the prediction of what ran is the plan's own.
    full = json.loads(fixture_text("criteo_kaggle"))["tables"]
    rows = {t["name"]: max(1, round(t["num_embeddings"] * scale)) for t in full}
    plan = referee.scaled_request("criteo_kaggle", scale, batch)
    assert {t["name"]: t["num_embeddings"] for t in plan["tables"]} == rows
    assert plan["batch_size_per_gpu"] == batch
