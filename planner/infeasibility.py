"""Certificates for "no plan fits": capacity arguments anyone can recompute from the request.

Each certificate is a claim over the planner's candidate space (every sharding type, column
split, tier and cache ratio the table's constraints allow, as `enumerate_candidates` lists
them with every tier on and nothing dropped for not fitting):
- `step-buffers`: the step buffers every GPU holds as the owner of its samples (ids, pooled
  vectors, their gradients, all-to-all staging; cost_models.owner_buffers) alone fill its
  free HBM;
- `no-allowed-shape`: the table's constraints (types, tiers, pins) leave no candidate at all;
- `table`: every candidate of one table has a piece larger than a cap it must fit under on an
  empty cluster (HBM per GPU, DDR or SSD per host); `short_bytes` is the least excess over
  all its candidates, so it is always positive;
- `pinned-set`: the tables pinned inside a set of ranks need, each at its least, more bytes of
  HBM (or DDR, SSD, or all three together) than those ranks (and their hosts) hold;
- `cluster`: the same over all tables and the whole cluster;
- `cp-sat`: CP-SAT proved the feasibility model (caps and pins only, no objective) INFEASIBLE.

`verify_certificate` recomputes a certificate from the request alone; the tests call it on
every "infeasible" answer.
"""

import logging
from typing import Literal

from pydantic import BaseModel, ConfigDict

from cost_models import ShardingType
from planner.candidates import (
    COLUMN_SPLIT_TYPES,
    Candidate,
    Scope,
    enumerate_candidates,
    least_bytes,
    min_column_width,
    why_no_shape,
)
from planner.errors import InfeasibleError
from planner.problem import Problem, TableInfo

CertificateKind = Literal["step-buffers", "no-allowed-shape", "table", "pinned-set", "cluster",
                          "cp-sat"]


class InfeasibilityCertificate(BaseModel):
    """Why no plan exists, in figures a skeptic can recompute (`verify_certificate`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: CertificateKind
    cap: str
    need_bytes: int = 0
    have_bytes: int = 0
    short_bytes: int = 0
    table: str | None = None
    tables: list[str] = []
    ranks: list[int] = []
    candidates: int = 0  # candidates the argument covers
    detail: str = ""


def every_candidate(problem: Problem, t: TableInfo) -> list[Candidate]:
    """The certificate's candidate space for one table: every tier, nothing dropped."""
    return enumerate_candidates(problem, t, slow_tiers=True, keep_unfit=True)


def excess(problem: Problem, c: Candidate) -> tuple[int, str]:
    """By how many bytes the candidate's worst piece (or per-host share) passes its cap on an
    empty cluster, and which cap; <= 0 when it fits alone."""
    hw = problem.hw
    worst = (c.max_piece_hbm - hw.hbm_cap, "HBM per GPU")
    for grp in c.groups:
        if c.scope is Scope.WORLD:
            ddr = int(grp.ddr.reshape(hw.hosts, -1).sum(axis=1).max())
            ssd = int(grp.ssd.reshape(hw.hosts, -1).sum(axis=1).max())
        elif c.scope is Scope.GPU:
            ddr, ssd = int(grp.ddr.max()), int(grp.ssd.max())
        else:
            ddr, ssd = int(grp.ddr.sum()), int(grp.ssd.sum())
        worst = max(worst, (ddr - hw.ddr_cap, "DDR per host"), (ssd - hw.ssd_cap, "SSD per host"))
    return worst



def table_certificate(problem: Problem, t: TableInfo) -> InfeasibilityCertificate | None:
    """A certificate that this table alone cannot be placed, or None if it can."""
    if least_bytes(problem, t) is not None:
        return None
    # No candidate fits an empty cluster, so every one of these has a positive excess.
    every = every_candidate(problem, t)
    if not every:
        return InfeasibilityCertificate(
            kind="no-allowed-shape", cap="constraints", table=t.name,
            detail=why_no_shape(problem, t))
    short, cap = min(excess(problem, x) for x in every)
    best = min(every, key=lambda x: excess(problem, x))
    need = short + _cap_bytes(problem, cap)
    return InfeasibilityCertificate(
        kind="table", cap=cap, table=t.name, need_bytes=need, have_bytes=need - short,
        short_bytes=short, candidates=len(every),
        detail=f"its least-excess candidate is {best.label}{_width_note(t)}")


