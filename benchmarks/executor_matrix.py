"""`planner execute` over the matrix the planner accepts: every sharding type x memory tier,
every optimizer, every storage type, every communication precision, both kernel paths.

Each run is one plan on 4 gloo ranks (2 hosts x 2 ranks), 5 training steps after the default
warm-up (as many forward-only steps as the plan's caches need, planner/executor/warmup.py),
with every check of `planner execute` (float64 reference, bytes on the wire, allocator-measured
memory peak, cache hit rates). Recorded per run: passed or not, the checks that failed, and
the run's wall-clock seconds on this machine.

The runs:
- tier plans: for each tier (hbm, hbm_cache, ddr, ssd) one plan holding every sharding type the
  planner offers in it (table-, column-, row-, table-row-, table-column-wise, grid; and
  data-parallel, which is HBM only), the tables' optimizers cycling through SGD, Adagrad,
  row-wise Adagrad and Adam so every optimizer meets every tier;
- storage types: the hbm and the ddr tier plans with every table stored as fp16, bf16, int8;
- communication precisions: the hbm_cache tier plan with each (forward, backward) precision
  pair of fp16, bf16, int8, fp8;
- kernels: the hbm and hbm_cache tier plans on FBGEMM's table-batched kernels (`--kernels
  fbgemm`), where fbgemm_gpu imports.

Usage (from the repo root):
    PYTHONPATH=. python -m benchmarks.executor_matrix   # writes results/executor_matrix.{json,md}
"""

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from planner.executor.demo import GPUS_PER_HOST, HOSTS, evaluated_plan, piece, split_rows
from planner.executor.job import RunOptions
from planner.executor.launch import RankFailure
from planner.executor.run import execute
from planner.plan_model import Plan

OUT = Path(__file__).parent / "results"
BATCH, STEPS = 32, 5
OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "adam")
TIERS = ("hbm", "hbm_cache", "ddr", "ssd")
CACHE_RATIO = {"hbm_cache": 0.25, "ssd": 0.25}
SHARDED = ("table_wise", "column_wise", "row_wise", "table_row_wise", "table_column_wise",
           "grid")
PRECISIONS = (("fp16", "fp16"), ("bf16", "bf16"), ("int8", "int8"), ("fp8", "fp8"),
              ("fp16", "int8"))


def _pieces(kind: str, rows: int, dim: int, at: int) -> list[dict[str, int]]:
    """The pieces of one table of `kind`, its single-GPU pieces starting at rank `at`."""
    half = dim // 2
    if kind == "table_wise":
        return [piece(at % 4, 0, rows, 0, dim)]
    if kind == "column_wise":  # chunks on two hosts
        return [piece(at % 4, 0, rows, 0, half), piece((at + 2) % 4, 0, rows, half, half)]
    if kind == "row_wise":
        return split_rows(rows, [0, 1, 2, 3], 0, dim)
    host = [0, 1] if at % 2 == 0 else [2, 3]
    if kind == "table_row_wise":
        return split_rows(rows, host, 0, dim)
    if kind == "table_column_wise":
        return [piece(host[0], 0, rows, 0, half), piece(host[1], 0, rows, half, half)]
    if kind == "grid":  # a column chunk per host, its rows over the host's GPUs
        return split_rows(rows, [0, 1], 0, half) + split_rows(rows, [2, 3], half, half)
    if kind == "data_parallel":
        return [piece(r, 0, rows, 0, dim) for r in range(4)]
    raise ValueError(kind)


def tier_plan(tier: str, data_type: str = "fp32", fwd: str = "fp32", bwd: str = "fp32"
              ) -> Plan:
    """Every sharding type the planner offers in `tier`, one table each, scored by
    planning.evaluate (so accepted by the checker)."""
    kinds = SHARDED + (("data_parallel",) if tier == "hbm" else ())
    tables, layout = [], []
    for i, kind in enumerate(kinds):
        rows, dim = 240 + 40 * i, 8
        access = ({"kind": "zipf", "alpha": 1.05} if tier in CACHE_RATIO and i % 2 == 0
                  else {"kind": "uniform"})
        name = f"{kind}_{tier}"
        tables.append({"name": name, "num_embeddings": rows, "embedding_dim": dim,
                       "pooling_factor": 2 + i % 3, "access_frequency": access,
                       "optimizer": OPTIMIZERS[i % len(OPTIMIZERS)], "data_type": data_type})
        layout.append((name, kind, tier, CACHE_RATIO.get(tier), _pieces(kind, rows, dim, i)))
    return evaluated_plan(f"matrix-{tier}-{data_type}", HOSTS, GPUS_PER_HOST, BATCH, fwd, bwd,
                          tables, layout)


