"""One gloo rank of the DistributedModelParallel test (run as a subprocess by
test_interop_dmp.py): shards an EmbeddingBagCollection with our exported plan, copies the
reference weights into its shards, runs forward and backward, and writes what it saw.

Usage: python -m tests.interop.dmp_worker RANK WORLD PORT EXPORT.json OUT.json
"""

import json
import sys
from pathlib import Path

LR = 0.5
BATCH = 4
SEED = 1234


def tables_of(export_path: Path) -> list[dict]:
    return json.loads(export_path.read_text())["model_tables"]


def feature_keys(tables: list[dict], feats: dict[str, list[str]]) -> list[tuple[dict, str]]:
    """(table, feature name) of every feature, table by table: the KJT's keys."""
    return [(t, f) for t in tables for f in feats[t["name"]]]


def batch(rank: int, keys: list[tuple[dict, str]]):
    """The local batch of `rank`: a KJT with 0-3 ids per sample per feature (seeded)."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(SEED + rank)
    lengths, values = [], []
    for t, _ in keys:
        n = torch.randint(0, 4, (BATCH,), generator=g)
        lengths.append(n)
        values.append(torch.randint(0, t["num_embeddings"], (int(n.sum()),), generator=g))
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f for _, f in keys], values=torch.cat(values), lengths=torch.cat(lengths))


def reference(tables: list[dict], feats: dict[str, list[str]]):
    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    torch.manual_seed(SEED)
    cfgs = [EmbeddingBagConfig(name=t["name"], embedding_dim=t["embedding_dim"],
                               num_embeddings=t["num_embeddings"],
                               feature_names=feats[t["name"]])
            for t in tables]
    return EmbeddingBagCollection(tables=cfgs, device=torch.device("cpu"))


def main() -> None:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    export_path, out = Path(sys.argv[4]), Path(sys.argv[5])
    import torch
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    from planner.interop import TorchRecExport, build_sharding_plan

    dist.init_process_group("gloo", rank=rank, world_size=world,
                            init_method=f"tcp://127.0.0.1:{port}")
    raw = json.loads(export_path.read_text())
    tables = raw["model_tables"]
    export = TorchRecExport.model_validate(raw["export"])
    # The export's feature names (EmbeddingBagConfig.feature_names), one per feature.
    feats = {t.name: t.feature_names for t in export.tables}
    keys = feature_keys(tables, feats)
    ref = reference(tables, feats)
    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR})
    model = DistributedModelParallel(
        reference(tables, feats), env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=torch.device("cpu"), plan=build_sharding_plan(export), sharders=[sharder])
    # Copy the reference weights into every local shard, so outputs must match exactly.
    ref_w = {t["name"]: ref.embedding_bags[t["name"]].weight.detach() for t in tables}
    state = model.state_dict()
    with torch.no_grad():
        for key, value in state.items():
            name = key.split(".")[-2]
            full = ref_w[name]
            if hasattr(value, "local_shards"):
                for shard in value.local_shards():
                    r0, c0 = shard.metadata.shard_offsets
                    rn, cn = shard.metadata.shard_sizes
                    shard.tensor.copy_(full[r0:r0 + rn, c0:c0 + cn])
            else:
                value.copy_(full)
    model.load_state_dict(state)

    kjt = batch(rank, keys)
    got = model(kjt)
    if hasattr(got, "wait"):
        got = got.wait()
    want = ref(kjt)
    g = torch.Generator().manual_seed(99 + rank)
    weights = {f: torch.randn(BATCH, t["embedding_dim"], generator=g) for t, f in keys}
    loss = sum((got[f] * weights[f]).sum() for _, f in keys)
    loss.backward()

    # Reference update: the gradient of the sum of both ranks' local losses, divided by the
    # world size (TorchRec's all-to-all divides gradients by it, as DDP averages them), times
    # the fused SGD's learning rate.
    ref.zero_grad()
    total = 0
    for r in range(world):
        gr = torch.Generator().manual_seed(99 + r)
        wr = {f: torch.randn(BATCH, t["embedding_dim"], generator=gr) for t, f in keys}
        pooled = ref(batch(r, keys))
        total = total + sum((pooled[f] * wr[f]).sum() for _, f in keys)
    total.backward()
    result = {"forward_max_err": {f: float((got[f] - want[f]).detach().abs().max())
                                  for _, f in keys},
              "forward_max_abs": {f: float(want[f].detach().abs().max()) for _, f in keys},
              "update_max_err": {}, "kinds": {}}
    after = model.state_dict()
    for key, value in after.items():
        name = key.split(".")[-2]
        kind = next(t.parameter_sharding.sharding_type for t in export.tables if t.name == name)
        result["kinds"][name] = kind
        grad = ref.embedding_bags[name].weight.grad
        if hasattr(value, "local_shards"):
            errs = []
            for shard in value.local_shards():
                r0, c0 = shard.metadata.shard_offsets
                rn, cn = shard.metadata.shard_sizes
                step = LR * grad[r0:r0 + rn, c0:c0 + cn] / world
                new = ref_w[name][r0:r0 + rn, c0:c0 + cn] - step
                errs.append(float((shard.tensor - new).abs().max()))
            result["update_max_err"][name] = max(errs) if errs else 0.0
    # Data-parallel replicas: DDP averages their gradients over the ranks.
    for pname, param in model.named_parameters():
        name = pname.split(".")[-2]
        if result["kinds"].get(name) == "data_parallel" and param.grad is not None:
            want_grad = ref.embedding_bags[name].weight.grad / world
            result["update_max_err"][name] = float((param.grad - want_grad).abs().max())
    out.write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