def _width_note(t: TableInfo) -> str:
    """The minimum chunk width the candidates were held to, where the table may be split by
    columns (a narrower one, where the request allows it, needs less per GPU)."""
    c = t.constraints
    if not (set(c.sharding_types or list(ShardingType)) & COLUMN_SPLIT_TYPES):
        return ""
    min_w = min_column_width(c)
    return (f"; column chunks no narrower than {min_w} columns (min_column_shard_width"
            f"{'' if c.min_column_shard_width else ', default'} {min_w})")


def _cap_bytes(problem: Problem, cap: str) -> int:
    hw = problem.hw
    return {"HBM per GPU": hw.hbm_cap, "DDR per host": hw.ddr_cap,
            "SSD per host": hw.ssd_cap}[cap]


# The resources a set of tables can be short of: per axis, the least bytes each table needs
# there in any candidate, summed, against what the ranks (and their hosts) hold.
_AXES = ("HBM", "DDR", "SSD", "HBM+DDR+SSD")


def _lean(problem: Problem, tables: list[TableInfo]) -> tuple[list[int], int]:
    """Per axis, the bytes the tables need at least (each table at its own least on that
    axis, from the pieces' bytes alone), and the fitting candidates that covers."""
    need, seen = [0, 0, 0, 0], 0
    for t in tables:
        least = least_bytes(problem, t)
        if least is None:
            continue
        seen += least.candidates
        for k, x in enumerate((least.hbm, least.ddr, least.ssd, least.total)):
            need[k] += x
    return need, seen


def _lean_costed(problem: Problem, tables: list[TableInfo]) -> list[int]:
    """_lean's need over the costed candidates themselves (enumerate_candidates, every tier):
    the verifier's own arithmetic, apart from least_bytes'."""
    need = [0, 0, 0, 0]
    for t in tables:
        every = enumerate_candidates(problem, t, slow_tiers=True)
        if every:
            need[0] += min(x.hbm_total for x in every)
            need[1] += min(x.ddr_total for x in every)
            need[2] += min(x.ssd_total for x in every)
            need[3] += min(x.total_bytes for x in every)
    return need


