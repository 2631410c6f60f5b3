"""The mutation suite: deliberate bugs (planner/executor/mutants.py) of every kind the
executor's arithmetic and transport can have, each patched into a copy of the ranks' code in
the rank processes, each caught by `planner execute`'s own checks (never by a crash). A 2-rank
plan with every optimizer (planner.executor.demo.small_plan), 3 steps: about a second a run.

Adam's epsilon is set to 1e-2 here: at the default 1e-8 the two placements of epsilon differ
by ~1e-8 of an update, below what fp32 arithmetic can resolve, so no check could see them."""

import pytest

pytest.importorskip("torch")

from planner.executor.demo import small_plan
from planner.executor.job import RunOptions
from planner.executor.mutants import MUTANTS, apply_patch
from planner.executor.run import ExecutionReport, execute

# A mutant counts as caught only by a correctness check: the memory peak's allowance is not
# derived for these bugs. Correct code must pass every check, the peak included.
PEAK = "memory peak"
STEPS, EPS = 3, 1e-2


def failed(rep: ExecutionReport) -> list[str]:
    return [c.name for c in rep.checks if not c.ok and not c.name.startswith(PEAK)]


def run(fwd: str, mutants: tuple[str, ...] = ()) -> ExecutionReport:
    return execute(small_plan(fwd), RunOptions(steps=STEPS, eps=EPS, mutants=mutants,
                                               collective_timeout_s=20), timeout_s=120)


@pytest.mark.parametrize("fwd", sorted({m.fwd for m in MUTANTS}))
def test_correct_code_passes_every_check(fwd):
    rep = run(fwd)
    assert rep.ok, [f"{c.name}: {c.detail}" for c in rep.checks if not c.ok]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_caught_by_a_check(mutant):
    rep = run(mutant.fwd, (mutant.name,))
    assert failed(rep), f"{mutant.name} ({mutant.what}) survived"


def test_suite_covers_at_least_twelve_bugs_of_every_kind():
    assert len(MUTANTS) >= 12
    assert {m.kind for m in MUTANTS} >= {"optimizer", "pooling", "quantization", "cache",
                                         "offsets", "layout", "all-to-all"}


def test_a_patch_that_no_longer_matches_is_an_error():
    with pytest.raises(ValueError, match="found 0 times"):
        apply_patch("planner.executor.kernels:bag_offsets", "no such text", "x")
