"""Deliberate bugs, for the mutation suite (tests/executor/test_executor_mutants.py and
benchmarks/executor.py): each is a patch of a copy of one function's source, applied in the
rank processes when a job's `RunOptions.patches` names it. A correct executor never applies
any. Every patch must find its `old` text exactly once, so a mutant cannot silently turn into
a no-op when the code it mutates changes.
"""

import importlib
import inspect
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    kind: str  # what sort of bug
    target: str  # "module:function" or "module:Class.method"
    old: str
    new: str
    fwd: str = "fp32"  # the communication precision that exposes it
    what: str = ""


_K, _Q, _R, _S = ("planner.executor.kernels", "planner.executor.quant", "planner.executor.rank",
                  "planner.executor.store")

MUTANTS = (
    Mutant("adam_eps", "optimizer", f"{_K}:apply_optimizer",
           "(torch.sqrt(vhat) + cfg.eps)", "torch.sqrt(vhat + cfg.eps)",
           what="Adam: epsilon inside the square root"),
    Mutant("adam_bias", "optimizer", f"{_K}:apply_optimizer",
           "mhat = m / (1 - cfg.beta1 ** step)", "mhat = m",
           what="Adam: no bias correction of the first moment"),
    Mutant("adagrad_state", "optimizer", f"{_K}:apply_optimizer",
           "s = s + g * g", "s = g * g",
           what="Adagrad: the state not accumulated (last g^2 only)"),
    Mutant("rowwise_sum", "optimizer", f"{_K}:apply_optimizer",
           "(g * g).mean(dim=1, keepdim=True)", "(g * g).sum(dim=1, keepdim=True)",
           what="row-wise Adagrad: sum of g^2 over the row instead of the mean"),
    Mutant("sgd_lr", "optimizer", f"{_K}:apply_optimizer",
           "return w - cfg.lr * g, s", "return w - 1.01 * cfg.lr * g, s",
           what="SGD: learning rate 1% high"),
    Mutant("pool_drop_last", "pooling", f"{_K}:pool_bags",
           "psw = None if mask is None else mask.to(weight.dtype)",
           "e = torch.cat([offsets[1:], offsets.new_tensor([ids.numel()])]) - 1; "
           "e = e[e >= offsets]; last = torch.ones(ids.numel(), dtype=weight.dtype); "
           "last[e] = 0; psw = last if mask is None else mask.to(weight.dtype) * last",
           what="pooling drops each bag's last id"),
    Mutant("offsets_off_by_one", "pooling", f"{_K}:bag_offsets",
           "offsets = offsets.clamp(max=n)", "offsets = (offsets + (offsets > 0)).clamp(max=n)",
           what="bag offsets off by one: each bag's first id pooled into the bag before"),
    Mutant("int8_scale", "quantization", f"{_Q}:decode",
           "return q.reshape(rows, cols).to(torch.float32) * scale",
           "return q.reshape(rows, cols).to(torch.float32) * (scale * 1.01)", fwd="int8",
           what="int8 dequantization scale 1% high"),
    Mutant("fp16_scale", "quantization", f"{_Q}:decode",
           "return buf.view(_FLOAT[precision]).reshape(rows, cols).to(torch.float32)",
           "return buf.view(_FLOAT[precision]).reshape(rows, cols).to(torch.float32) * 1.01",
           fwd="fp16", what="fp16 decode 1% high"),
    Mutant("int8_trunc", "quantization", f"{_Q}:encode",
           "torch.round(x / scale)", "torch.trunc(x / scale)", fwd="int8",
           what="int8 rounding toward zero instead of to nearest"),
    # int8 weights (stored.py; small_plan's cw_int8): its row-wise quantization.
    Mutant("w8_trunc", "quantization", "planner.executor.stored:quantize",
           ".round_()", ".trunc_()",
           what="int8 weights: codes truncated instead of rounded to nearest"),
    Mutant("w8_scale", "quantization", "planner.executor.stored:quantize",
           "out[:, c:c + 4] = scale.view(torch.uint8)",
           "out[:, c:c + 4] = (scale * 1.01).view(torch.uint8)",
           what="int8 weights: each row's stored scale 1% high"),
    Mutant("cache_stale", "cache", f"{_S}:CachedStore.update",
           "self.cw[slot[hit]] = stored.to_stored(w[hd], self.cw.dtype).to(self.cache_device)",
           "self.w[u[hit_h]] = stored.to_stored(w[hd], self.w.dtype).to('cpu')",
           what="cache: a cached row's update goes to the backing store, the cache stays stale"),
    Mutant("cache_no_writeback", "cache", f"{_S}:CachedStore.end_step",
           'self.w[ev_rows] = self.cw[ev_slots.to(self.cache_device)].to("cpu")', "pass",
           what="cache: an evicted row is not written back (its updates in the cache are lost)"),
    Mutant("cache_keeps_coldest", "cache", f"{_S}:CachedStore.end_step",
           "order = torch.sort(key, descending=True, stable=True).indices",
           "order = torch.sort(key, descending=False, stable=True).indices",
           what="cache policy inverted: keeps the least counted / least recent rows"),
    Mutant("row_offset", "offsets", f"{_R}:RankExecutor.step",
           "local = ids.sub_(p.row0) if p.row0 else ids",
           "local = (ids - p.row0 + 1) % p.rows",
           what="row offset off by one: a piece reads the next row"),
    Mutant("row_boundary", "offsets", f"{_R}:RankExecutor._input_a2a",
           "keep = (ids >= p.row0) & (ids < p.row0 + p.rows)",
           "keep = (ids > p.row0) & (ids < p.row0 + p.rows)",
           what="row-split routing: the first row of every range is dropped"),
    Mutant("col_offset", "offsets", f"{_R}:RankExecutor._output_bwd",
           "return grad[:, p.col0:p.col0 + p.cols]", "return grad[:, :p.cols]",
           what="backward: a column piece takes the gradient of the first columns"),
    Mutant("concat_order", "layout", f"{_R}:RankExecutor._output_fwd",
           "out[:, ch.col0:ch.col0 + ch.cols] = v",
           "c = t.chunks[-1 - t.chunks.index(ch)]; out[:, c.col0:c.col0 + c.cols] = v",
           what="column chunks concatenated in reverse order"),
    Mutant("a2a_split_order", "all-to-all", f"{_R}:RankExecutor._exchange",
           "for it in expect[s]:", "for it in reversed(expect[s]):",
           what="output all-to-all: received buffer cut into blocks in the wrong order"),
)
# Bugs of the --kernels fbgemm path (planner/executor/fbgemm.py): no-ops on the torch path,
# so not in MUTANTS; tests/executor/test_executor_fbgemm.py runs them with --kernels fbgemm.
FBGEMM_MUTANTS = (
    Mutant("tbe_lr", "optimizer", "planner.executor.fbgemm:build_tbe",
           "learning_rate=cfg.lr,", "learning_rate=1.01 * cfg.lr,",
           what="the TBE's fused optimizer given a learning rate 1% high"),
)
BY_NAME = {m.name: m for m in (*MUTANTS, *FBGEMM_MUTANTS)}


def apply_patch(target: str, old: str, new: str) -> None:
    """Replace `old` by `new` (exactly one occurrence) in a copy of target's source and put the
    recompiled function in its place."""
    mod_name, qual = target.split(":")
    mod = importlib.import_module(mod_name)
    owner: object = mod
    parts = qual.split(".")
    for p in parts[:-1]:
        owner = getattr(owner, p)
    src = textwrap.dedent(inspect.getsource(getattr(owner, parts[-1])))
    if src.count(old) != 1:
        raise ValueError(f"mutant patch of {target}: {old!r} found {src.count(old)} times")
    ns: dict[str, object] = {}
    exec(compile(src.replace(old, new), f"<mutant {target}>", "exec"), mod.__dict__, ns)
    setattr(owner, parts[-1], ns[parts[-1]])


def apply(names: list[str] | tuple[str, ...]) -> None:
    for n in names:
        m = BY_NAME[n]
        apply_patch(m.target, m.old, m.new)
