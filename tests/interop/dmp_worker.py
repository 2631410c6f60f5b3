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


def reference(tables: list[dict], feats: dict[str, list[str]], seq: set[str] = frozenset()):
    """An EmbeddingBagCollection of the tables; with sequence tables (`seq`), a module of an
    EmbeddingBagCollection "ebc" (the pooled tables) and an EmbeddingCollection "ec" (the
    sequence tables: EmbeddingConfig, one vector per id), whose outputs are one dict of
    tensors by feature (a sequence feature's: its JaggedTensor's values, [ids, dim])."""
    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    torch.manual_seed(SEED)
    cfgs = [EmbeddingBagConfig(name=t["name"], embedding_dim=t["embedding_dim"],
                               num_embeddings=t["num_embeddings"],
                               feature_names=feats[t["name"]])
            for t in tables if t["name"] not in seq]
    ebc = EmbeddingBagCollection(tables=cfgs, device=torch.device("cpu"))
    if not seq:
        return ebc
    ec = EmbeddingCollection(tables=[
        EmbeddingConfig(name=t["name"], embedding_dim=t["embedding_dim"],
                        num_embeddings=t["num_embeddings"], feature_names=feats[t["name"]])
        for t in tables if t["name"] in seq], device=torch.device("cpu"))
    n_pooled = sum(len(feats[t["name"]]) for t in tables if t["name"] not in seq)

    class Both(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc, self.ec = ebc, ec

        def forward(self, kjt):
            kp, ks = kjt.split([n_pooled, len(kjt.keys()) - n_pooled])
            pooled, seqs = self.ebc(kp), self.ec(ks)
            pooled = pooled.wait() if hasattr(pooled, "wait") else pooled
            seqs = seqs.wait() if hasattr(seqs, "wait") else seqs
            pooled_keys, seq_keys = kp.keys(), ks.keys()
            out = {f: pooled[f] for f in pooled_keys}
            out.update({f: seqs[f].values() for f in seq_keys})
            return out

    return Both()


def weight_of(module, name: str):
    """The reference's weight of table `name`."""
    if hasattr(module, "embedding_bags"):
        return module.embedding_bags[name].weight
    if name in module.ebc.embedding_bags:
        return module.ebc.embedding_bags[name].weight
    return module.ec.embeddings[name].weight


def main() -> None:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    export_path, out = Path(sys.argv[4]), Path(sys.argv[5])
    import torch
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
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
    # Sequence tables (pooling "none") go to the EmbeddingCollection; their keys follow the
    # pooled tables' in the KJT.
    seq = {t.name for t in export.tables if t.pooling == "none"}
    tables = ([t for t in tables if t["name"] not in seq]
              + [t for t in tables if t["name"] in seq])
    keys = feature_keys(tables, feats)
    ref = reference(tables, feats, seq)
    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR}
    sharders = [EmbeddingBagCollectionSharder(fused_params=fused),
                EmbeddingCollectionSharder(fused_params=fused)]
    model = DistributedModelParallel(
        reference(tables, feats, seq), env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=torch.device("cpu"), plan=build_sharding_plan(export), sharders=sharders)
    # Copy the reference weights into every local shard, so outputs must match exactly.
    ref_w = {t["name"]: weight_of(ref, t["name"]).detach() for t in tables}
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
    # One weight per output row: per sample of a pooled feature, per id of a sequence one.
    weights = {f: torch.randn(want[f].shape, generator=g) for _, f in keys}
    loss = sum((got[f] * weights[f]).sum() for _, f in keys)
    loss.backward()

    # Reference update: the gradient of the sum of both ranks' local losses, divided by the
    # world size (TorchRec's all-to-all divides gradients by it, as DDP averages them), times
    # the fused SGD's learning rate.
    ref.zero_grad()
    total = 0
    for r in range(world):
        gr = torch.Generator().manual_seed(99 + r)
        pooled = ref(batch(r, keys))
        wr = {f: torch.randn(pooled[f].shape, generator=gr) for _, f in keys}
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
        grad = weight_of(ref, name).grad
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
            want_grad = weight_of(ref, name).grad / world
            result["update_max_err"][name] = float((param.grad - want_grad).abs().max())
    out.write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
