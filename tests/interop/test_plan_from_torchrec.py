"""plan_from_torchrec: a TorchRec model's EmbeddingBagCollection and EmbeddingCollection (on
the meta device, at their own module paths) planned in one plan() and returned as TorchRec's
ShardingPlan, each table under its collection's path with shards covering it."""

import numpy as np
import pytest

pytest.importorskip("torchrec")

from planner.errors import BadInputError
from tests.interop.test_interop_dmp import HARDWARE  # 2 GPUs, one host

EBC_PATH = "sparse_arch.embedding_bag_collection"
EC_PATH = "seq_arch.ec"
# Pooled tables (one read by 2 features) and one sequence table.
POOLED = {"t_user": (60, 16, ["user", "user_hist"]), "t_item": (40, 8, ["item"]),
          "t_cat": (30, 8, ["cat"])}
SEQ = {"t_seq": (50, 8, ["clicks"])}
PF = {"user": 2.0, "user_hist": 5.0, "item": 1.0, "clicks": 3.0}  # t_cat: by constraints
OPTIONS = {"solver": "greedy"}


def _model():
    import torch
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    meta = torch.device("meta")
    ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=f)
        for n, (r, d, f) in POOLED.items()], device=meta)
    ec = EmbeddingCollection(tables=[
        EmbeddingConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=f)
        for n, (r, d, f) in SEQ.items()], device=meta)
    _apply_optimizer_in_backward(torch.optim.SGD, [ebc.embedding_bags["t_item"].weight],
                                 {"lr": 0.1})

    class Holder(torch.nn.Module):
        def __init__(self, **children) -> None:
            super().__init__()
            for k, v in children.items():
                setattr(self, k, v)

    # A DLRM-like nesting: model.sparse_arch.embedding_bag_collection, model.seq_arch.ec.
    return Holder(sparse_arch=Holder(embedding_bag_collection=ebc), seq_arch=Holder(ec=ec),
                  dense=torch.nn.Linear(4, 4, device=meta))


def _constraints():
    from torchrec.distributed.planner.types import ParameterConstraints

    # t_user and t_seq: constraints without pooling_factors (TorchRec's default [1.0], not
    # taken as given: their features' factors come from PF).
    return {"t_cat": ParameterConstraints(pooling_factors=[4.0], sharding_types=["table_wise"]),
            "t_user": ParameterConstraints(sharding_types=["row_wise"]),
            "t_seq": ParameterConstraints(sharding_types=["column_wise"], min_partition=4)}


def _covered(ps, rows: int, dim: int) -> bool:
    """Every element of the table in exactly one shard."""
    grid = np.zeros((rows, dim), dtype=int)
    for m in ps.sharding_spec.shards:
        (r0, c0), (rn, cn) = m.shard_offsets, m.shard_sizes
        assert r0 + rn <= rows and c0 + cn <= dim
        grid[r0:r0 + rn, c0:c0 + cn] += 1
    return bool((grid == 1).all())


@pytest.fixture(scope="module")
def planned():
    from planner.interop import plan_from_torchrec

    return plan_from_torchrec(_model(), HARDWARE, batch_size_per_gpu=8, pooling_factors=PF,
                              constraints=_constraints(), options=OPTIONS, device="cpu")


