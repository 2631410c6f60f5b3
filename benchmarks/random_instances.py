"""Seeded random-instance harness: plan many generated requests and classify what goes wrong.

Each instance is drawn from (seed, index) alone, so any one of them can be re-made and re-run
on its own. Kinds of instance:

- random: any hardware (presets with overrides, or custom specs with small HBM, 1 to 8 hosts),
  tables with every data type, optimizer and access curve, comm precisions, pipelining on or
  off, and every constraint kind (sharding types, memory tiers, pinned ranks, minimum column
  shard width) on some tables; some fit, some do not;
- preset_pins: a preset as shipped on 1 or 2 hosts, mostly pipelined, some tables pinned;
- infeasible: the tables together need more bytes than all HBM, DDR and SSD of the cluster (each
  table alone fits, so the request is valid): no plan exists;
- exact_fit, big_table, tight_pins: feasible by construction. The generator also builds a
  witness layout (table-wise pieces: tables that exactly fill each GPU's HBM; a table larger
  than one GPU's HBM held in ddr/ssd/hbm_cache; tables pinned to ranks that leave out some GPUs
  of some hosts, with HBM as tight as the witness allows) and checks it with `check_plan`.

For each instance the harness runs `plan()`, then checks: the independent checker accepts the
plan; the lower bound is at most the step time (and at most the witness's step time when the
witness lies in the candidate space); planning twice gives the same JSON bytes (and once in a
fresh interpreter, for a sample); and every InfeasibleError is tested against a
counter-example: the witness, the other solvers, and an independent first-fit of table-wise
(and row-wise) placements over all allowed tiers and ranks.

Outcomes (an instance may show several; `outcome` is the first in this order):
crash, bad_witness, bad_input, timeout, false_infeasible, no_plan_found, false_feasible,
check_rejects, bound_above_step, bound_above_witness, bad_infeasible_error (a negative
short_bytes), nondeterministic, ok.

Usage (from the repo root):
    python -m benchmarks.random_instances --n 1000 --seed 0 [--solver ilp] [--jobs 2] \
        -o benchmarks/results/random_instances.json
    python -m benchmarks.random_instances --seed 0 --only 17 --dump /tmp/repro   # one instance
Writes the JSON and a markdown summary next to it (same name, .md).
"""

import argparse
import contextlib
import io
import itertools
import json
import math
import os
import random
import subprocess
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cost_models import (
    CommPrecision,
    DataType,
    Optimizer,
    ShardingType,
    Tier,
    piece_memory,
)
from cost_models.memory import POLICY_STATE_BYTES_PER_ROW
from cost_models.sizes import optimizer_state_row_bytes, weight_row_bytes

REPO_ROOT = Path(__file__).resolve().parent.parent
COMMAND = ("python -m benchmarks.random_instances --n 1000 --seed 0 "
           "-o benchmarks/results/random_instances.json")

KINDS = ("random", "infeasible", "exact_fit", "big_table", "tight_pins", "preset_pins")
# Share of each kind in a run: index i gets KIND_CYCLE[i % len(KIND_CYCLE)].
KIND_CYCLE = ("random", "exact_fit", "tight_pins", "preset_pins", "big_table", "infeasible",
              "random", "exact_fit", "tight_pins", "big_table", "preset_pins", "random")
OUTCOMES = ("crash", "bad_witness", "bad_input", "timeout", "false_infeasible",
            "no_plan_found", "false_feasible", "check_rejects", "bound_above_step",
            "bound_above_witness", "bad_infeasible_error", "nondeterministic", "ok")
# Failure categories a correct planner never shows (ok and the generator's own are apart).
PLANNER_FAILURES = ("crash", "timeout", "false_infeasible", "no_plan_found", "false_feasible",
                    "check_rejects", "bound_above_step", "bound_above_witness",
                    "bad_infeasible_error", "nondeterministic")
GENERATOR_FAILURES = ("bad_witness", "bad_input")

# Cache ratios the candidates use (planner/candidates.py); a witness uses one of them so that
# it lies in the planner's candidate space.
HBM_CACHE_RATIO = 0.01
SSD_CACHE_RATIO = 0.01

PRESETS = ("h100", "h200", "zionex_a100")
GiB = 1 << 30
MiB = 1 << 20


# ----------------------------------------------------------------------------- generation


@dataclass
class Instance:
    seed: int
    index: int
    kind: str
    request: dict[str, Any]
    # Witness layout tables (PlanLayout.tables as dicts) when feasible by construction.
    witness: list[dict[str, Any]] | None = None
    # True when every witness piece lies in the planner's candidate space for sure
    # (table-wise in HBM), so the lower bound must not exceed the witness's step time.
    witness_in_space: bool = False
    notes: list[str] = field(default_factory=list)

    def size(self) -> tuple[int, int]:
        hw = self.request["hardware"]
        gpus = hw.get("hosts", 1) * hw.get("gpus_per_host", 8)
        return len(self.request["model"]["tables"]), gpus


def _preset(name: str) -> tuple[int, int, int]:
    """(hbm_capacity_bytes, hbm_reserved_bytes, gpus_per_host) of a bundled preset."""
    from planner.presets import resolve_hardware
    from planner.spec import HardwareRef

    spec = resolve_hardware(HardwareRef(preset=name))
    return int(spec.gpu.hbm_capacity_bytes), spec.gpu.hbm_reserved(), spec.gpus_per_host


def _row_bytes(dtype: DataType, opt: Optimizer, dim: int) -> int:
    return weight_row_bytes(dtype, dim) + optimizer_state_row_bytes(opt, dim)


def _access(rng: random.Random) -> dict[str, Any]:
    r = rng.random()
    if r < 0.4:
        return {"kind": "uniform"}
    if r < 0.8:
        return {"kind": "zipf", "alpha": round(rng.uniform(0.3, 2.5), 3)}
    n = rng.randint(1, 5)
    xs = sorted(rng.sample(range(1, 100), n))
    ys = sorted(rng.uniform(0.05, 1.0) for _ in range(n))
    return {"kind": "curve", "points": [[x / 100, round(y, 4)] for x, y in
                                        zip(xs, ys, strict=True)]}


def _dims() -> list[int]:
    return [4, 8, 12, 16, 24, 32, 48, 64, 96, 100, 128, 160, 256]


def _table(rng: random.Random, name: str, target_bytes: float,
           dtype: DataType | None = None, opt: Optimizer | None = None,
           dim: int | None = None) -> dict[str, Any]:
    dtype = dtype or rng.choice(list(DataType))
    opt = opt or rng.choice(list(Optimizer))
    dim = dim or rng.choice(_dims())
    rows = max(1, int(target_bytes / _row_bytes(dtype, opt, dim)))
    return {
        "name": name,
        "num_embeddings": rows,
        "embedding_dim": dim,
        "pooling_factor": round(rng.choice([rng.uniform(0.5, 4), rng.uniform(1, 60),
                                            rng.uniform(50, 300)]), 3),
        "access_frequency": _access(rng),
        "data_type": dtype.value,
        "optimizer": opt.value,
    }


