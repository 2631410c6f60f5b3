"""`planner calibrate --from`: several sessions' measurements fitted as one, each point the
median over the sessions, so that one session's slow spell does not move the profile."""

import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from planner.calibration.bench import Measurements
from planner.calibration.profile import build_profile, fit_collectives, fit_kernels
from planner.calibration.sessions import Session, load_session, merge, spread
from planner.cli import app
from planner.errors import BadInputError
from planner.spec import HardwareSpec
from tests.test_calibration import TRUE, synthetic


def slowed(m: Measurements, factor: float) -> Measurements:
    """Every measured time of `m` times `factor`: a session run in a slow spell."""
    def scale(pts: list[dict[str, object]]) -> list[dict[str, object]]:
        return [{k: (v * factor if k in ("seconds", "lookup_seconds") else v)
                 for k, v in p.items()} for p in pts]
    return Measurements(**{f.name: scale(getattr(m, f.name)) for f in fields(Measurements)})


def session(m: Measurements, name: str) -> Session:
    return Session(name, {"device": "cpu", "base_preset": "h100"}, m)


def written(tmp_path: Path, m: Measurements, name: str) -> Path:
    """A provenance file as `planner calibrate` writes it, holding `m`."""
    _, prov = build_profile("h100", m, "cpu", f"planner calibrate (test {name})")
    path = tmp_path / f"{name}.provenance.json"
    path.write_text(json.dumps(prov))
    return path


def test_each_point_is_the_median_of_the_sessions_figures() -> None:
    ms = [synthetic(0.05, 0.0, seed=s) for s in (1, 2, 3)]
    merged = merge([session(m, f"s{i}") for i, m in enumerate(ms)])
    for name in ("lookup", "backward", "host", "alltoall", "allreduce"):
        got = np.array([p["seconds"] for p in getattr(merged, name)])
        each = np.array([[p["seconds"] for p in getattr(m, name)] for m in ms])
        # The middle of three by sorting, not by statistics.median.
        assert got == pytest.approx(np.sort(each, axis=0)[1], rel=1e-12)
        # The terms are the first session's, untouched.
        assert [{k: v for k, v in p.items() if k != "seconds" and k != "lookup_seconds"}
                for p in getattr(merged, name)] == [
            {k: v for k, v in p.items() if k != "seconds" and k != "lookup_seconds"}
            for p in getattr(ms[0], name)]


def test_one_slow_session_of_three_does_not_move_the_fit() -> None:
    """Alone, a session 30% slow throughout fits bandwidths 30% low; with two sound
    sessions beside it, the median's fit recovers the known constants."""
    sound = [synthetic(0.02, 0.0, seed=s) for s in (4, 5)]
    slow = slowed(synthetic(0.02, 0.0, seed=6), 1.3)
    alone = fit_kernels(slow).value("inv_hbm_bw")
    assert alone == pytest.approx(1.3 * TRUE["inv_hbm_bw"], rel=0.06)
    merged = merge([session(sound[0], "a"), session(slow, "slow"), session(sound[1], "b")])
    assert fit_kernels(merged).value("inv_hbm_bw") == pytest.approx(TRUE["inv_hbm_bw"],
                                                                    rel=0.06)
    assert fit_collectives(merged).value("inv_link_bw") == pytest.approx(
        TRUE["inv_link_bw"], rel=0.06)
    # The spread names the slow session.
    s = spread([session(sound[0], "a"), session(slow, "slow"), session(sound[1], "b")],
               merged)
    ratios = s["lookup"]["session_over_median"]
    assert ratios[1] == pytest.approx(1.3, rel=0.08) and ratios[0] < 1.1 and ratios[2] < 1.1