def test_every_table_under_its_module_path_and_covered(planned, quiet_torchrec):
    ours, sp = planned
    assert set(sp.plan) == {EBC_PATH, EC_PATH}
    assert set(sp.plan[EBC_PATH]) == set(POOLED) and set(sp.plan[EC_PATH]) == set(SEQ)
    world = HARDWARE["hosts"] * HARDWARE["gpus_per_host"]
    for path, tables in ((EBC_PATH, POOLED), (EC_PATH, SEQ)):
        for name, (rows, dim, _) in tables.items():
            ps = sp.plan[path][name]
            if ps.sharding_type == "data_parallel":
                assert ps.sharding_spec is None and sorted(ps.ranks) == list(range(world))
            else:
                assert _covered(ps, rows, dim), name
                assert all(0 <= r < world for r in ps.ranks)
    # Their constraints: TorchRec's names to ours and back.
    assert {n: sp.plan[EBC_PATH][n].sharding_type for n in ("t_cat", "t_user")} == {
        "t_cat": "table_wise", "t_user": "row_wise"}
    assert sp.plan[EC_PATH]["t_seq"].sharding_type == "column_wise"
    assert len(sp.plan[EC_PATH]["t_seq"].ranks) == 2  # 8 columns, min_partition 4
    assert ours.request.options.solver == "greedy"


def test_our_tables_are_the_modules(planned):
    ours, _ = planned
    specs = {t.name: t for t in ours.request.model.tables}
    assert [t.name for t in ours.tables] == list(POOLED) + list(SEQ)
    for name, (rows, dim, feats) in {**POOLED, **SEQ}.items():
        t = specs[name]
        assert (t.num_embeddings, t.embedding_dim) == (rows, dim)
        assert t.pooling_mode == ("none" if name in SEQ else None)
        if len(feats) > 1:
            assert [(f.name, f.pooling_factor) for f in t.features] == [
                (f, PF[f]) for f in feats]
        else:
            assert t.pooling_factor == PF.get(feats[0], 4.0)
    assert specs["t_item"].optimizer.value == "sgd"  # the fused optimizer on its weight
    assert specs["t_user"].optimizer.value == "rowwise_adagrad"  # none: our default
    assert specs["t_cat"].constraints.sharding_types[0].value == "table_wise"
    assert specs["t_seq"].constraints.min_column_shard_width == 4
    assert ours.request.model.batch_size_per_gpu == 8


def test_sharding_plan_is_the_exports(planned, quiet_torchrec):
    """The same ShardingPlan as the export the DMP test runs (its EBC and EC paths)."""
    from planner.interop import build_sharding_plan, to_torchrec

    ours, sp = planned
    again = build_sharding_plan(to_torchrec(ours, device="cpu", module_path=EBC_PATH,
                                            ec_module_path=EC_PATH))
    assert sp == again


def test_a_collection_alone_is_at_the_root(quiet_torchrec):
    from planner.interop import plan_from_torchrec

    ebc = _model().sparse_arch.embedding_bag_collection
    ours, sp = plan_from_torchrec(ebc, HARDWARE, batch_size_per_gpu=8,
                                  default_pooling_factor=2.0, options=OPTIONS)
    assert set(sp.plan) == {""} and set(sp.plan[""]) == set(POOLED)
    assert {t.name: t.features[0].pooling_factor if t.features else t.pooling_factor
            for t in ours.request.model.tables} == {n: 2.0 for n in POOLED}


def test_missing_pooling_factor_names_the_feature():
    from planner.interop import plan_from_torchrec

    pf = {k: v for k, v in PF.items() if k != "user_hist"}
    with pytest.raises(BadInputError, match="'user_hist'") as err:
        plan_from_torchrec(_model(), HARDWARE, batch_size_per_gpu=8, pooling_factors=pf,
                           constraints=_constraints())
    assert err.value.table == "t_user"


@pytest.mark.parametrize("kwargs,match", [
    ({"pooling_factors": {**PF, "nope": 1.0}}, "'nope' is not a feature"),
    ({"constraints": {"nope": None}, "default_pooling_factor": 1.0}, "'nope' is not a table"),
], ids=["stray_feature", "stray_table"])
def test_unknown_names_are_refused(kwargs, match):
    from planner.interop import plan_from_torchrec

    args = {"pooling_factors": PF, "constraints": _constraints(), **kwargs}
    with pytest.raises(BadInputError, match=match):
        plan_from_torchrec(_model(), HARDWARE, batch_size_per_gpu=8, **args)
