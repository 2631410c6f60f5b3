"""benchmarks/fidelity_rescore re-prices the committed fidelity run's kept layouts and scores
them against its measurements with its own arithmetic: scoring the run's own profile must
give the figures the run reported (compare.py's), and another profile other figures."""

import json

import pytest

pytest.importorskip("torch")

from benchmarks import RESULTS
from benchmarks.fidelity_rescore import predictions, score


def test_rescoring_the_runs_own_profile_gives_the_runs_figures() -> None:
    measured = json.loads((RESULTS / "fidelity.json").read_text())
    hw = json.loads((RESULTS / "fidelity_profile.json").read_text())
    got = score(hw, measured)["passes"]
    runs = measured["calibrated"]["runs"]
    assert len(got) == len(runs)
    for p, run in zip(got, runs, strict=True):
        said = run["summary"]["wall"]  # collectives in wall time, as score() reads them
        assert p["spearman_step"] == pytest.approx(said["spearman_step"], abs=1e-9)
        assert p["median_abs_error"] == pytest.approx(said["median_abs_error"], rel=1e-9)
    # Twice the all-to-all latency: the collective phases' predictions grow (one plan priced,
    # as score prices each: the whole set again would double this test's minute).
    slow = json.loads(json.dumps(hw))
    slow["constants"]["a2a_call_latency_s"] *= 2
    name = sorted(runs[0]["plans"])[0]
    at = (runs[0]["plans"][name]["scale_rows"], runs[0]["plans"][name]["batch"])
    before, after = predictions(hw, name, at)[0], predictions(slow, name, at)[0]
    for b, a in zip(before, after, strict=True):
        assert a["input_a2a"] > 1.5 * b["input_a2a"] > 0
        assert a["lookup"] == pytest.approx(b["lookup"])
