"""Property tests over random instances: tables, hardware and constraints.

- every plan passes the independent checker;
- the estimate is at least the lower bound;
- on tiny table-wise-only instances the lower bound is at most the brute-force optimum;
- an instance made infeasible on purpose is refused, naming the table that cannot fit.
"""

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import InfeasibleError, plan
from planner.check import check_plan
from planner.plan_model import PlanLayout, PlanPiece, TablePlan
from planner.planning import evaluate, resolve

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

TYPES = ["table_wise", "column_wise", "row_wise", "table_row_wise", "table_column_wise", "grid",
         "data_parallel"]
TIERS = ["hbm", "hbm_cache", "ddr", "ssd"]


@st.composite
def tables(draw: Any, n_max: int = 12) -> list[dict[str, Any]]:
    n = draw(st.integers(1, n_max))
    out = []
    for i in range(n):
        t: dict[str, Any] = {
            "name": f"t{i}",
            "num_embeddings": draw(st.integers(1, 5_000_000)),
            "embedding_dim": draw(st.sampled_from([4, 8, 16, 32, 64, 128, 256])),
            "pooling_factor": draw(st.floats(0.5, 80.0)),
            "access_frequency": draw(st.sampled_from([
                {"kind": "uniform"}, {"kind": "zipf", "alpha": 1.05},
                {"kind": "curve", "points": [[0.1, 0.7], [0.5, 0.95]]}])),
            "optimizer": draw(st.sampled_from(["sgd", "rowwise_adagrad", "adagrad", "adam"])),
            "data_type": draw(st.sampled_from(["fp32", "fp16"])),
        }
        if draw(st.booleans()):
            t["constraints"] = {
                "sharding_types": [*draw(st.lists(st.sampled_from(TYPES), min_size=1,
                                                  max_size=3, unique=True)), "table_wise"],
                "memory_tiers": [*draw(st.lists(st.sampled_from(TIERS), min_size=1,
                                                max_size=3, unique=True)), "hbm"],
            }
        out.append(t)
    return out


@st.composite
def requests(draw: Any) -> dict[str, Any]:
    hosts = draw(st.integers(1, 3))
    gpus = draw(st.sampled_from([1, 2, 4]))
    hbm_gib = draw(st.sampled_from([2, 8, 40]))
    return {
        "model": {"batch_size_per_gpu": draw(st.sampled_from([64, 512, 4096])),
                  "fwd_comm_precision": draw(st.sampled_from(["fp32", "fp16", "int8"])),
                  "pipelined": draw(st.booleans()),
                  "tables": draw(tables())},
        "hardware": {"preset": "h100", "hosts": hosts,
                     "overrides": {"gpus_per_host": gpus,
                                   "gpu": {"hbm_capacity_bytes": f"{hbm_gib}GiB",
                                           "hbm_reserved_bytes": "1GiB"},
                                   "host": {"ddr_capacity_bytes": "64GiB",
                                            "ddr_reserved_bytes": "8GiB",
                                            "ssd_capacity_bytes": "1TiB"}}},
    }


@SETTINGS
@given(requests())
def test_every_plan_passes_the_checker_and_respects_the_bound(req: dict[str, Any]) -> None:
    try:
        p = plan(req)
    except InfeasibleError as err:
        assert err.reason  # an answer with a reason, never a crash
        return
    report = check_plan(p)
    assert report.ok, report.errors[:5]
    assert p.summary.step_time_s >= p.summary.lower_bound_s * (1 - 1e-9)


def _canonical_assignments(n: int, gpus: int) -> list[tuple[int, ...]]:
    """Each assignment of n tables to GPUs whose first use of GPU k comes after that of
    GPU k - 1 (restricted growth strings): one per partition into at most `gpus` groups."""
    return [a for a in itertools.product(range(gpus), repeat=n)
            if all(a[i] <= max(a[:i], default=-1) + 1 for i in range(n))]


@SETTINGS
@given(st.lists(st.tuples(st.integers(1000, 100_000), st.sampled_from([16, 64, 128]),
                          st.floats(1.0, 50.0)), min_size=1, max_size=5),
       st.sampled_from([2, 3]))
def test_lower_bound_is_below_the_brute_force_optimum(specs: list[tuple[int, int, float]],
                                                      gpus: int) -> None:
    """Table-wise only, HBM only, one host: enumerate every assignment of tables to GPUs up to
    a relabelling of the GPUs (one host's GPUs are alike, so each partition of the tables
    into at most `gpus` groups is scored once: 41 layouts instead of 243 for 5 tables on 3)."""
    tabs = [{"name": f"t{i}", "num_embeddings": r, "embedding_dim": d, "pooling_factor": p,
             "constraints": {"sharding_types": ["table_wise"], "memory_tiers": ["hbm"]}}
            for i, (r, d, p) in enumerate(specs)]
    req = {"model": {"batch_size_per_gpu": 256, "tables": tabs},
           "hardware": {"preset": "h100", "hosts": 1, "overrides": {"gpus_per_host": gpus}}}
    ours = plan(req)
    resolved = resolve(req)
    best = float("inf")
    for ranks in _canonical_assignments(len(tabs), gpus):
        layout = PlanLayout(request=resolved, tables=[
            TablePlan(name=t["name"], sharding_type="table_wise", tier="hbm",
                      pieces=[PlanPiece(rank=r, host=0, row_offset=0,
                                        row_count=t["num_embeddings"], col_offset=0,
                                        col_count=t["embedding_dim"])])
            for t, r in zip(tabs, ranks, strict=True)])
        best = min(best, evaluate(layout).summary.step_time_s)
    assert ours.summary.lower_bound_s <= best * (1 + 1e-9)
    assert ours.summary.step_time_s >= best * (1 - 1e-9)


def test_canonical_assignments_count_the_partitions() -> None:
    # Stirling numbers of the second kind: S(5,1) + S(5,2) + S(5,3) = 1 + 15 + 25.
    assert len(_canonical_assignments(5, 3)) == 41
    assert len(_canonical_assignments(4, 2)) == 8
    assert _canonical_assignments(2, 3) == [(0, 0), (0, 1)]


@SETTINGS
@given(tables(n_max=6), st.integers(0, 5))
def test_infeasible_on_purpose_names_the_table(tabs: list[dict[str, Any]], which: int) -> None:
    """Make one table table-wise-only in HBM and bigger than a GPU's free HBM (7 GiB)."""
    i = which % len(tabs)
    tabs[i] = {"name": tabs[i]["name"], "num_embeddings": 3_000_000, "embedding_dim": 1024,
               "pooling_factor": 1.0,
               "constraints": {"sharding_types": ["table_wise"], "memory_tiers": ["hbm"]}}
    for t in tabs:  # keep the others easy to place, so only the chosen table can fail
        t["num_embeddings"] = min(t["num_embeddings"], 1000) if t is not tabs[i] else 3_000_000
        t.pop("constraints", None) if t is not tabs[i] else None
    req = {"model": {"batch_size_per_gpu": 64, "tables": tabs},
           "hardware": {"preset": "h100", "hosts": 1,
                        "overrides": {"gpu": {"hbm_capacity_bytes": "8GiB",
                                              "hbm_reserved_bytes": "1GiB"}}}}
    try:
        plan(req)
    except InfeasibleError as err:
        assert err.table == tabs[i]["name"]
        assert f"table '{tabs[i]['name']}'" in err.reason
        assert err.short_bytes and err.short_bytes > 0
    else:
        raise AssertionError("planned a table larger than any GPU's free HBM")