def _fbgemm_available() -> bool:
    try:
        import fbgemm_gpu  # noqa: F401
    except Exception:  # any import failure: the TBE path is unavailable
        return False
    return True


def cases() -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = [(f"tier {t}", {"tier": t}) for t in TIERS]
    out += [(f"tier {t}, {d} weights", {"tier": t, "data_type": d})
            for t in ("hbm", "ddr") for d in ("fp16", "bf16", "int8")]
    out += [(f"tier hbm_cache, comm {f}/{b}", {"tier": "hbm_cache", "fwd": f, "bwd": b})
            for f, b in PRECISIONS]
    if _fbgemm_available():
        out += [(f"tier {t}, fbgemm kernels", {"tier": t, "kernels": "fbgemm"})
                for t in ("hbm", "hbm_cache")]
    return out


def run_case(label: str, spec: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    kernels = spec.get("kernels", "torch")
    row: dict[str, Any] = {"case": label, **spec, "kernels": kernels}
    t0 = time.perf_counter()
    try:
        plan = tier_plan(spec["tier"], spec.get("data_type", "fp32"), spec.get("fwd", "fp32"),
                         spec.get("bwd", "fp32"))
        rep = execute(plan, RunOptions(steps=STEPS, kernels=kernels, collective_timeout_s=120),
                      run_dir=run_dir, timeout_s=400)
    except (ValueError, RankFailure) as err:  # refused, or a rank failed: a failed case
        row.update(passed=False, failed_checks=[f"{type(err).__name__}: {err}"[:300]])
    else:
        row.update(passed=rep.ok, checks=len(rep.checks), warmup_steps=rep.warmup_steps,
                   failed_checks=[f"{c.name}: {c.detail}"[:300] for c in rep.checks
                                  if not c.ok],
                   # A data-parallel table has no pieces in the report: it shows in the
                   # all-reduce, which only it uses.
                   kinds=sorted({p["kind"] for p in rep.pieces}
                                | ({"data_parallel"} if any(
                                    r["bytes"]["allreduce"]["measured"] > 0
                                    for r in rep.ranks) else set())),
                   optimizers=sorted({t["optimizer"] for t in
                                      plan.request.model.model_dump(mode="json")["tables"]}))
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", type=Path, default=OUT / "executor_matrix.json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, spec) in enumerate(cases()):
            rows.append(run_case(label, spec, Path(tmp) / f"run{i}"))
            r = rows[-1]
            print(f"{label}: {'pass' if r['passed'] else 'FAIL'} in {r['seconds']} s", flush=True)
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "platform": platform.platform(), "cpus": torch.get_num_threads()}
    args.o.write_text(json.dumps({"env": env, "rows": rows}, indent=1) + "\n")
    args.o.with_suffix(".md").write_text(_markdown(rows, env))


def _markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    lines = ["# `planner execute` matrix", "",
             f"`PYTHONPATH=. python -m benchmarks.executor_matrix` on {env['platform']}, "
             f"torch {env['torch']}, 4 gloo ranks (2 hosts x 2), batch {BATCH} per rank, "
             f"{STEPS} steps after the default warm-up; every check of `planner execute`. "
             "seconds: the whole run (launch, warm-up, steps, reference), wall clock.", "",
             "| case | kernels | sharding types | optimizers | warm-up | checks | result | s |",
             "|---|---|---|---|---:|---:|---|---:|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['kernels']} | {', '.join(r.get('kinds', []))} | "
                     f"{', '.join(r.get('optimizers', []))} | {r.get('warmup_steps', '-')} | "
                     f"{r.get('checks', '-')} | {'pass' if r['passed'] else 'FAIL'} | "
                     f"{r['seconds']} |")
    failed = [r for r in rows if not r["passed"]]
    lines += ["", f"- runs: {len(rows)}; passed: {len(rows) - len(failed)}; "
              f"total {sum(r['seconds'] for r in rows):.0f} s"]
    for r in failed:
        lines.append(f"- FAILED {r['case']}: " + "; ".join(r["failed_checks"]))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
