"""The errors a newcomer makes get one plain line and exit 2, never a traceback (issue 18)."""

import codecs
import json
import subprocess
from pathlib import Path

from planner import BadInputError, plan

_TABLE = {"name": "a", "num_embeddings": 1000, "embedding_dim": 16, "pooling_factor": 1.0}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["planner", *args], capture_output=True, text=True, timeout=120,
                          check=False)


def test_misspelled_field_is_named_with_the_right_one() -> None:
    bad = {k if k != "num_embeddings" else "num_embedings": v for k, v in _TABLE.items()}
    try:
        plan({"model": {"batch_size_per_gpu": 64, "tables": [bad]},
              "hardware": {"preset": "h100"}})
    except BadInputError as err:
        assert err.field == "model.tables[0].num_embedings" and err.table == "a"
        assert "did you mean 'num_embeddings'" in str(err)
    else:
        raise AssertionError("a misspelled field was accepted")


def test_utf16_file_with_bom_plans(tmp_path: Path) -> None:
    f = tmp_path / "m.json"
    text = json.dumps({"batch_size_per_gpu": 64, "tables": [_TABLE]})
    f.write_bytes(codecs.BOM_UTF16_LE + text.encode("utf-16-le"))
    r = _cli("plan", str(f), "-q", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tables"][0]["name"] == "a"


def test_binary_file_is_refused_plainly(tmp_path: Path) -> None:
    f = tmp_path / "m.json"
    f.write_bytes(bytes(range(256)))
    for cmd in (("plan", str(f)), ("check", str(f)), ("evaluate", str(f))):
        r = _cli(*cmd)
        assert r.returncode == 2 and "not a JSON text file" in r.stderr, (cmd, r.stderr)
        assert "Traceback" not in r.stderr


def test_misspelled_fixture_lists_the_fixtures() -> None:
    r = _cli("plan", "criteo_dcn2")
    assert r.returncode == 2 and "did you mean the fixture 'criteo_dcnv2'" in r.stderr


def test_model_given_to_check_is_named_as_a_model() -> None:
    r = _cli("check", "fixtures/models/criteo_kaggle.json")
    assert r.returncode == 2 and "this is a model spec" in r.stderr and "not a plan" in r.stderr


def test_output_file_with_json_keeps_stdout_free(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    r = _cli("plan", "deeprecsys_rm1", "-q", "--format", "json", "-o", str(out))
    assert r.returncode == 0 and r.stdout == "" and "written to" in r.stderr
    assert json.loads(out.read_text())["tables"]


def test_json_past_pythons_limits_is_bad_input(tmp_path: Path) -> None:
    """An integer of 5,000 digits and arrays nested 100,000 deep: Python's json refuses
    both (ValueError, RecursionError); every reader says so in one line, exit 2."""
    big = tmp_path / "big.json"
    big.write_text('{"batch_size_per_gpu": 1' + "0" * 5000 + ', "tables": []}')
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for path, words in ((big, "4300 digits"), (deep, "nested too deeply")):
        for args in (("plan", str(path)), ("check", str(path)),
                     ("plan", "deeprecsys_rm1", "--hardware", str(path))):
            r = _cli(*args)
            assert r.returncode == 2, (args, r.stderr)
            assert "Traceback" not in r.stderr and words in r.stderr, (args, r.stderr)


def test_an_output_path_that_cannot_be_written_fails_before_planning(tmp_path: Path) -> None:
    r = _cli("plan", "deeprecsys_rm1", "-q", "-o", str(tmp_path / "missing" / "plan.json"))
    assert r.returncode == 2 and "no such directory" in r.stderr and "Traceback" not in r.stderr
    r = _cli("plan", "deeprecsys_rm1", "-q", "-o", str(tmp_path))
    assert r.returncode == 2 and "is a directory" in r.stderr


def test_plan_of_something_not_a_request_is_bad_input() -> None:
    for value in (None, "abc", 42, [1]):
        try:
            plan(value)  # type: ignore[arg-type]
        except BadInputError as err:
            assert "expected a JSON object" in str(err)
        else:
            raise AssertionError(f"plan({value!r}) was accepted")


def test_capacities_past_64_bits_reach_cp_sat() -> None:
    """1e20 bytes of HBM (the schema takes it): CP-SAT's 64-bit integers used to overflow,
    and the search was skipped with a traceback on stderr."""
    hw = {"preset": "h100", "hosts": 2,
          "overrides": {"gpu": {"hbm_capacity_bytes": 10**20, "hbm_reserved_bytes": 0}}}
    p = plan({"model": {"batch_size_per_gpu": 512, "tables": [
        {**_TABLE, "name": f"t{i}", "num_embeddings": 10**5 * (i + 1)} for i in range(3)]},
        "hardware": hw, "options": {"solver": "ilp", "time_limit_s": 1.0}})
    assert not any("CP-SAT failed" in d for d in p.summary.decisions), p.summary.decisions
    assert "cp-sat" in p.summary.solver or "CP-SAT" in p.summary.status


def test_the_reported_bound_is_never_above_the_step() -> None:
    """Two tables whose bound and step are sums of the same seconds in different orders:
    the bound came out one ulp above the step (gap -1.1e-16, printed -0.00%)."""
    p = plan({"model": {"batch_size_per_gpu": 512, "tables": [
        {"name": "t0", "num_embeddings": 100_000, "embedding_dim": 64, "pooling_factor": 2.0},
        {"name": "t1", "num_embeddings": 5_000_000, "embedding_dim": 128,
         "pooling_factor": 2.0}]}, "hardware": {"preset": "h100", "hosts": 1}})
    assert p.summary.lower_bound_s <= p.summary.step_time_s
    assert p.summary.gap >= 0.0
