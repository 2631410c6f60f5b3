"""`planner execute --kernels fbgemm`: the ranks' hbm pieces on FBGEMM's table-batched
embedding (one TBE per rank and optimizer/dtype group, its fused optimizer in the backward),
checked by the same checks as the torch path: every collective's bytes, memory held and the
allocator's peak against the model, outputs, weights and optimizer state against the
independent float64 reference (reference.py). 2 ranks, a tiny batch: a few seconds a run.
Skipped where fbgemm_gpu does not import."""

import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from planner.executor import fbgemm  # noqa: E402

if not fbgemm.available():
    pytest.skip("fbgemm_gpu is not importable (pip install fbgemm-gpu-cpu matching torch)",
                allow_module_level=True)

from planner.executor.demo import evaluated_plan  # noqa: E402
from planner.executor.job import RunOptions  # noqa: E402
from planner.executor.layout import exec_layout  # noqa: E402
from planner.executor.mutants import FBGEMM_MUTANTS  # noqa: E402
from planner.executor.run import (  # noqa: E402
    ExecutionReport,
    execute,
    output_bound,
    weight_tolerance,
)
from planner.plan_model import Plan  # noqa: E402

STEPS = 3


def plan() -> Plan:
    """Table-, column- and row-wise hbm pieces under SGD, Adagrad and row-wise Adagrad (the
    TBE's CPU optimizers), fp16 weights, two pieces of one group on a rank; beside them what
    runs on torch: an Adam table (no CPU Adam in FBGEMM), a ddr piece, a 6-column piece."""
    uni: dict[str, Any] = {"kind": "uniform"}

    def table(name: str, rows: int, dim: int, pooling: float, opt: str,
              dt: str = "fp32") -> dict[str, Any]:
        return {"name": name, "num_embeddings": rows, "embedding_dim": dim,
                "pooling_factor": pooling, "access_frequency": uni, "optimizer": opt,
                "data_type": dt}

    def piece(rank: int, row0: int, rows: int, col0: int, cols: int) -> dict[str, int]:
        return {"rank": rank, "host": 0, "row_offset": row0, "row_count": rows,
                "col_offset": col0, "col_count": cols}

    tables = [table("tw_sgd", 40, 4, 3, "sgd"), table("cw_adagrad", 50, 8, 3, "adagrad"),
              table("rw_rowwise", 60, 4, 4, "rowwise_adagrad"),
              table("tw_rowwise", 32, 8, 2, "rowwise_adagrad"),
              table("tw_fp16", 24, 4, 2, "sgd", "fp16"), table("tw_adam", 30, 4, 2, "adam"),
              table("tw_ddr", 20, 4, 2, "sgd"), table("tw_six", 20, 6, 2, "sgd")]
    layout = [
        ("tw_sgd", "table_wise", "hbm", None, [piece(0, 0, 40, 0, 4)]),
        ("cw_adagrad", "column_wise", "hbm", None, [piece(0, 0, 50, 0, 4),
                                                    piece(1, 0, 50, 4, 4)]),
        ("rw_rowwise", "row_wise", "hbm", None, [piece(0, 0, 30, 0, 4),
                                                 piece(1, 30, 30, 0, 4)]),
        ("tw_rowwise", "table_wise", "hbm", None, [piece(1, 0, 32, 0, 8)]),
        ("tw_fp16", "table_wise", "hbm", None, [piece(0, 0, 24, 0, 4)]),
        ("tw_adam", "table_wise", "hbm", None, [piece(1, 0, 30, 0, 4)]),
        ("tw_ddr", "table_wise", "ddr", None, [piece(0, 0, 20, 0, 4)]),
        ("tw_six", "table_wise", "hbm", None, [piece(1, 0, 20, 0, 6)]),
    ]
    return evaluated_plan("executor-fbgemm", 1, 2, 4, "fp32", "fp32", tables, layout)


def run(tmp: Path, kernels: str, mutants: tuple[str, ...] = ()) -> ExecutionReport:
    return execute(plan(), RunOptions(steps=STEPS, kernels=kernels, mutants=mutants,
                                      collective_timeout_s=20),
                   run_dir=tmp, timeout_s=120)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[ExecutionReport, Path]]:
    out = {}
    for k in ("fbgemm", "torch"):
        d = tmp_path_factory.mktemp(k)
        out[k] = (run(d, k), d)
    return out


