"""`planner diff A.json B.json`: what differs between two plans of the same model, per table
and per GPU, and what it costs.

A plan without its per-GPU figures (a hand-made or imported layout, e.g. TorchRec's) is scored
first with planning.evaluate, so both sides are under the same cost model. A table differs
when its sharding type, tier, cache ratio or any piece (rank, rows, columns) differs; a GPU
differs when its set of pieces changed, or when its figures changed without any piece moving
(the owner side of the all-to-alls depends on where other hosts' pieces are).
"""

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from planner.plan_model import EvaluateInput, GpuReport, Plan, PlanLayout, TablePlan
from planner.planning import evaluate

# Relative change below this is float noise, not a difference.
_REL = 1e-9
_TERMS = ("lookup_s", "backward_s", "cache_miss_s", "input_a2a_s", "output_a2a_s",
          "owner_a2a_s", "allreduce_s")


@dataclass
class TableDiff:
    name: str
    change: str  # moved | resharded | retiered | only in A | only in B
    a: str | None  # "table_wise hbm on 3"
    b: str | None
    ranks_a: list[int]
    ranks_b: list[int]


@dataclass
class GpuDiff:
    rank: int
    host: int
    total_a_s: float | None
    total_b_s: float | None
    hbm_a: int | None
    hbm_b: int | None
    tables_out: list[str]  # had pieces of these in A, not (the same) in B
    tables_in: list[str]
    terms_delta_s: dict[str, float]  # B - A per cost term, only those that changed
    pieces_moved: bool  # False: only its figures changed

    @property
    def delta_s(self) -> float | None:
        if self.total_a_s is None or self.total_b_s is None:
            return None
        return self.total_b_s - self.total_a_s


@dataclass
class PlanDiff:
    step_a_s: float
    step_b_s: float
    bound_a_s: float
    bound_b_s: float
    slowest_a: int
    slowest_b: int
    tables: list[TableDiff]
    gpus: list[GpuDiff]
    request_notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for g, gd in zip(d["gpus"], self.gpus, strict=True):
            g["delta_s"] = gd.delta_s
        d["step_delta_s"] = self.step_b_s - self.step_a_s
        return d


def as_plan(given: EvaluateInput) -> Plan:
    """A full plan: as given when it has its figures, else scored by planning.evaluate."""
    if given.gpus is not None and given.summary is not None and given.hosts is not None \
            and given.plan_hash is not None:
        return Plan.model_validate(given.model_dump())
    return evaluate(PlanLayout(schema_version=given.schema_version, request=given.request,
                               tables=given.tables))


def _describe(tp: TablePlan) -> str:
    ratio = f" cache {tp.cache_ratio:g}" if tp.cache_ratio is not None else ""
    ranks = sorted({p.rank for p in tp.pieces})
    where = ", ".join(map(str, ranks[:6])) + (f" ... ({len(ranks)} GPUs)" if len(ranks) > 6
                                               else "")
    return f"{tp.sharding_type.value} {tp.tier.value}{ratio} on {where}"


def _pieces(tp: TablePlan) -> list[tuple[int, int, int, int, int]]:
    return sorted((p.rank, p.row_offset, p.row_count, p.col_offset, p.col_count)
                  for p in tp.pieces)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= _REL * max(abs(a), abs(b), 1e-15)


def diff_plans(a: Plan, b: Plan) -> PlanDiff:
    notes = []
    ra, rb = a.request, b.request
    if ra.model != rb.model:
        notes.append("the plans answer different models")
    if ra.hardware != rb.hardware:
        ha, hb = ra.hardware, rb.hardware
        notes.append(f"different hardware: {ha.hosts} x {ha.gpus_per_host} {ha.gpu.name} vs "
                     f"{hb.hosts} x {hb.gpus_per_host} {hb.gpu.name}")
    ta = {t.name: t for t in a.tables}
    tb = {t.name: t for t in b.tables}
    tables: list[TableDiff] = []
    # per rank: which tables' pieces (as tuples) sit there, to find the GPUs that changed
    on_a: dict[int, set[tuple[Any, ...]]] = defaultdict(set)
    on_b: dict[int, set[tuple[Any, ...]]] = defaultdict(set)
    for src, on in ((a.tables, on_a), (b.tables, on_b)):
        for tp in src:
            for p in tp.pieces:
                on[p.rank].add((tp.name, tp.sharding_type.value, tp.tier.value,
                                tp.cache_ratio, p.row_offset, p.row_count, p.col_offset,
                                p.col_count))
    for name in [*ta, *(n for n in tb if n not in ta)]:
        x, y = ta.get(name), tb.get(name)
        if x is None or y is None:
            tables.append(TableDiff(name, "only in B" if x is None else "only in A",
                                    _describe(x) if x else None, _describe(y) if y else None,
                                    sorted({p.rank for p in x.pieces}) if x else [],
                                    sorted({p.rank for p in y.pieces}) if y else []))
            continue
        if x.sharding_type != y.sharding_type:
            change = "resharded"
        elif x.tier != y.tier or x.cache_ratio != y.cache_ratio:
            change = "retiered"
        elif _pieces(x) != _pieces(y):
            geo_x = sorted(p[1:] for p in _pieces(x))
            geo_y = sorted(p[1:] for p in _pieces(y))
            change = "moved" if geo_x == geo_y else "resharded"
        else:
            continue
        tables.append(TableDiff(name, change, _describe(x), _describe(y),
                                sorted({p.rank for p in x.pieces}),
                                sorted({p.rank for p in y.pieces})))
    ga = {g.rank: g for g in a.gpus}
    gb = {g.rank: g for g in b.gpus}
    gpus: list[GpuDiff] = []
    for rank in sorted(set(ga) | set(gb)):
        x2, y2 = ga.get(rank), gb.get(rank)
        moved = on_a.get(rank, set()) != on_b.get(rank, set())
        out_names = sorted({e[0] for e in on_a.get(rank, set()) - on_b.get(rank, set())})
        in_names = sorted({e[0] for e in on_b.get(rank, set()) - on_a.get(rank, set())})
        terms = _terms_delta(x2, y2)
        same_figures = (x2 is not None and y2 is not None and not terms
                        and _close(x2.cost.total_s, y2.cost.total_s)
                        and x2.hbm_bytes == y2.hbm_bytes and x2.ddr_bytes == y2.ddr_bytes
                        and x2.ssd_bytes == y2.ssd_bytes)
        if not moved and same_figures:
            continue
        host = (x2 or y2).host  # type: ignore[union-attr]
        gpus.append(GpuDiff(rank, host, x2.cost.total_s if x2 else None,
                            y2.cost.total_s if y2 else None, x2.hbm_bytes if x2 else None,
                            y2.hbm_bytes if y2 else None, out_names, in_names, terms, moved))
    return PlanDiff(a.summary.step_time_s, b.summary.step_time_s, a.summary.lower_bound_s,
                    b.summary.lower_bound_s, _slowest(a), _slowest(b), tables, gpus, notes)