def _table_bytes(t: dict[str, Any]) -> int:
    return t["num_embeddings"] * _row_bytes(DataType(t["data_type"]), Optimizer(t["optimizer"]),
                                            t["embedding_dim"])


def _custom_hardware(rng: random.Random, hosts: int, g: int, hbm_cap: int,
                     ddr_cap: int, ssd_cap: int) -> dict[str, Any]:
    """A custom spec dict whose free HBM per GPU is exactly hbm_cap (and DDR per host ddr_cap)."""
    hbm_res = rng.choice([0, 0, MiB, 7 * MiB + 3])
    ddr_res = rng.choice([0, GiB]) if ddr_cap > 0 else 0
    spec: dict[str, Any] = {
        "name": "rand",
        "hosts": hosts,
        "gpus_per_host": g,
        "gpu": {"name": "G", "hbm_capacity_bytes": hbm_cap + hbm_res,
                "hbm_reserved_bytes": hbm_res,
                "hbm_bandwidth_gb_per_s": rng.choice([900.0, 1555.0, 2039.0, 3350.0, 4800.0])},
        "host": {"ddr_capacity_bytes": ddr_cap + ddr_res if ddr_cap > 0 else 0,
                 "ddr_reserved_bytes": ddr_res,
                 "ddr_bandwidth_gb_per_s": rng.choice([100.0, 204.8, 614.4]),
                 "ssd_capacity_bytes": ssd_cap,
                 "ssd_bandwidth_gb_per_s": rng.choice([2.0, 12.0, 50.0])},
        "links": {"nvlink_gb_per_s": rng.choice([25.0, 150.0, 300.0, 450.0]),
                  "nic_gb_per_s": rng.choice([3.125, 12.5, 25.0, 50.0]),
                  "pcie_gb_per_s": rng.choice([16.0, 32.0, 64.0])},
    }
    if rng.random() < 0.3:
        spec["constants"] = {
            "piece_overhead_s": rng.choice([0.0, 5e-7, 1e-5]),
            "cache_metadata_bytes_per_row": rng.choice([0, 16, 32]),
            "hbm_efficiency": rng.choice([0.3, 0.55, 0.9]),
            "length_bytes": rng.choice([0, 4]),
        }
    return spec


def _model(rng: random.Random, tables: list[dict[str, Any]]) -> dict[str, Any]:
    precisions = [p.value for p in CommPrecision]
    return {
        "name": "rand",
        "batch_size_per_gpu": rng.choice([1, 64, 512, 2048, 8192, 65536]),
        "fwd_comm_precision": rng.choice(precisions),
        "bwd_comm_precision": rng.choice(precisions),
        "pipelined": rng.random() < 0.4,
        "tables": tables,
    }


def _options(rng: random.Random, solver: str) -> dict[str, Any]:
    if solver == "mixed":
        solver = rng.choice(["auto", "greedy", "ilp"])
    return {"solver": solver, "time_limit_s": rng.choice([0.25, 0.5, 1.0]),
            "seed": rng.randrange(1000)}