def _capacity(problem: Problem, ranks: list[int]) -> list[int]:
    hw = problem.hw
    hosts = len({r // hw.gpus_per_host for r in ranks})
    have = [len(ranks) * hw.hbm_cap, hosts * hw.ddr_cap, hosts * hw.ssd_cap]
    return [*have, sum(have)]


def _set_certificate(problem: Problem, tables: list[TableInfo], ranks: list[int],
                     kind: CertificateKind, where: str, detail: str
                     ) -> InfeasibilityCertificate | None:
    need, seen = _lean(problem, tables)
    have = _capacity(problem, ranks)
    for axis, n, h in zip(_AXES, need, have, strict=True):
        if n > h:
            return InfeasibilityCertificate(
                kind=kind, cap=f"{axis} of {where}", need_bytes=n, have_bytes=h,
                short_bytes=n - h, tables=[t.name for t in tables] if kind != "cluster" else [],
                ranks=ranks if kind != "cluster" else [], candidates=seen, detail=detail)
    return None


def _pinned_inside(problem: Problem, ranks: list[int]) -> list[TableInfo]:
    return [t for t in problem.tables if t.constraints.pinned_ranks
            and set(t.constraints.pinned_ranks) <= set(ranks)]


def _buffers_certificate(problem: Problem) -> InfeasibilityCertificate | None:
    need, have = problem.step_reserve.total, problem.hbm_cap_reported
    if need < have:
        return None
    return InfeasibilityCertificate(
        kind="step-buffers", cap="HBM per GPU", need_bytes=need, have_bytes=have,
        short_bytes=need - have + 1,
        detail=(f"the step buffers of {problem.model.batch_per_gpu} samples per GPU over "
                f"{len(problem.tables)} tables leave no HBM for pieces: lower the batch"))


def capacity_certificate(problem: Problem) -> InfeasibilityCertificate | None:
    """The first capacity argument that holds: the step buffers, one table, a pinned set,
    the whole cluster. Bytes alone decide them: no candidate's time is costed."""
    cert = _buffers_certificate(problem)
    if cert is not None:
        return cert
    for t in problem.tables:
        cert = table_certificate(problem, t)
        if cert is not None:
            return cert
    pin_sets = sorted({tuple(sorted(t.constraints.pinned_ranks)) for t in problem.tables
                       if t.constraints.pinned_ranks})
    for pins in pin_sets:
        ranks = list(pins)
        cert = _set_certificate(problem, _pinned_inside(problem, ranks), ranks, "pinned-set",
                                f"ranks {ranks} (their hosts for DDR and SSD)",
                                "tables pinned inside these ranks, each at its least")
        if cert is not None:
            return cert
    return _set_certificate(problem, list(problem.tables), list(range(problem.hw.world_size)),
                            "cluster", "the cluster", "all tables, each at its least")


def describe(cert: InfeasibilityCertificate) -> str:
    """One line for the CLI and the service."""
    if cert.kind == "no-allowed-shape":
        return f"table '{cert.table}': its constraints allow no sharding here ({cert.detail})"
    if cert.kind == "step-buffers":
        return (f"every GPU needs {cert.need_bytes:,} bytes of HBM for step buffers, its cap "
                f"is {cert.have_bytes:,} ({cert.detail})")
    if cert.kind == "cp-sat":
        return f"CP-SAT proved that no assignment of the candidates fits ({cert.detail})"
    who = {"table": f"table '{cert.table}' needs", "cluster": "all tables together need",
           "pinned-set": f"{len(cert.tables)} pinned tables need"}[cert.kind]
    return (f"{who} at least {cert.need_bytes:,} bytes of {cert.cap}, which holds "
            f"{cert.have_bytes:,} (short by {cert.short_bytes:,} bytes; over "
            f"{cert.candidates:,} candidates: {cert.detail})")


def verify_certificate(problem: Problem, cert: InfeasibilityCertificate,
                       budget_s: float = 10.0) -> list[str]:
    """Recompute the certificate from the problem alone; [] when it holds, else what differs.
    A `cp-sat` certificate is re-proved by a fresh solve of the feasibility model."""
    errs: list[str] = []
    if cert.kind == "step-buffers":
        again = _buffers_certificate(problem)
        if again != cert:
            errs.append(f"recomputed step buffers {problem.step_reserve.total:,} bytes against "
                        f"{problem.hbm_cap_reported:,}; the certificate says "
                        f"{cert.need_bytes:,} against {cert.have_bytes:,}")
        return errs
    if cert.kind in ("no-allowed-shape", "table"):
        t = next((x for x in problem.tables if x.name == cert.table), None)
        if t is None:
            return [f"certificate names table '{cert.table}', which the request lacks"]
        again = table_certificate(problem, t)
        if again is None or enumerate_candidates(problem, t, slow_tiers=True):
            errs.append(f"table '{cert.table}' has a candidate that fits an empty cluster")
        elif again != cert:
            errs.append(f"recomputed {again.model_dump()} differs from {cert.model_dump()}")
    elif cert.kind in ("pinned-set", "cluster"):
        ranks = cert.ranks if cert.kind == "pinned-set" else list(range(problem.hw.world_size))
        tables = (_pinned_inside(problem, ranks) if cert.kind == "pinned-set"
                  else list(problem.tables))
        need = _lean_costed(problem, tables)
        have = _capacity(problem, ranks)
        axis = cert.cap.split(" of ")[0]
        if axis not in _AXES:
            errs.append(f"certificate names an unknown cap '{cert.cap}'")
        else:
            k = _AXES.index(axis)
            if (need[k], have[k]) != (cert.need_bytes, cert.have_bytes) or need[k] <= have[k]:
                errs.append(f"recomputed {axis} need {need[k]:,} and capacity {have[k]:,} "
                            f"bytes; the certificate says {cert.need_bytes:,} and "
                            f"{cert.have_bytes:,}")
    else:
        from planner.feasibility import feasibility_status

        status = feasibility_status(problem, budget_s)
        if status != "infeasible":
            errs.append(f"re-solving the feasibility model gave '{status}', not infeasible")
    if cert.kind in ("table", "pinned-set", "cluster") and (
            cert.short_bytes <= 0 or cert.short_bytes != cert.need_bytes - cert.have_bytes):
        errs.append(f"short_bytes {cert.short_bytes} is not need - have > 0")
    return errs


def infeasible_error(problem: Problem, cert: InfeasibilityCertificate | None = None
                     ) -> InfeasibleError:
    """The answer "infeasible", with its certificate (a capacity argument when none given)."""
    cert = cert or capacity_certificate(problem)
    if cert is None:  # the callers only get here when a capacity argument holds
        raise AssertionError("infeasible without a certificate")
    logging.getLogger("planner").info("infeasible: %s", describe(cert))
    return InfeasibleError(reason=describe(cert), table=cert.table, cap=cert.cap,
                           short_bytes=cert.short_bytes if cert.kind != "cp-sat" else None,
                           certificate=cert.model_dump(mode="json"))