def test_sessions_of_other_shapes_are_refused_naming_the_point() -> None:
    a = synthetic(0.0, 0.0)
    b = synthetic(0.0, 0.0)
    b.lookup[3] = {**b.lookup[3], "bytes": b.lookup[3]["bytes"] * 2}
    with pytest.raises(BadInputError, match=r"lookup\[3\]\.bytes"):
        merge([session(a, "a"), session(b, "b")])
    c = synthetic(0.0, 0.0)
    c.alltoall.pop()
    with pytest.raises(BadInputError, match=r"measurements\.alltoall"):
        merge([session(a, "a"), session(c, "c")])
    cuda = Session("g", {"device": "cuda", "base_preset": "h100"}, a)
    with pytest.raises(BadInputError, match="device"):
        merge([session(a, "a"), cuda])


def test_calibrate_from_sessions_writes_a_profile_plan_accepts(tmp_path: Path) -> None:
    paths = [written(tmp_path, synthetic(0.02, 0.0, seed=s), f"s{s}") for s in (7, 8)]
    paths.append(written(tmp_path, slowed(synthetic(0.02, 0.0, seed=9), 1.3), "slow"))
    out = tmp_path / "merged.json"
    r = CliRunner().invoke(app, ["calibrate", "-o", str(out),
                                 *[a for p in paths for a in ("--from", str(p))]])
    assert r.exit_code == 0, r.output
    hw = HardwareSpec.model_validate(json.loads(out.read_text()))
    eff = hw.gpu.hbm_bandwidth_gb_per_s * hw.constants.hbm_efficiency
    assert eff == pytest.approx(40.0, rel=0.08)  # GB/s: the sound sessions', not 40 / 1.3
    prov = json.loads(out.with_suffix(".provenance.json").read_text())
    assert [s["file"] for s in prov["sessions"]] == [str(p) for p in paths]
    assert prov["session_spread"]["lookup"]["session_over_median"][2] > 1.2
    p = CliRunner().invoke(app, ["plan", "criteo_kaggle", "--hardware", str(out)])
    assert p.exit_code == 0, p.output
    # A profile's own path finds its provenance beside it.
    assert load_session(out).measurements.lookup == load_session(
        out.with_suffix(".provenance.json")).measurements.lookup


@pytest.mark.parametrize("extra, says", [
    (["--long"], "options of a measuring run"),
    (["--device", "cuda"], "measured with cpu"),
    (["--preset", "a100"], "measured with h100"),
])
def test_calibrate_from_refuses_options_it_cannot_honour(tmp_path: Path, extra: list[str],
                                                         says: str) -> None:
    path = written(tmp_path, synthetic(0.0, 0.0), "s")
    r = CliRunner().invoke(app, ["calibrate", "-o", str(tmp_path / "o.json"), "--from",
                                 str(path), *extra])
    assert r.exit_code == 2 and says in r.output, r.output


def test_calibrate_from_a_file_that_is_not_a_session_names_it(tmp_path: Path) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text('{"tables": []}')
    r = CliRunner().invoke(app, ["calibrate", "-o", str(tmp_path / "o.json"), "--from",
                                 str(bad)])
    assert r.exit_code == 2 and str(bad) in r.output and "measurements" in r.output, r.output
    r = CliRunner().invoke(app, ["calibrate", "-o", str(tmp_path / "o.json"), "--from",
                                 str(tmp_path / "missing.json")])
    assert r.exit_code == 2 and "cannot read" in r.output, r.output


def test_a_measured_figure_that_is_not_a_number_is_refused(tmp_path: Path) -> None:
    path = written(tmp_path, synthetic(0.0, 0.0), "s")
    prov = json.loads(path.read_text())
    prov["measurements"]["lookup"][2]["seconds"] = "fast"
    path.write_text(json.dumps(prov))
    with pytest.raises(BadInputError, match=r"lookup\[2\]\.seconds"):
        load_session(path)
    r = CliRunner().invoke(app, ["calibrate", "-o", str(tmp_path / "o.json"), "--from",
                                 str(path), "--from", str(path)])
    assert r.exit_code == 2 and "not a number" in r.output, r.output