def _slowest(p: Plan) -> int:
    return max(p.gpus, key=lambda g: (g.cost.total_s, -g.rank)).rank


def _terms_delta(x: GpuReport | None, y: GpuReport | None) -> dict[str, float]:
    if x is None or y is None:
        return {}
    out = {}
    for t in _TERMS:
        va, vb = getattr(x.cost, t), getattr(y.cost, t)
        if not _close(va, vb):
            out[t] = vb - va
    return out


def _ms(s: float | None) -> str:
    return "-" if s is None or math.isnan(s) else f"{s * 1e3:,.4f}"


def diff_section(d: PlanDiff, other: str, this: str = "this plan") -> str:
    """The diff as a report section: A is `other`, B is `this`."""
    import plotly.graph_objects as go

    from planner.report_html import esc, fig_html, section

    head = (f"<p>{esc(other)} (A): step {_ms(d.step_a_s)} ms, slowest GPU {d.slowest_a}; "
            f"{esc(this)} (B): step {_ms(d.step_b_s)} ms, slowest GPU {d.slowest_b}; "
            f"<b>{(d.step_b_s - d.step_a_s) * 1e3:+.4f} ms</b>. Bound {_ms(d.bound_a_s)} -> "
            f"{_ms(d.bound_b_s)} ms.</p>"
            + "".join(f"<p class=\"warn\">{esc(n)}</p>" for n in d.request_notes))
    if not d.tables and not d.gpus:
        return section("Difference from another plan", head + "<p>No difference.</p>", "diff")
    trows = "".join(f"<tr><td>{esc(t.name)}</td><td>{t.change}</td><td>{esc(t.a or '-')}</td>"
                    f"<td>{esc(t.b or '-')}</td></tr>" for t in d.tables)
    grows = "".join(
        f"<tr><td class=\"n\">{g.rank}</td><td class=\"n\">{g.host}</td>"
        f"<td class=\"n\">{_ms(g.total_a_s)}</td><td class=\"n\">{_ms(g.total_b_s)}</td>"
        f"<td class=\"n\">{'-' if g.delta_s is None else f'{g.delta_s * 1e3:+.4f}'}</td>"
        f"<td>{esc(', '.join(g.tables_out[:6]))}</td><td>{esc(', '.join(g.tables_in[:6]))}</td>"
        f"<td>{esc(', '.join(f'{k[:-2]} {v * 1e3:+.4f}' for k, v in g.terms_delta_s.items()))}"
        f"</td></tr>" for g in d.gpus)
    fig = go.Figure()
    x = [str(g.rank) for g in d.gpus]
    fig.add_bar(x=x, y=[(g.total_a_s or 0) * 1e3 for g in d.gpus], name="A",
                marker_color="#9ca3af")
    fig.add_bar(x=x, y=[(g.total_b_s or 0) * 1e3 for g in d.gpus], name="B",
                marker_color="#4c78a8")
    fig.update_layout(barmode="group", height=300, xaxis_type="category",
                      xaxis_title="GPU rank (those that differ)", yaxis_title="ms per step",
                      margin={"t": 30, "l": 60, "r": 20, "b": 40})
    body = (head + fig_html(fig, "diff-bars")
            + f"<h3>{len(d.tables)} table(s) differ</h3><div class=\"scroll\"><table class=\"t\">"
            "<thead><tr><th>table</th><th>change</th><th>A</th><th>B</th></tr></thead><tbody>"
            + trows + "</tbody></table></div>"
            + f"<h3>{len(d.gpus)} GPU(s) differ</h3><div class=\"scroll\"><table class=\"t\">"
            "<thead><tr><th>rank</th><th>host</th><th>A ms</th><th>B ms</th><th>delta ms</th>"
            "<th>tables out</th><th>tables in</th><th>terms (ms)</th></tr></thead><tbody>"
            + grows + "</tbody></table></div>")
    return section("Difference from another plan", body, "diff")


def diff_page(d: PlanDiff, a_name: str, b_name: str) -> str:
    from planner.report_html import page

    return page("Plan diff", f"A: {a_name}; B: {b_name}", [diff_section(d, a_name, b_name)])
