"""The capped-LP bound (planner/capped_bound.py), checked by another solver.

Where memory is short and only large-piece candidates fit it, the bound refutes makespans the
balanced bound allowed. Each refutation is re-derived here with SciPy's HiGHS on the flat
candidate list (other code, other arithmetic): at the bound, the candidates whose largest
piece fits under it either fit no mix of the cluster's memory or leave more average work
than the makespan holds; and a plan the planner found lies above it.
"""

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from cost_models import fixed_floors
from planner.bounds import lower_bound
from planner.capped_bound import capped_bound
from planner.partition.cpsat import makespan
from planner.partition.lp_start import lp_start, relaxed_choices
from planner.partition.policy import DEFAULT_POLICY
from planner.relaxation import cluster_caps, memory_matrix
from tests.test_relaxation import _setup, _tight

# hugectr_200 on 2 hosts of 16 GiB GPUs with 64 GiB of DDR each: its bound was 295.5 ms
# (the memory-priced average), its plan 567.4 ms.
TIGHT = _tight("hugectr_200", 2, "16GiB", "64GiB")


def _highs_status(cands, caps: np.ndarray, piece_cap: float) -> tuple[int, float]:
    """HiGHS on the LP over the candidates whose largest piece is at most `piece_cap`:
    (status, average work optimum); status 2 is infeasible."""
    flat = [(t, c) for t, cs in enumerate(cands) for c in cs if c.max_piece <= piece_cap]
    cost = np.array([c.work for _, c in flat]) * 1e3
    table = sp.csr_matrix((np.ones(len(flat)), ([t for t, _ in flat], range(len(flat)))),
                          shape=(len(cands), len(flat)))
    memory = np.array([[c.hbm_total, c.ddr_total, c.ssd_total] for _, c in flat]).T / 1e9
    finite = np.isfinite(caps)
    res = linprog(cost, A_ub=memory[finite], b_ub=caps[finite] / 1e9, A_eq=table,
                  b_eq=np.ones(len(cands)), bounds=(0, None), method="highs")
    return res.status, (float(res.fun) / 1e3 if res.status == 0 else float("nan"))


def test_refutes_what_memory_forbids_and_another_solver_agrees() -> None:
    problem, cands = _setup(TIGHT)
    bound = lower_bound(problem, cands)
    hw = problem.hw
    offsets = fixed_floors(problem.estimator.fixed(), problem.model.pipelined,
                           hw.constants.pipeline_overlap)
    caps = cluster_caps(hw)
    capped = capped_bound(cands, memory_matrix(cands), caps, hw.world_size,
                          problem.model.pipelined, offsets, bound.average_s)
    assert capped > bound.average_s * 1.5  # 295.5 -> about 500 ms
    assert bound.value_s >= capped and bound.balanced_s >= capped
    # At the bound: no plan with that makespan, by HiGHS.
    status, value = _highs_status(cands, caps, capped - offsets[1])
    assert status == 2 or value / hw.world_size + offsets[0] > capped
    # Well above it the same LP is feasible and within the makespan: the test can pass.
    above = capped * 1.2
    status, value = _highs_status(cands, caps, above - offsets[1])
    assert status == 0 and value / hw.world_size + offsets[0] <= above


def test_the_relaxed_start_survives_and_lies_above_it() -> None:
    """The priced start at the raised bound fits every cap and lies above the bound (the
    planner's plan there: 567.4 -> 543.8 ms, the bound 295.5 -> 500.6 ms). Under a cap on
    pieces that admits no mix that fits (the old bound's), the cap is raised until one does,
    where the start used to give up (and the plan was the greedy's)."""
    problem, cands = _setup(TIGHT)
    bound = lower_bound(problem, cands)
    for cap in (bound.value_s, bound.average_s):
        starts = [lp_start(problem, cands, choice, fill=fill) for fill, choice in
                  relaxed_choices(problem, cands, cap, DEFAULT_POLICY.relaxation_fills)]
        spans = [makespan(problem, a.choices) for a in starts if a is not None]
        assert spans and min(spans) >= bound.value_s
        assert min(spans) < bound.value_s * 1.25
