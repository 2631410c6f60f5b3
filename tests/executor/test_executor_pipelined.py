"""A pipelined plan runs pipelined (planner/executor/input_lane.py): each step's input
all-to-all runs on the rank's input lane (its own thread and gloo group) beside the previous
step's work, as TorchRec's sparse-dist train pipeline does. The ids do not depend on the
weights, so the run must compute what the sequential run of the same plan computes, bit for
bit, with the same bytes; and `--compare` must time the step as it ran (the phases but the
lane's input all-to-all, plus the wait for the lane)."""

import statistics

import pytest

torch = pytest.importorskip("torch")

from planner import plan  # noqa: E402
from planner.executor.compare import measured_phases  # noqa: E402
from planner.executor.demo import small_plan  # noqa: E402
from planner.executor.job import RunOptions  # noqa: E402
from planner.executor.run import execute  # noqa: E402
from planner.executor.thread_clock import thread_ids  # noqa: E402
from tests.executor.test_executor_sequence import HARDWARE, TABLES, B  # noqa: E402

OPTS = RunOptions(steps=4, warmup_steps=2, timed_steps=5, collective_timeout_s=60)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for pipelined in (False, True):
        d = tmp_path_factory.mktemp(f"pipelined_{pipelined}")
        out[pipelined] = (execute(small_plan(batch=16, pipelined=pipelined), OPTS, run_dir=d,
                                  timeout_s=180), d)
    return out


def test_every_check_passes_pipelined(runs):
    rep, _ = runs[True]
    assert rep.ok, [(c.name, c.detail) for c in rep.checks if not c.ok]


def test_same_weights_and_bytes_as_the_sequential_run(runs):
    (seq, a), (pip, b) = runs[False], runs[True]
    for r in range(2):
        da, db = torch.load(a / f"rank{r}.pt"), torch.load(b / f"rank{r}.pt")
        assert da.keys() == db.keys()
        for k in da:
            assert torch.equal(da[k], db[k]), (r, k)
    for rs, rp in zip(seq.ranks, pip.ranks, strict=True):
        assert rs["collectives"] == rp["collectives"]
        assert rs["bytes"] == rp["bytes"]
    assert seq.pieces == pip.pieces  # ids and lengths received, hit rates


def test_input_runs_on_the_lane(runs):
    seq, _ = runs[False]
    pip, _ = runs[True]
    for r in pip.ranks:
        steps = r["timing"]
        assert len(steps) == 5
        # The first step of a block has nothing prefetched: its input runs in turn.
        assert not steps[0]["input_a2a"]["lane"] and "input_wait" not in steps[0]
        for s in steps[1:]:
            assert s["input_a2a"]["lane"] and s["input_a2a"]["calls"] == 2
            assert "input_wait" in s
    for r in seq.ranks:
        assert all(not s["input_a2a"]["lane"] and "input_wait" not in s for s in r["timing"])


def test_collectives_cpu_is_their_own_groups(runs):
    """Where Linux lists threads, each collective's CPU time is its caller's and its group's
    threads' (the lane's all-to-all and the step's run at once on two groups)."""
    pip, _ = runs[True]
    per_thread = thread_ids() is not None
    for r in pip.ranks:
        assert r["collective_cpu_clock"] == ("group threads" if per_thread else "process")
        for s in r["timing"]:
            for t in s.values():
                if t["calls"]:
                    assert t["coll_proc_cpu"] >= t["coll_cpu"] - 1e-6


def test_compare_times_the_step_as_it_ran(runs):
    pip, _ = runs[True]
    for r, row in zip(pip.ranks, pip.compare["ranks"], strict=True):
        phases, _ = measured_phases(r["timing"])
        wait = statistics.median(s["input_wait"]["wall"] for s in r["timing"]
                                 if "input_wait" in s)
        assert row["measured_total"] == pytest.approx(
            sum(v for k, v in phases.items() if k != "input_a2a") + wait)
        assert row["predicted_total"] == row["predicted_step_s"]
    seq, _ = runs[False]
    for r, row in zip(seq.ranks, seq.compare["ranks"], strict=True):
        phases, _ = measured_phases(r["timing"])
        assert row["measured_total"] == pytest.approx(sum(phases.values()))


def test_sequence_tables_pipelined(tmp_path):
    """The sequence tables' per-step indices travel with their step's ids (rank.Routed):
    a lane that wrote them where the running step reads them would break the outputs."""
    p = plan({"model": {"batch_size_per_gpu": B, "tables": TABLES, "pipelined": True},
              "hardware": HARDWARE, "options": {"solver": "greedy"}})
    rep = execute(p, RunOptions(steps=3, warmup_steps=0, collective_timeout_s=60),
                  run_dir=tmp_path, timeout_s=180)
    assert rep.ok, [(c.name, c.detail) for c in rep.checks if not c.ok]


def test_memory_probe_steps_run_in_turn_on_cpu(runs):
    """torch.profiler records no allocation made on another thread, so on CPU the probe's
    steps run their inputs in turn, and the memory check says what it did not measure."""
    pip, _ = runs[True]
    assert all(r["pipelined_measured_steps"] is False for r in pip.ranks)
    check = next(c for c in pip.checks if c.name.startswith("memory peak"))
    assert check.ok and "not measured" in check.detail
    seq, _ = runs[False]
    check = next(c for c in seq.checks if c.name.startswith("memory peak"))
    assert "not measured" not in check.detail


def test_the_cpu_profiler_records_no_other_threads_allocation():
    """Why the CPU probe's steps run in turn (worker.py): should torch.profiler start to
    record other threads' allocations, this fails, and the lane can run in them too."""
    import threading

    from torch.profiler import ProfilerActivity, profile

    kept = []

    def alloc() -> None:
        kept.append(torch.empty(1 << 20, dtype=torch.uint8))

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        t = threading.Thread(target=alloc)
        t.start()
        t.join()
        kept.append(torch.empty(1 << 21, dtype=torch.uint8))
    sizes = []

    def walk(node) -> None:
        if type(node.extra_fields).__name__ == "_ExtraFields_Allocation":
            sizes.append(int(node.extra_fields.alloc_size))
        for c in node.children:
            walk(c)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    assert 1 << 21 in sizes and 1 << 20 not in sizes