def _random_constraints(rng: random.Random, t: dict[str, Any], world: int, g: int,
                        p: float) -> None:
    if rng.random() >= p:
        return
    c: dict[str, Any] = {}
    if rng.random() < 0.5:
        types = [s.value for s in ShardingType]
        c["sharding_types"] = sorted(rng.sample(types, rng.randint(1, len(types))))
    if rng.random() < 0.4:
        tiers = [s.value for s in Tier]
        c["memory_tiers"] = sorted(rng.sample(tiers, rng.randint(1, len(tiers))))
    if rng.random() < 0.4:
        r = rng.random()
        if r < 0.3:  # a whole host (or several), so host-scoped types stay possible
            hosts = rng.sample(range(world // g), rng.randint(1, min(2, world // g)))
            ranks = [h * g + i for h in hosts for i in range(g)]
        elif r < 0.4:
            ranks = list(range(world))
        else:
            ranks = rng.sample(range(world), rng.randint(1, min(world, 6)))
        c["pinned_ranks"] = sorted(ranks)
    if rng.random() < 0.3:
        dim = t["embedding_dim"]
        c["min_column_shard_width"] = rng.choice([w for w in (1, 4, 8, 16, 32, 64, dim)
                                                  if w <= dim])
    if c:
        t["constraints"] = c


def _hardware_random(rng: random.Random, hosts: int) -> tuple[dict[str, Any], int, int, int]:
    """(hardware input, gpus per host, free HBM per GPU, free DDR + SSD per host)."""
    if rng.random() < 0.45:
        preset = rng.choice(PRESETS)
        cap, res, g = _preset(preset)
        hw: dict[str, Any] = {"preset": preset, "hosts": hosts}
        if rng.random() < 0.5:  # shrink the free HBM through an override
            free = rng.choice([256 * MiB, 2 * GiB, 16 * GiB])
            res = cap - free
            hw["overrides"] = {"gpu": {"hbm_reserved_bytes": res}}
        # The presets' DDR and SSD are large; only HBM pressure is simulated here.
        return hw, g, cap - res, 0
    g = rng.choice([1, 2, 4, 8])
    hbm = rng.choice([64 * MiB, 256 * MiB, GiB, 4 * GiB])
    ddr = rng.choice([0, 2 * hbm, 8 * hbm * g])
    ssd = rng.choice([0, 0, 64 * hbm * g])
    return _custom_hardware(rng, hosts, g, hbm, ddr, ssd), g, hbm, ddr + ssd


def _n_tables(rng: random.Random, max_tables: int) -> int:
    r = rng.random()
    n = rng.randint(1, 30) if r < 0.7 else rng.randint(30, 100) if r < 0.9 else \
        rng.randint(100, 300)
    return max(1, min(n, max_tables))


def _hosts(rng: random.Random) -> int:
    return rng.choice([1, 1, 2, 2, 3, 4, 5, 8])


def gen_random(rng: random.Random, solver: str, max_tables: int) -> Instance:
    hosts = _hosts(rng)
    hw, g, hbm, slow = _hardware_random(rng, hosts)
    world = hosts * g
    n = _n_tables(rng, max_tables)
    # Total bytes as a share of the cluster's HBM: light, under pressure, or beyond HBM.
    fill = rng.choice([0.05, 0.3, 0.7, 0.95, 1.3, 2.5])
    total = fill * world * hbm
    weights = [rng.lognormvariate(0, 1.5) for _ in range(n)]
    cluster = world * hbm + hosts * slow
    tables = []
    for i, wgt in enumerate(weights):
        target = min(total * wgt / sum(weights), 0.9 * cluster)
        t = _table(rng, f"t{i}", max(target, 64))
        _random_constraints(rng, t, world, g, 0.35)
        tables.append(t)
    req = {"model": _model(rng, tables), "hardware": hw, "options": _options(rng, solver)}
    return Instance(0, 0, "random", req, notes=[f"fill {fill} of cluster HBM"])


def gen_infeasible(rng: random.Random, solver: str, max_tables: int) -> Instance:
    hosts = _hosts(rng)
    g = rng.choice([1, 2, 4, 8])
    hbm = rng.choice([64 * MiB, 256 * MiB, GiB])
    ddr = rng.choice([0, 4 * hbm])
    ssd = rng.choice([0, 16 * hbm])
    hw = _custom_hardware(rng, hosts, g, hbm, ddr, ssd)
    cluster = hosts * g * hbm + hosts * (ddr + ssd)
    over = rng.choice([1.02, 1.3, 3.0])
    n = max(4, min(_n_tables(rng, max_tables), max_tables))
    weights = [rng.uniform(0.5, 1.5) for _ in range(n)]
    tables = []
    for i, wgt in enumerate(weights):
        # No table alone may pass the cluster (that is bad input, not infeasible): a few
        # heavy draws among few tables at 3x would, so each is capped at 90% of it.
        target = min(over * cluster * wgt / sum(weights), 0.9 * cluster)
        dtype, opt = rng.choice(list(DataType)), rng.choice(list(Optimizer))
        dim = rng.choice(_dims())
        rows = math.ceil(target / _row_bytes(dtype, opt, dim))
        t = _table(rng, f"t{i}", 1, dtype, opt, dim)
        t["num_embeddings"] = rows
        _random_constraints(rng, t, hosts * g, g, 0.2)
        tables.append(t)
    # Each table alone must fit the cluster (else the request is bad input); together they
    # must not (more capped tables until they pass it).
    while sum(_table_bytes(t) for t in tables) <= cluster:
        extra = _table(rng, f"t{len(tables)}", 1, DataType.FP32, Optimizer.SGD, 64)
        extra["num_embeddings"] = math.ceil(0.9 * cluster / _row_bytes(DataType.FP32,
                                                                       Optimizer.SGD, 64))
        tables.append(extra)
    assert all(_table_bytes(t) <= cluster for t in tables)
    req = {"model": _model(rng, tables), "hardware": hw, "options": _options(rng, solver)}
    return Instance(0, 0, "infeasible", req, notes=[f"{over}x the cluster's memory"])


def _same_row_size_groups() -> list[list[tuple[DataType, Optimizer, int]]]:
    by_size: dict[int, list[tuple[DataType, Optimizer, int]]] = {}
    for dt in DataType:
        for opt in Optimizer:
            for dim in range(4, 129, 4):
                by_size.setdefault(_row_bytes(dt, opt, dim), []).append((dt, opt, dim))
    return [v for _, v in sorted(by_size.items()) if len(v) >= 3]


_GROUPS = _same_row_size_groups()


def _piece(rank: int, g: int, rows: int, dim: int) -> dict[str, Any]:
    return {"rank": rank, "host": rank // g, "row_offset": 0, "row_count": rows,
            "col_offset": 0, "col_count": dim}


def _tw(t: dict[str, Any], rank: int, g: int, tier: str = "hbm",
        ratio: float | None = None) -> dict[str, Any]:
    return {"name": t["name"], "sharding_type": "table_wise", "tier": tier,
            "cache_ratio": ratio, "pieces": [_piece(rank, g, t["num_embeddings"],
                                                    t["embedding_dim"])]}


def gen_exact_fit(rng: random.Random, solver: str, max_tables: int) -> Instance:
    """Tables that exactly fill every GPU's HBM, table-wise (e.g. 4 tables on 2 GPUs)."""
    variant = rng.choice(["random", "random", "lpt_trap"])
    hosts = rng.choice([1, 1, 1, 2, 2, 3])
    g = rng.choice([1, 2, 2, 4])
    world = hosts * g
    group = rng.choice(_GROUPS)
    rb = _row_bytes(*group[0])
    if variant == "lpt_trap":
        # Per pair of GPUs {3u, 3u} and {2u, 2u, 2u}: largest-first puts a 3u table on each.
        unit = rng.randint(200, 20000)
        parts_per_gpu = [[3 * unit, 3 * unit] if r % 2 == 0 else [2 * unit] * 3
                         for r in range(world)]
        if world % 2:
            parts_per_gpu[-1] = [6 * unit]
        m_rows = 6 * unit
    else:
        m_rows = rng.randint(1000, 200000)
        per_gpu = max(1, min(rng.choice([1, 2, 2, 3, 4, 6]), max(1, max_tables // world)))
        parts_per_gpu = []
        for _ in range(world):
            k = min(per_gpu, m_rows)
            cuts = sorted(rng.sample(range(1, m_rows), k - 1)) if k > 1 else []
            bounds = [0, *cuts, m_rows]
            parts_per_gpu.append([b - a for a, b in itertools.pairwise(bounds)])
    hbm = m_rows * rb
    ddr = 0 if rng.random() < 0.6 else hbm // 2
    hw = _custom_hardware(rng, hosts, g, hbm, ddr, 0)
    # Half the instances pin the type and tier (the packing is then the only way); the rest
    # leave the planner free (no DDR or too little for much).
    constrained = rng.random() < 0.5
    tables, witness = [], []
    i = 0
    for rank, parts in enumerate(parts_per_gpu):
        for rows in parts:
            dt, opt, dim = rng.choice(group)
            t = _table(rng, f"t{i}", 1, dt, opt, dim)
            t["num_embeddings"] = rows
            if constrained:
                t["constraints"] = {"sharding_types": ["table_wise"], "memory_tiers": ["hbm"]}
            elif rng.random() < 0.3:
                t["constraints"] = {"sharding_types": rng.choice(
                    [["table_wise"], ["table_wise", "column_wise"], ["table_wise", "row_wise"]])}
            tables.append(t)
            witness.append(_tw(t, rank, g))
            i += 1
    order = list(range(len(tables)))
    rng.shuffle(order)
    tables = [tables[j] for j in order]
    witness = [witness[j] for j in order]
    req = {"model": _model(rng, tables), "hardware": hw, "options": _options(rng, solver)}
    pinned = ", type and tier pinned" if constrained else ""
    return Instance(0, 0, "exact_fit", req, witness, witness_in_space=True,
                    notes=[f"{variant}: {len(tables)} tables exactly fill {world} GPUs' HBM "
                           f"({hbm:,} bytes each){pinned}"])


def gen_big_table(rng: random.Random, solver: str, max_tables: int) -> Instance:
    """A table larger than one GPU's HBM, table-wise only: only ddr, ssd or hbm_cache hold it."""
    hosts = rng.choice([1, 1, 2, 3, 4])
    g = rng.choice([1, 2, 4, 8])
    world = hosts * g
    hbm = rng.choice([32 * MiB, 128 * MiB, 512 * MiB])
    tier_sets = [["ddr"], ["hbm", "ddr"], ["hbm", "hbm_cache"], ["hbm_cache"], ["ssd"],
                 ["hbm", "ssd"], ["ddr", "ssd"], None]
    n_big = rng.choice([1, 1, 2])
    bigs = []
    for b in range(n_big):
        tiers = rng.choice(tier_sets)
        dt, opt, dim = rng.choice(list(DataType)), rng.choice(list(Optimizer)), \
            rng.choice([8, 16, 32, 64, 128])
        t = _table(rng, f"big{b}", hbm * rng.uniform(1.1, 4.0), dt, opt, dim)
        c: dict[str, Any] = {"sharding_types": ["table_wise"]}
        if tiers is not None:
            c["memory_tiers"] = tiers
        t["constraints"] = c
        bigs.append(t)
    # Tier per big table for the witness, and the host memory it needs there.
    meta = 16
    ddr_need, ssd_need, choice = 0, 0, []
    for t in bigs:
        tiers = t["constraints"].get("memory_tiers") or ["ddr", "ssd", "hbm_cache"]
        slow = [x for x in tiers if x != "hbm"]
        tier = rng.choice(slow)
        full = _table_bytes(t)
        rows = t["num_embeddings"]
        w_row = weight_row_bytes(DataType(t["data_type"]), t["embedding_dim"])
        if tier == "hbm_cache":
            slots = max(1, int(HBM_CACHE_RATIO * rows))
            if slots * (w_row + meta) > hbm // 2:
                tier = "ddr" if "ddr" in slow else "ssd" if "ssd" in slow else tier
        choice.append(tier)
        # A cache's policy state: one int64 per row in host DDR (cost_models.memory).
        policy = rows * POLICY_STATE_BYTES_PER_ROW if tier in ("hbm_cache", "ssd") else 0
        if tier in ("ddr", "hbm_cache"):
            ddr_need += full + policy
        else:
            ssd_need += full
            ddr_need += max(1, int(SSD_CACHE_RATIO * rows)) * (full // rows + meta) + policy
    # One host holds every big table in the witness; caps leave some room.
    ddr = int(ddr_need * rng.choice([1.0, 1.05, 2.0])) + 4 * MiB
    ssd = int(ssd_need * rng.choice([1.0, 1.5])) + (4 * MiB if ssd_need else 0)
    hw = _custom_hardware(rng, hosts, g, hbm, ddr, ssd)
    hw.pop("constants", None)  # the witness assumes the default cache metadata size
    # Fillers: unconstrained (mostly) small tables filling part of the HBM.
    fill = rng.choice([0.05, 0.3, 0.6])
    n_fill = min(max(0, max_tables - n_big), rng.randint(0, 3 * world + 2))
    fillers = []
    loads = [0] * world
    hbm_rank0 = 0
    witness_by_name: dict[str, dict[str, Any]] = {}
    for t, tier in zip(bigs, choice, strict=True):
        ratio = HBM_CACHE_RATIO if tier == "hbm_cache" else SSD_CACHE_RATIO if tier == "ssd" \
            else None
        witness_by_name[t["name"]] = _tw(t, 0, g, tier, ratio)
        if tier == "hbm_cache":
            rows = t["num_embeddings"]
            w_row = weight_row_bytes(DataType(t["data_type"]), t["embedding_dim"])
            hbm_rank0 += max(1, int(HBM_CACHE_RATIO * rows)) * (w_row + meta)
    loads[0] = hbm_rank0
    for i in range(n_fill):
        t = _table(rng, f"f{i}", fill * world * hbm / max(1, n_fill) * rng.uniform(0.3, 1.0))
        size = _table_bytes(t)
        rank = min(range(world), key=lambda r: loads[r])
        if loads[rank] + size > hbm:
            continue
        loads[rank] += size
        if rng.random() < 0.2:
            t["constraints"] = {"pinned_ranks": sorted({rank, rng.randrange(world)})}
        fillers.append(t)
        witness_by_name[t["name"]] = _tw(t, rank, g)
    tables = bigs + fillers
    rng.shuffle(tables)
    witness = [witness_by_name[t["name"]] for t in tables]
    req = {"model": _model(rng, tables), "hardware": hw, "options": _options(rng, solver)}
    # Any metadata size differs from the default: the witness is re-checked anyway.
    return Instance(0, 0, "big_table", req, witness, witness_in_space=False,
                    notes=[f"{n_big} table(s) of {[round(_table_bytes(t) / hbm, 2) for t in bigs]}"
                           f" x one GPU's HBM, table-wise only, witness tiers {choice}; "
                           f"{len(fillers)} fillers"])


def gen_tight_pins(rng: random.Random, solver: str, max_tables: int) -> Instance:
    """Tables pinned to ranks that leave out some GPUs of some hosts; HBM as tight as the
    witness (largest-first onto the least loaded pinned rank) allows."""
    hosts = rng.choice([2, 3, 3, 4, 5, 8])
    g = rng.choice([2, 4, 8])
    world = hosts * g
    n = max(2, min(max_tables, rng.randint(4, 60)))
    group_dtype = None
    tables = []
    for i in range(n):
        t = _table(rng, f"t{i}", rng.lognormvariate(17, 1.5), group_dtype)
        r = rng.random()
        if r < 0.75:
            hs = rng.sample(range(hosts), rng.randint(1, min(2, hosts)))
            ranks = []
            for h in hs:
                k = rng.randint(1, g - 1) if rng.random() < 0.8 else g
                ranks += [h * g + j for j in rng.sample(range(g), k)]
            c: dict[str, Any] = {"pinned_ranks": sorted(ranks)}
            if rng.random() < 0.3:
                c["sharding_types"] = sorted({"table_wise", *rng.sample(
                    [s.value for s in ShardingType], 2)})
            t["constraints"] = c
        tables.append(t)
    loads = [0] * world
    where: dict[str, int] = {}
    for t in sorted(tables, key=lambda t: (-_table_bytes(t), t["name"])):
        allowed = (t.get("constraints") or {}).get("pinned_ranks") or list(range(world))
        rank = min(allowed, key=lambda r: (loads[r], r))
        loads[rank] += _table_bytes(t)
        where[t["name"]] = rank
    slack = rng.choice([0.0, 0.0, 0.01, 0.1])
    hbm = int(max(loads) * (1 + slack))
    use_preset = rng.random() < 0.3
    if use_preset:
        preset = rng.choice(PRESETS)
        cap, _, pg = _preset(preset)
        if pg != g or hbm >= cap:
            use_preset = False
    if use_preset:
        hw: dict[str, Any] = {"preset": preset, "hosts": hosts,
                              "overrides": {"gpu": {"hbm_reserved_bytes": cap - hbm},
                                            "host": {"ssd_capacity_bytes": 0,
                                                     "ddr_capacity_bytes": 0,
                                                     "ddr_reserved_bytes": 0}}}
    else:
        hw = _custom_hardware(rng, hosts, g, hbm, rng.choice([0, 0, hbm]), 0)
    witness = [_tw(t, where[t["name"]], g) for t in tables]
    req = {"model": _model(rng, tables), "hardware": hw, "options": _options(rng, solver)}
    return Instance(0, 0, "tight_pins", req, witness, witness_in_space=True,
                    notes=[f"{n} tables on {hosts}x{g}, slack {slack}"])


def gen_preset_pins(rng: random.Random, solver: str, max_tables: int) -> Instance:
    """A preset as shipped (h100, h200, zionex_a100) on 1 or 2 hosts, mostly pipelined, with
    realistic table sizes and some tables pinned to a few ranks: CP-SAT's exact model runs."""
    preset = rng.choice(PRESETS)
    hosts = rng.choice([1, 2, 2])
    _, _, g = _preset(preset)
    world = hosts * g
    n = max(1, min(max_tables, rng.randint(3, 40)))
    # Most pins go to one or two hot ranks, so the pinned GPU decides the step time.
    hot = rng.sample(range(world), rng.randint(1, 2))
    tables = []
    for i in range(n):
        t = _table(rng, f"t{i}", 10 ** rng.uniform(5, 10))
        if rng.random() < 0.5:
            ranks = hot if rng.random() < 0.7 else rng.sample(range(world), rng.randint(1, 3))
            c: dict[str, Any] = {"pinned_ranks": sorted(ranks)}
            if rng.random() < 0.3:
                c["sharding_types"] = ["table_wise"]
            t["constraints"] = c
        tables.append(t)
    model = _model(rng, tables)
    model["pipelined"] = rng.random() < 0.7
    req = {"model": model, "hardware": {"preset": preset, "hosts": hosts},
           "options": _options(rng, solver)}
    return Instance(0, 0, "preset_pins", req, notes=[f"{preset} x {hosts}, {n} tables"])


GENERATORS = {"random": gen_random, "infeasible": gen_infeasible, "exact_fit": gen_exact_fit,
              "big_table": gen_big_table, "tight_pins": gen_tight_pins,
              "preset_pins": gen_preset_pins}


def generate(seed: int, index: int, solver: str = "auto", max_tables: int = 300,
             kind: str | None = None) -> Instance:
    """The instance (seed, index): the same pair gives the same request, always."""
    kind = kind or KIND_CYCLE[index % len(KIND_CYCLE)]
    rng = random.Random(f"random_instances:{seed}:{index}:{kind}")
    inst = GENERATORS[kind](rng, solver, max_tables)
    inst.seed, inst.index, inst.kind = seed, index, kind
    inst.request["model"]["name"] = f"rand_s{seed}_i{index}_{kind}"
    if inst.witness is not None:
        _room_for_step_buffers(inst)
    return inst


def _room_for_step_buffers(inst: Instance) -> None:
    """The generators size HBM to the witness's weights, state and caches; the memory model
    also counts each GPU's step buffers (ids, pooled vectors, gradients, staging). Raise the
    HBM capacity by what the witness's fullest GPU then lacks, so the witness still fits
    (exactly, on that GPU)."""
    from planner.plan_build import gpu_totals
    from planner.plan_model import PlanLayout
    from planner.planning import resolve
    from planner.problem import build_problem

    req = resolve(inst.request)
    problem = build_problem(req)
    totals = gpu_totals(PlanLayout(request=req, tables=inst.witness), problem)
    short = max(t.memory.hbm for t in totals) - problem.hbm_cap_reported
    if short <= 0:
        return
    hw = inst.request["hardware"]
    if "gpu" in hw:  # a whole custom spec
        hw["gpu"]["hbm_capacity_bytes"] = int(hw["gpu"]["hbm_capacity_bytes"]) + short
    else:  # a preset: override its capacity
        gpu = hw.setdefault("overrides", {}).setdefault("gpu", {})
        gpu["hbm_capacity_bytes"] = int(req.hardware.gpu.hbm_capacity_bytes) + short
    inst.notes.append(f"HBM raised by {short:,} bytes for the witness's step buffers")


# ----------------------------------------------------------------------------- checking


def _plan_of_layout(request: dict[str, Any], tables: list[dict[str, Any]]) -> Any:
    """A full Plan for a layout, without the planner's candidates (evaluate() needs them and
    may itself refuse the request): cost model and build_plan only, zero lower bound."""
    from planner.bounds import LowerBound
    from planner.plan_build import build_plan
    from planner.plan_model import PlanLayout
    from planner.planning import resolve
    from planner.problem import build_problem

    req = resolve(request)
    layout = PlanLayout(request=req, tables=tables)
    problem = build_problem(req)
    zero = LowerBound(0.0, 0.0, 0.0, 0.0, False, (0.0, 0.0, 0.0))
    return build_plan(layout, problem, zero, "witness", "witness", [], [])


def check_layout(request: dict[str, Any], tables: list[dict[str, Any]]) -> tuple[list[str], Any]:
    """(checker errors, plan) of a hand-made layout."""
    from planner.check import check_plan

    p = _plan_of_layout(request, tables)
    # The witness's summary carries a zero bound made here, not a claim: only the layout's
    # own figures are the witness's to pass.
    return [e for e in check_plan(p).errors if not e.startswith("summary.")], p


def first_fit(request: dict[str, Any]) -> list[dict[str, Any]] | None:
    """An independent placement: tables largest first, each table-wise on the first allowed
    rank and tier (hbm, hbm_cache, ddr, ssd; the smallest cache ratio) that has room, else
    row-wise over every GPU. Memory from cost_models only; None when something does not fit."""
    from planner.planning import resolve
    from planner.problem import build_problem

    req = resolve(request)
    problem = build_problem(req)
    hw = problem.hw
    w, g = hw.world_size, hw.gpus_per_host
    hbm, ddr, ssd = [0] * w, [0] * hw.hosts, [0] * hw.hosts
    tier_opts = [(Tier.HBM, None), (Tier.HBM_CACHE, HBM_CACHE_RATIO), (Tier.DDR, None),
                 (Tier.SSD, SSD_CACHE_RATIO)]
    out: dict[str, dict[str, Any]] = {}
    for t in sorted(problem.tables, key=lambda t: (-t.bytes, t.index)):
        c = t.constraints
        types = set(c.sharding_types or list(ShardingType))
        tiers = [(tier, r) for tier, r in tier_opts
                 if c.memory_tiers is None or tier in c.memory_tiers]
        ranks = sorted(c.pinned_ranks or range(w), key=lambda r: (hbm[r], r))
        rows, dim = t.geom.rows, t.geom.dim
        placed = None
        if ShardingType.TABLE_WISE in types:
            for tier, ratio in tiers:
                m = piece_memory(t.geom, tier, ratio or 1.0, rows, dim, hw)
                for r in ranks:
                    h = r // g
                    if (hbm[r] + m.hbm <= hw.hbm_cap and ddr[h] + m.ddr <= hw.ddr_cap
                            and ssd[h] + m.ssd <= hw.ssd_cap):
                        hbm[r] += m.hbm
                        ddr[h] += m.ddr
                        ssd[h] += m.ssd
                        placed = {"name": t.name, "sharding_type": "table_wise",
                                  "tier": tier.value, "cache_ratio": ratio,
                                  "pieces": [_piece(r, g, rows, dim)]}
                        break
                if placed:
                    break
        if (placed is None and ShardingType.ROW_WISE in types and rows >= w and w > 1
                and (c.pinned_ranks is None or len(set(c.pinned_ranks)) == w)):
            q, rem = divmod(rows, w)
            counts = [q + (1 if i < rem else 0) for i in range(w)]
            for tier, ratio in tiers:
                ms = [piece_memory(t.geom, tier, ratio or 1.0, n, dim, hw) for n in counts]
                ok = all(hbm[r] + ms[r].hbm <= hw.hbm_cap for r in range(w))
                for h in range(hw.hosts):
                    part = ms[h * g:(h + 1) * g]
                    ok = ok and ddr[h] + sum(m.ddr for m in part) <= hw.ddr_cap
                    ok = ok and ssd[h] + sum(m.ssd for m in part) <= hw.ssd_cap
                if ok:
                    off, pieces = 0, []
                    for r in range(w):
                        hbm[r] += ms[r].hbm
                        ddr[r // g] += ms[r].ddr
                        ssd[r // g] += ms[r].ssd
                        pieces.append({"rank": r, "host": r // g, "row_offset": off,
                                       "row_count": counts[r], "col_offset": 0,
                                       "col_count": dim})
                        off += counts[r]
                    placed = {"name": t.name, "sharding_type": "row_wise", "tier": tier.value,
                              "cache_ratio": ratio, "pieces": pieces}
                    break
        if placed is None:
            return None
        out[t.name] = placed
    return [out[t.name] for t in problem.tables]


def _short_tb(exc: BaseException, lines: int = 6) -> str:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    text = "".join(tb).rstrip().splitlines()
    return "\n".join(text[-lines:])


def _plan_json(request: dict[str, Any]) -> str:
    from planner import plan

    return plan(request).model_dump_json()


_SUBPROCESS_CODE = ("import json,sys; from planner import plan; "
                    "sys.stdout.write(plan(json.load(sys.stdin)).model_dump_json())")


def _fresh_process_json(request: dict[str, Any], timeout: float) -> str:
    done = subprocess.run([sys.executable, "-c", _SUBPROCESS_CODE], input=json.dumps(request),
                          capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"fresh process exit {done.returncode}: "
                           f"{done.stderr.strip().splitlines()[-1:] or ''}")
    return done.stdout


def _counter_example(inst: Instance, solver: str) -> tuple[str | None, list[str]]:
    """A valid plan for a request the planner refused: (how it was found, notes)."""
    from planner import plan
    from planner.check import check_plan
    from planner.errors import PlannerError

    notes: list[str] = []
    if inst.witness is not None:
        errs, _ = check_layout(inst.request, inst.witness)
        if not errs:
            return "witness", notes
        notes.append(f"witness rejected: {errs[:2]}")
    for other in ("greedy", "ilp", "auto"):
        if other == solver:
            continue
        req = json.loads(json.dumps(inst.request))
        req["options"]["solver"] = other
        try:
            p = plan(req)
        except PlannerError as exc:
            notes.append(f"solver {other}: {type(exc).__name__}")
            continue
        except Exception as exc:
            notes.append(f"solver {other}: crash {type(exc).__name__}: {exc}")
            continue
        if not check_plan(p).errors:
            return f"solver {other}", notes
    try:
        layout = first_fit(inst.request)
    except Exception as exc:
        notes.append(f"first-fit crashed: {type(exc).__name__}: {exc}")
        layout = None
    if layout is not None:
        errs, _ = check_layout(inst.request, layout)
        if not errs:
            return "first-fit", notes
        notes.append(f"first-fit layout rejected: {errs[:2]}")
    return None, notes


class _NeverRaised(Exception):
    """Stands in for planner.errors.NoPlanFoundError where the planner has none."""


def run_instance(seed: int, index: int, solver: str = "auto", max_tables: int = 300,
                 fresh_process: bool = False, kind: str | None = None,
                 subprocess_timeout: float = 300.0) -> dict[str, Any]:
    """Generate, plan and check one instance; a JSON-able record."""
    import logging

    from planner import plan
    from planner.check import check_plan
    from planner.errors import BadInputError, InfeasibleError, PlannerError

    logging.getLogger("planner").setLevel(logging.WARNING)
    no_plan_error: type[BaseException] = getattr(
        __import__("planner.errors", fromlist=["x"]), "NoPlanFoundError", _NeverRaised)
    rec: dict[str, Any] = {"seed": seed, "index": index, "failures": [], "details": []}
    try:
        inst = generate(seed, index, solver, max_tables, kind)
    except Exception as exc:
        rec.update(kind=kind or KIND_CYCLE[index % len(KIND_CYCLE)], outcome="bad_witness",
                   failures=["bad_witness"], details=[f"generator crashed: {exc!r}"],
                   traceback=_short_tb(exc))
        return rec
    n_tables, n_gpus = inst.size()
    hwi = inst.request["hardware"]
    rec.update(kind=inst.kind, tables=n_tables, hosts=hwi.get("hosts", 1),
               hardware=hwi.get("preset", "custom"),
               solver=inst.request["options"]["solver"],
               pipelined=inst.request["model"]["pipelined"], notes=inst.notes)
    fails: list[str] = rec["failures"]
    details: list[str] = rec["details"]

    def fail(cat: str, detail: str) -> None:
        if cat not in fails:
            fails.append(cat)
        details.append(f"{cat}: {detail}")

    witness_plan = None
    if inst.witness is not None:
        try:
            errs, witness_plan = check_layout(inst.request, inst.witness)
            if errs:
                fail("bad_witness", f"checker rejects the witness: {errs[:3]}")
        except Exception as exc:
            fail("bad_witness", f"witness check crashed: {type(exc).__name__}: {exc}")
            rec["traceback"] = _short_tb(exc)
    t0 = time.perf_counter()
    result: Any = None
    try:
        p = plan(inst.request)
        result = p
    except BadInputError as exc:
        result = exc
        fail("bad_input", str(exc))
    except InfeasibleError as exc:
        result = exc
    except no_plan_error as exc:
        result = exc
    except Exception as exc:
        result = exc
        fail("crash", f"{type(exc).__name__}: {exc}")
        rec["traceback"] = _short_tb(exc)
    rec["plan_s"] = round(time.perf_counter() - t0, 4)
    rec["gpus"] = n_gpus

    if isinstance(result, InfeasibleError | no_plan_error):
        infeasible = isinstance(result, InfeasibleError)
        rec["error"] = f"{type(result).__name__}: {result}"
        if infeasible:
            rec["short_bytes"] = result.short_bytes
            if result.short_bytes is not None and result.short_bytes < 0:
                fail("bad_infeasible_error", f"short_bytes {result.short_bytes}: {result}")
        if inst.kind != "infeasible":
            how, notes = _counter_example(inst, inst.request["options"]["solver"])
            rec["counter_example_notes"] = notes
            if how is not None:
                rec["counter_example"] = how
                fail("false_infeasible" if infeasible else "no_plan_found",
                     f"{type(result).__name__} but a plan exists ({how}): {result}")
        with contextlib.suppress(Exception):  # the same error again
            try:
                plan(inst.request)
                fail("nondeterministic", "second run returned a plan")
            except PlannerError as again:
                if str(again) != str(result):
                    fail("nondeterministic", f"second run: {again}")
    elif hasattr(result, "summary"):
        p = result
        s = p.summary
        rec.update(step_s=s.step_time_s, bound_s=s.lower_bound_s, gap=s.gap, status=s.status,
                   planner_solver=s.solver)
        if inst.kind == "infeasible":
            fail("false_feasible", "a plan for more bytes than the cluster holds")
        try:
            errs = check_plan(p).errors
        except Exception as exc:
            errs = []
            fail("crash", f"check_plan crashed: {type(exc).__name__}: {exc}")
            rec["traceback"] = _short_tb(exc)
        bound_errs = [e for e in errs if e.startswith("lower bound")]
        other = [e for e in errs if not e.startswith("lower bound")]
        if other:
            fail("check_rejects", "; ".join(other[:3]))
        if s.lower_bound_s > s.step_time_s * (1 + 1e-9) or bound_errs:
            fail("bound_above_step", f"bound {s.lower_bound_s!r} > step {s.step_time_s!r} "
                                     f"(status {s.status})")
        if (witness_plan is not None and inst.witness_in_space
                and "bad_witness" not in fails):
            ws = witness_plan.summary.step_time_s
            rec["witness_step_s"] = ws
            if s.lower_bound_s > ws * (1 + 1e-9):
                fail("bound_above_witness", f"bound {s.lower_bound_s!r} > the witness's step "
                                            f"{ws!r} (status {s.status})")
        try:
            first = p.model_dump_json()
            again = _plan_json(inst.request)
            if again != first:
                fail("nondeterministic", "a second in-process plan differs")
            if fresh_process:
                fresh = _fresh_process_json(inst.request, subprocess_timeout)
                rec["fresh_process_checked"] = True
                if fresh != first:
                    fail("nondeterministic", "a plan from a fresh interpreter differs")
        except Exception as exc:
            fail("nondeterministic", f"re-planning raised {type(exc).__name__}: {exc}")
    for cat in OUTCOMES:
        if cat in fails:
            rec["outcome"] = cat
            break
    else:
        rec["outcome"] = "ok"
        if isinstance(result, InfeasibleError):
            rec["ok_kind"] = "infeasible"
        elif isinstance(result, no_plan_error):
            rec["ok_kind"] = "no plan found (no counter-example)"
        else:
            rec["ok_kind"] = "plan"
    return rec


# ----------------------------------------------------------------------------- the run


def _fresh(index: int, every: int) -> bool:
    """Every k-th instance, the offset rotating so that every kind gets its turn."""
    return every > 0 and index % every == (index // every) % min(every, len(KIND_CYCLE))


def run_many(seed: int, indices: list[int], solver: str, jobs: int, max_tables: int,
             fresh_every: int, timeout_s: float, kind: str | None = None,
             progress: bool = True) -> list[dict[str, Any]]:
    """Every instance in a worker process with a wall-clock limit (pebble)."""
    from concurrent.futures import TimeoutError as FutTimeout

    from pebble import ProcessPool

    records: dict[int, dict[str, Any]] = {}
    t0 = time.perf_counter()
    with ProcessPool(max_workers=max(1, jobs), max_tasks=20) as pool:
        futures = {i: pool.schedule(run_instance, args=(
            seed, i, solver, max_tables, _fresh(i, fresh_every), kind),
            timeout=timeout_s) for i in indices}
        for n, (i, fut) in enumerate(futures.items(), 1):
            try:
                rec = fut.result()
            except FutTimeout:
                inst = generate(seed, i, solver, max_tables, kind)
                nt, ng = inst.size()
                rec = {"seed": seed, "index": i, "kind": inst.kind, "tables": nt, "gpus": ng,
                       "hosts": inst.request["hardware"].get("hosts", 1),
                       "solver": inst.request["options"]["solver"],
                       "outcome": "timeout", "failures": ["timeout"],
                       "details": [f"timeout: over {timeout_s} s wall (plan + checks)"],
                       "plan_s": timeout_s}
            except Exception as exc:
                rec = {"seed": seed, "index": i, "outcome": "crash", "failures": ["crash"],
                       "details": [f"crash: worker died: {type(exc).__name__}: {exc}"],
                       "plan_s": 0.0, "kind": "?"}
            records[i] = rec
            if progress:
                print(f"[{n}/{len(indices)} {time.perf_counter() - t0:6.0f}s] #{i} "
                      f"{rec.get('kind')} {rec.get('tables')}t/{rec.get('gpus')}g "
                      f"{rec['outcome']} {rec.get('plan_s', 0):.2f}s"
                      + (f"  {rec['details'][0][:140]}" if rec["details"] else ""),
                      file=sys.stderr, flush=True)
    return [records[i] for i in indices]


def repro_command(rec: dict[str, Any], solver: str, max_tables: int,
                  kind: str | None = None) -> str:
    path = f"/tmp/repro/s{rec['seed']}_i{rec['index']}.json"
    dump = (f"python -m benchmarks.random_instances --seed {rec['seed']} --only {rec['index']}"
            f"{f' --kind {kind}' if kind else ''}"
            f"{'' if solver == 'auto' else f' --solver {solver}'}"
            f"{'' if max_tables == 300 else f' --max-tables {max_tables}'} --dump /tmp/repro")
    run = (f"python -c \"import json; from planner import plan; "
           f"print(plan(json.load(open('{path}'))['request']).summary)\"")
    return f"{dump} && {run}"


def summarize(records: list[dict[str, Any]], args: dict[str, Any]) -> dict[str, Any]:
    counts = Counter(r["outcome"] for r in records)
    flagged = Counter(c for r in records for c in r["failures"])
    by_kind: dict[str, Counter[str]] = {}
    for r in records:
        by_kind.setdefault(r.get("kind", "?"), Counter())[r["outcome"]] += 1
    examples: dict[str, list[dict[str, Any]]] = {}
    for cat in OUTCOMES:
        if cat == "ok":
            continue
        hits = [r for r in records if cat in r["failures"]]
        hits.sort(key=lambda r: ((r.get("tables") or 0) * (r.get("gpus") or 0), r["index"]))
        examples[cat] = [{
            "index": r["index"], "kind": r.get("kind"), "tables": r.get("tables"),
            "gpus": r.get("gpus"), "hosts": r.get("hosts"), "solver": r.get("solver"),
            "detail": next((d for d in r["details"] if d.startswith(cat)), "")[:400],
            "traceback": r.get("traceback", ""),
            "repro": repro_command(r, args["solver"], args["max_tables"], args.get("kind")),
        } for r in hits[:3]]
    slow = sorted(records, key=lambda r: -(r.get("plan_s") or 0))[:5]
    times = sorted(r.get("plan_s") or 0 for r in records)
    return {
        "counts": {k: counts.get(k, 0) for k in OUTCOMES},
        "flagged": {k: flagged.get(k, 0) for k in OUTCOMES if k != "ok"},
        "ok_kinds": dict(Counter(r.get("ok_kind") for r in records if r["outcome"] == "ok")),
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "examples": {k: v for k, v in examples.items() if v},
        "slowest": [{"index": r["index"], "kind": r.get("kind"), "tables": r.get("tables"),
                     "gpus": r.get("gpus"), "solver": r.get("solver"),
                     "plan_s": r.get("plan_s"), "outcome": r["outcome"]} for r in slow],
        "plan_s_median": times[len(times) // 2] if times else 0.0,
        "plan_s_total": round(sum(times), 2),
        "fresh_process_checked": sum(1 for r in records if r.get("fresh_process_checked")),
    }


def markdown(summary: dict[str, Any], args: dict[str, Any], meta: dict[str, Any]) -> str:
    out = ["# Random instances", "",
           f"`{meta['command']}`", "",
           f"{args['n']} instances from seed {args['seed']}, solver `{args['solver']}`, "
           f"kinds cycled as {', '.join(KIND_CYCLE)}; up to {args['max_tables']} tables, "
           f"1 to 8 hosts. Commit {meta.get('commit')}"
           f"{' (dirty tree: other edits in progress)' if meta.get('dirty') else ''}"
           f", {meta['jobs']} worker(s), wall {meta['wall_s']:.0f} s, "
           f"{summary['fresh_process_checked']} plans also re-made in a fresh interpreter.", "",
           "## Outcomes", "",
           "| outcome | instances (first failure) | instances flagged |", "|---|---:|---:|"]
    for k in OUTCOMES:
        flagged = summary["flagged"].get(k, "")
        out.append(f"| {k} | {summary['counts'][k]} | {flagged} |")
    out += ["", f"ok: {summary['ok_kinds']}", "", "## By kind", "",
            "| kind | outcomes |", "|---|---|"]
    for kind, c in summary["by_kind"].items():
        out.append(f"| {kind} | {', '.join(f'{k} {v}' for k, v in sorted(c.items()))} |")
    out += ["", "## Failures: the smallest instances of each category", ""]
    if not summary["examples"]:
        out.append("None.")
    for cat, exs in summary["examples"].items():
        out += [f"### {cat}", ""]
        for e in exs:
            out += [f"- #{e['index']} ({e['kind']}, {e['tables']} tables, {e['gpus']} GPUs, "
                    f"solver {e['solver']}): {e['detail']}", "",
                    f"  `{e['repro']}`", ""]
            if e["traceback"]:
                out += ["  ```", *("  " + x for x in e["traceback"].splitlines()), "  ```", ""]
    out += ["## The 5 slowest instances (plan() wall time)", "",
            "| # | kind | tables | GPUs | solver | plan s | outcome |",
            "|---:|---|---:|---:|---|---:|---|"]
    for r in summary["slowest"]:
        out.append(f"| {r['index']} | {r['kind']} | {r['tables']} | {r['gpus']} | "
                   f"{r['solver']} | {r['plan_s']} | {r['outcome']} |")
    out += ["", f"Median plan() time {summary['plan_s_median']} s; total "
                f"{summary['plan_s_total']} s.", ""]
    return "\n".join(out)


def _meta(args: argparse.Namespace, wall: float, argv: list[str]) -> dict[str, Any]:
    commit, dirty = None, None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                                text=True, timeout=10, check=False).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                    cwd=REPO_ROOT, capture_output=True, text=True, timeout=10,
                                    check=False).stdout.strip())
    # A run from an exported tree (git archive) names its commit in RANDOM_INSTANCES_COMMIT.
    commit = commit or os.environ.get("RANDOM_INSTANCES_COMMIT")
    return {"command": "python -m benchmarks.random_instances " + " ".join(argv),
            "commit": commit, "dirty": dirty, "jobs": args.jobs, "wall_s": wall,
            "python": sys.version.split()[0]}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m benchmarks.random_instances",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300, help="instances (indices 0..n-1)")
    ap.add_argument("--start", type=int, default=0, help="first index")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--solver", default="auto", choices=["auto", "greedy", "ilp", "mixed"])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--kind", choices=KINDS, default=None, help="only this kind")
    ap.add_argument("--max-tables", type=int, default=300)
    ap.add_argument("--fresh-every", type=int, default=25,
                    help="re-plan every k-th instance in a fresh interpreter (0: never)")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="wall-clock seconds per instance (plan, re-plans and checks)")
    ap.add_argument("--only", type=int, nargs="*", default=None,
                    help="run just these indices (in this process) and print their records")
    ap.add_argument("--dump", default=None,
                    help="with --only: write each instance's request and witness to DIR")
    ap.add_argument("-o", "--output", default=None, help="JSON results (a .md goes next to it)")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.only is not None:
        for i in args.only:
            inst = generate(args.seed, i, args.solver, args.max_tables, args.kind)
            if args.dump:
                d = Path(args.dump)
                d.mkdir(parents=True, exist_ok=True)
                path = d / f"s{args.seed}_i{i}.json"
                path.write_text(json.dumps({"kind": inst.kind, "notes": inst.notes,
                                            "request": inst.request, "witness": inst.witness},
                                           indent=1) + "\n")
                print(f"wrote {path}", file=sys.stderr)
            rec = run_instance(args.seed, i, args.solver, args.max_tables, True, args.kind)
            print(json.dumps(rec, indent=1))
        return 0
    t0 = time.perf_counter()
    indices = list(range(args.start, args.start + args.n))
    records = run_many(args.seed, indices, args.solver, args.jobs, args.max_tables,
                       args.fresh_every, args.timeout, args.kind, progress=not args.quiet)
    wall = time.perf_counter() - t0
    cfg = {"n": args.n, "start": args.start, "seed": args.seed, "solver": args.solver,
           "max_tables": args.max_tables, "kind": args.kind}
    summary = summarize(records, cfg)
    meta = _meta(args, wall, argv)
    md = markdown(summary, cfg, meta)
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"config": cfg, "meta": meta, "summary": summary,
                                   "instances": records}, indent=1, sort_keys=True) + "\n")
        out.with_suffix(".md").write_text(md)
    buf = io.StringIO()
    buf.write(md)
    print(buf.getvalue())
    bad = sum(summary["flagged"].get(k, 0) for k in PLANNER_FAILURES + GENERATOR_FAILURES)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
