"""Cache policies: the model (cost_models/cache_policy.py) against an exact computation, and the
executor's caches (planner/executor/store.py) against the model, per lookup."""

import itertools
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cost_models import CachePolicy, Tier, UniformAccess, ZipfAccess  # noqa: E402
from cost_models.access import AccessModel  # noqa: E402
from cost_models.cache_policy import che_hit_rate, lru_hit_rate, policy_hit_rate  # noqa: E402
from planner.executor import synthetic  # noqa: E402
from planner.executor.store import CachedStore  # noqa: E402
from planner.executor.warmup import table_lookups  # noqa: E402

ACCESSES = [UniformAccess(), ZipfAccess(0.8), ZipfAccess(1.0), ZipfAccess(1.2),
            ZipfAccess(1.4)]


def exact_lru(p: list[float], slots: int) -> float:
    """Stationary LRU hit probability under independent requests, exactly (King, 1971): the
    cache's ordered content (i1, ..., iC), most recent first, has probability
    prod_k p_ik / (1 - p_i1 - ... - p_i(k-1)); a request hits with the content's mass."""
    total = 0.0
    for seq in itertools.permutations(range(len(p)), slots):
        prob, mass = 1.0, 0.0
        for i in seq:
            prob *= p[i] / (1.0 - mass)
            mass += p[i]
        total += prob * mass
    return total


@pytest.mark.parametrize("alpha", [0.0, 0.8, 1.0, 1.2, 1.4])
@pytest.mark.parametrize(("rows", "slots"), [(9, 3), (10, 2), (10, 4)])
def test_che_approximation_matches_the_exact_lru_hit_rate(alpha, rows, slots):
    p = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
    p /= p.sum()
    che = che_hit_rate(p, np.ones(rows), slots)
    exact = exact_lru(p.tolist(), slots)
    # Che is asymptotically exact; on 9-10 rows it is off by at most ~1.3 points.
    assert abs(che - exact) < 0.015, (che, exact)
    if alpha == 0.0:
        assert math.isclose(exact, slots / rows) and math.isclose(che, slots / rows)


@pytest.mark.parametrize("alpha", [0.8, 1.0, 1.4])
def test_bucketed_zipf_tail_equals_the_sum_over_every_row(alpha):
    rows = 300_000
    p = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
    p /= p.sum()
    for slots in (100, 5_000, 60_000):
        direct = che_hit_rate(p, np.ones(rows), slots)
        assert abs(lru_hit_rate(ZipfAccess(alpha), slots, rows) - direct) < 1e-8


def measured_hit_rate(access: AccessModel, policy: CachePolicy, rows: int, ratio: float,
                      per_step: int, steps: int, seed: int = 0) -> tuple[float, int]:
    """The store on its own, fed the executor's synthetic ids: warm-up sized by warmup.py,
    then `steps` measured batches."""
    st = CachedStore(torch.zeros((rows, 1)), torch.zeros((rows, 0)), Tier.HBM_CACHE, ratio,
                     torch.device("cpu"), policy)
    warm = math.ceil(table_lookups(access, policy, rows, st.slots) / per_step)
    rng = np.random.default_rng(seed)
    offsets = torch.arange(0, per_step, 4)
    for i in range(warm + steps):
        if i == warm:
            st.hits = st.lookups = 0
        ranks = synthetic.popularity_ranks(access, rows, per_step, rng)
        st.pool(torch.from_numpy(synthetic.rank_to_row(ranks, rows, 1)), offsets)
        st.end_step()
    return st.hits / st.lookups, st.slots


@pytest.mark.parametrize("policy", list(CachePolicy))
@pytest.mark.parametrize("access", ACCESSES, ids=str)
def test_store_hit_rate_within_two_points_of_its_policys_model(access, policy):
    measured, slots = measured_hit_rate(access, policy, 2000, 0.1, 512, 40)
    predicted = policy_hit_rate(access, policy, slots, 2000)
    assert abs(measured - predicted) <= 0.02, (measured, predicted)


def test_the_policies_differ_where_the_model_says_they_do():
    """On zipf 1.0 LFU's steady state beats LRU by ~10 points; on uniform both serve C/N."""
    lru = policy_hit_rate(ZipfAccess(1.0), CachePolicy.LRU, 200, 2000)
    lfu = policy_hit_rate(ZipfAccess(1.0), CachePolicy.LFU, 200, 2000)
    assert lfu - lru > 0.08
    for pol in CachePolicy:
        assert math.isclose(policy_hit_rate(UniformAccess(), pol, 200, 2000), 0.1)


def test_a_cache_starts_empty_and_fills_on_demand():
    st = CachedStore(torch.zeros((100, 1)), torch.zeros((100, 0)), Tier.HBM_CACHE, 0.1,
                     torch.device("cpu"), CachePolicy.LRU)
    assert int((st.keys < 100).sum()) == 0
    st.pool(torch.tensor([5, 7, 5]), torch.tensor([0]))
    assert st.hits == 0 and st.lookups == 3
    st.end_step()
    assert sorted(st.keys[st.keys < 100].tolist()) == [5, 7]
    st.pool(torch.tensor([5, 9]), torch.tensor([0]))
    assert st.hits == 1


def test_execute_checks_an_lru_plan_against_che():
    from planner.executor.demo import all_types_plan
    from planner.executor.job import RunOptions
    from planner.executor.run import execute

    rep = execute(all_types_plan(batch=64), RunOptions(steps=5, cache_policy="lru",
                                                       keep_outputs=False), reference=False)
    check = next(c for c in rep.checks if c.name.startswith("cache hit rate"))
    assert check.ok, check.detail
    assert rep.warmup_steps > 0
    cached = [p for p in rep.pieces if p["hit_rate"]["predicted"] is not None]
    assert {p["hit_rate"]["policy"] for p in cached} == {"lru"}
    for p in cached:
        if p["table"] in ("zipf_cache", "cw_cache"):  # the most lookups: sampling error < 1pt
            assert abs(p["hit_rate"]["measured"] - p["hit_rate"]["predicted"]) <= 0.02, p