def test_fbgemm_ranks_pass_every_check(runs):
    rep, _ = runs["fbgemm"]
    assert rep.kernels == "fbgemm"
    assert [c.name for c in rep.checks if not c.ok] == [], \
        [c.detail for c in rep.checks if not c.ok]
    names = {c.name for c in rep.checks}
    assert any(n.startswith("memory peak") for n in names)
    assert any(n.startswith("bytes: output all-to-all forward") for n in names)
    assert any(n.startswith("optimizer state") for n in names)


def test_the_tbe_serves_the_hbm_pieces_and_says_why_not_the_others(runs):
    rep, _ = runs["fbgemm"]
    lay = exec_layout(plan())
    by_name = {t.name: t for t in lay.tables}
    kind = {k: v for k, v in rep.piece_kernels.items()}
    for name in ("tw_sgd", "cw_adagrad", "rw_rowwise", "tw_rowwise", "tw_fp16"):
        for p in by_name[name].pieces:
            assert kind[p.key] == "fbgemm", (name, kind[p.key])
    assert kind[by_name["tw_adam"].pieces[0].key] == "torch: adam has no CPU kernel in FBGEMM"
    assert kind[by_name["tw_ddr"].pieces[0].key] == "torch: tier ddr"
    assert kind[by_name["tw_six"].pieces[0].key].startswith("torch: 6 columns")


def test_pooled_outputs_equal_the_torch_paths_within_the_precisions_tolerance(runs):
    from planner.executor.reference import run_reference

    lay = exec_layout(plan())
    ref = run_reference(lay, 0, STEPS, 0.01, 1e-8)
    got = {k: [torch.load(d / f"rank{r}.pt") for r in range(lay.world)]
           for k, (_, d) in runs.items()}
    for t in lay.tables:
        b = t.outputs
        # Step 0: each side within the bound of the reference, so within twice it of the
        # other; later steps: relative, twice the weights' tolerance.
        bound = output_bound(lay, t, ref)
        tol = weight_tolerance(lay, t, STEPS)
        diff2 = norm2 = 0.0
        for r in range(lay.world):
            for s in range(STEPS):
                f = got["fbgemm"][r][f"out{s}.{t.index}"].double()
                g = got["torch"][r][f"out{s}.{t.index}"].double()
                if s == 0:
                    assert bool(((f - g).abs() <= 2 * bound[r * b:(r + 1) * b]).all()), t.name
                else:
                    diff2 += float(((f - g) ** 2).sum())
                    norm2 += float((g ** 2).sum())
        assert math.sqrt(diff2 / norm2) <= 2 * tol, t.name


def test_a_wrong_learning_rate_given_to_the_tbe_fails_the_reference_check(tmp_path):
    (m,) = [m for m in FBGEMM_MUTANTS if m.name == "tbe_lr"]
    rep = run(tmp_path, "fbgemm", (m.name,))
    bad = [c.name for c in rep.checks if not c.ok]
    assert any("vs reference" in n for n in bad), bad
    # The wire and memory checks do not see an arithmetic bug: only the reference does.
    assert not any(n.startswith("bytes") for n in bad), bad


def test_kernels_fbgemm_from_the_cli(tmp_path):
    from typer.testing import CliRunner

    from planner.cli import app

    path = tmp_path / "plan.json"
    path.write_text(plan().model_dump_json())
    got = CliRunner().invoke(app, ["execute", str(path), "--kernels", "fbgemm", "--steps",
                                   "2", "--collective-timeout", "20"])
    assert got.exit_code == 0, got.output
    assert "kernels: FBGEMM TBE for 7 pieces; torch for 3" in got.output


def test_auto_is_fbgemm_here_and_an_explicit_fbgemm_without_it_exits_2(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from planner.cli import app

    assert fbgemm.resolve("auto") == "fbgemm"
    monkeypatch.setattr(fbgemm, "available", lambda: False)
    assert fbgemm.resolve("auto") == "torch"
    path = tmp_path / "plan.json"
    path.write_text(plan().model_dump_json())
    got = CliRunner().invoke(app, ["execute", str(path), "--kernels", "fbgemm", "--run-dir",
                                   str(tmp_path / "run")])
    assert got.exit_code == 2, got.output
    assert "fbgemm_gpu is not importable" in got.output
    assert not (tmp_path / "run" / "rank0.json").exists()  # refused before any rank
