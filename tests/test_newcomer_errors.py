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
