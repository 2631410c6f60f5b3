"""`planner report PLAN.json -o report.html`: one self-contained HTML page of a plan.

Plots are plotly figures; plotly.js is inlined once, so the page opens with no network (no
CDN, no fonts, no MathJax). Sections: per-GPU cost terms (stacked, with the lower bound and
the mean, the slowest GPU marked), per-GPU memory per term against the cap (and per-host DDR
and SSD), per-host NVLink and NIC bytes, a table x GPU placement map, the sharding-type and
tier mix, the solver's incumbent and bound over its deterministic time, and a per-table list
with explanations (planner.explain). Figures not stored in the plan (per-piece bytes and
memory terms) are recomputed from its request with the cost model, and say so.
"""

import html
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from cost_models import ShardingType, Tier, cache_rows, piece_traffic
from cost_models.sizes import optimizer_state_row_bytes, weight_row_bytes
from planner.explain import Explanation, PieceCoster
from planner.plan_model import Plan
from planner.problem import Problem, build_problem

# The placement map shows at most this many cells (tables x GPUs); above it, the costliest
# tables that fit.
MAX_MAP_CELLS = 250_000
TYPE_COLOURS = {
    ShardingType.TABLE_WISE: "#4c78a8", ShardingType.COLUMN_WISE: "#f58518",
    ShardingType.ROW_WISE: "#54a24b", ShardingType.TABLE_ROW_WISE: "#b279a2",
    ShardingType.TABLE_COLUMN_WISE: "#e45756", ShardingType.GRID: "#9d755d",
    ShardingType.DATA_PARALLEL: "#72b7b2",
}
TERM_COLOURS = ["#4c78a8", "#72b7b2", "#e45756", "#f58518", "#eeca3b", "#b279a2", "#54a24b"]
_CONFIG = {"displaylogo": False, "responsive": True,
           "modeBarButtonsToRemove": ["sendDataToCloud"]}
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;
background:#fafafa}
header{background:#1f2937;color:#fff;padding:14px 24px}
header h1{margin:0;font-size:20px} header p{margin:4px 0 0;font-size:13px;color:#d1d5db}
main{padding:8px 24px 40px;max-width:1500px}
section{background:#fff;border:1px solid #e5e7eb;border-radius:6px;margin:14px 0;padding:10px 16px}
h2{font-size:16px;margin:6px 0} .note{font-size:12px;color:#555}
.kpi{display:flex;flex-wrap:wrap;gap:12px;margin:8px 0}
.kpi div{background:#f3f4f6;border-radius:6px;padding:6px 12px;font-size:13px}
.kpi b{display:block;font-size:17px}
table.t{border-collapse:collapse;font-size:12px;width:100%}
table.t th,table.t td{border-bottom:1px solid #eee;padding:3px 6px;text-align:left;
vertical-align:top}
table.t th{background:#f9fafb;position:sticky;top:0}
td.n{text-align:right;font-variant-numeric:tabular-nums}
details summary{cursor:pointer} .warn{color:#b45309} .bad{color:#b91c1c}
.scroll{max-height:520px;overflow:auto}
"""


def esc(x: object) -> str:
    return html.escape(str(x), quote=True)


def fig_html(fig: go.Figure, div_id: str) -> str:
    """A figure as a <div> and its script; plotly.js itself is in the page's <head>."""
    return str(fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                           config=_CONFIG))


def page(title: str, subtitle: str, sections: list[str]) -> str:
    """A whole self-contained page: inline CSS, inline plotly.js, no external reference."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{_CSS}</style>"
            f"<script type=\"text/javascript\">{get_plotlyjs()}</script></head><body>"
            f"<header><h1>{esc(title)}</h1><p>{esc(subtitle)}</p></header><main>"
            + "\n".join(sections) + "</main></body></html>\n")


def section(title: str, body: str, sid: str, note: str = "") -> str:
    n = f"<p class=\"note\">{note}</p>" if note else ""
    return f"<section id=\"sec-{sid}\"><h2>{esc(title)}</h2>{n}{body}</section>"


def _ms(s: float) -> str:
    return f"{s * 1e3:,.4g}"


def _gib(b: float) -> float:
    return b / 2**30


@dataclass
class _Facts:
    """What the plan does not store, recomputed from its request with the cost model."""

    problem: Problem
    cell_cost: dict[tuple[int, int], float]  # (table index in plan, rank) -> own seconds
    cell_pieces: dict[tuple[int, int], list[Any]]
    table_cost: list[float]
    hbm_terms: dict[str, np.ndarray]  # per GPU bytes by term
    ddr_terms: dict[str, np.ndarray]  # per host
    ssd_terms: dict[str, np.ndarray]
    nvlink: np.ndarray  # per host bytes per step
    nic: np.ndarray


def _facts(plan: Plan) -> _Facts:
    problem = build_problem(plan.request)
    hw = problem.hw
    coster = PieceCoster(problem)
    w, g = hw.world_size, hw.gpus_per_host
    by_name = {t.name: t for t in problem.tables}
    meta = hw.constants.cache_metadata_bytes_per_row
    cell_cost: dict[tuple[int, int], float] = defaultdict(float)
    cell_pieces: dict[tuple[int, int], list[Any]] = defaultdict(list)
    table_cost = []
    hbm = {k: np.zeros(w) for k in ("weights", "optimizer state", "replicas (weights + state)",
                                    "HBM cache rows", "HBM cache metadata", "step buffers")}
    # The step buffers as the plan states them (the memory model's peak bound: ids, pooled
    # vectors, gradients, staging, workspace; cost_models.memory.StepBuffers).
    hbm["step buffers"] += np.array([g.hbm_buffer_bytes for g in plan.gpus], dtype=float)
    ddr = {k: np.zeros(hw.hosts) for k in ("behind an HBM cache", "ddr tier", "SSD's DDR cache")}
    ssd = {"ssd tier": np.zeros(hw.hosts)}
    nvlink, nic = np.zeros(hw.hosts), np.zeros(hw.hosts)
    traffic_memo: dict[tuple[Any, ...], tuple[float, float]] = {}
    for i, tp in enumerate(plan.tables):
        info = by_name[tp.name]
        ranks, rows = coster.table_rows(tp)
        secs = rows[:, 0:6].sum(axis=1)
        table_cost.append(math.fsum(secs.tolist()))
        ratio = tp.cache_ratio if tp.cache_ratio is not None else 1.0
        for p, r, s in zip(tp.pieces, ranks.tolist(), secs.tolist(), strict=True):
            cell_cost[(i, r)] += s
            cell_pieces[(i, r)].append(p)
            h = r // g
            w_row = weight_row_bytes(info.geom.data_type, p.col_count)
            s_row = optimizer_state_row_bytes(info.geom.optimizer, p.col_count)
            n = p.row_count
            if tp.tier is Tier.HBM:
                if tp.sharding_type is ShardingType.DATA_PARALLEL:
                    hbm["replicas (weights + state)"][r] += n * (w_row + s_row)
                else:
                    hbm["weights"][r] += n * w_row
                    hbm["optimizer state"][r] += n * s_row
            elif tp.tier is Tier.HBM_CACHE:
                slots = cache_rows(ratio, n)
                hbm["HBM cache rows"][r] += slots * w_row
                hbm["HBM cache metadata"][r] += slots * meta
                ddr["behind an HBM cache"][h] += n * (w_row + s_row)
            elif tp.tier is Tier.DDR:
                ddr["ddr tier"][h] += n * (w_row + s_row)
            else:
                ddr["SSD's DDR cache"][h] += cache_rows(ratio, n) * (w_row + s_row + meta)
                ssd["ssd tier"][h] += n * (w_row + s_row)
            key = (tp.name, tp.sharding_type, tp.tier, ratio, n, p.col_count)
            if key not in traffic_memo:
                t = piece_traffic(info.geom, tp.sharding_type, tp.tier, ratio, n, p.col_count,
                                  hw, problem.model)
                ar_nic = t.allreduce / g if hw.hosts > 1 else 0.0
                traffic_memo[key] = (
                    t.ids_intra + t.out_fwd_intra + t.out_bwd_intra + t.allreduce - ar_nic,
                    t.ids_inter + t.out_fwd_inter + t.out_bwd_inter + ar_nic)
            a, b = traffic_memo[key]
            nvlink[h] += a
            nic[h] += b
    return _Facts(problem, dict(cell_cost), dict(cell_pieces), table_cost, hbm, ddr, ssd,
                  nvlink, nic)


def _gpu_labels(plan: Plan) -> list[str]:
    return [f"{x.rank}" for x in plan.gpus]


def cost_figure(plan: Plan) -> go.Figure:
    gpus = plan.gpus
    x = _gpu_labels(plan)
    terms = [("lookup", "lookup_s"), ("backward", "backward_s"), ("cache miss", "cache_miss_s"),
             ("input all-to-all", "input_a2a_s"), ("output all-to-all", "output_a2a_s"),
             ("owner side all-to-all", "owner_a2a_s"), ("all-reduce", "allreduce_s")]
    fig = go.Figure()
    hosts = [g.host for g in gpus]
    for (label, attr), colour in zip(terms, TERM_COLOURS, strict=True):
        y = [getattr(g.cost, attr) * 1e3 for g in gpus]
        fig.add_bar(x=x, y=y, name=label, marker_color=colour, customdata=hosts,
                    hovertemplate=f"GPU %{{x}} (host %{{customdata}})<br>{label} "
                                  "%{y:.4f} ms<extra></extra>")
    s = plan.summary
    totals = [g.cost.total_s * 1e3 for g in gpus]
    if plan.request.model.pipelined:
        fig.add_scatter(x=x, y=totals, mode="markers", name="step time (pipelined: the next "
                        "batch's input all-to-all hidden)", marker={"symbol": "line-ew-open",
                                                               "size": 14, "color": "#111"})
    fig.add_hline(y=s.lower_bound_s * 1e3, line_dash="dash", line_color="#b91c1c",
                  annotation_text=f"lower bound {_ms(s.lower_bound_s)} ms",
                  annotation_position="top left")
    fig.add_hline(y=s.mean_gpu_time_s * 1e3, line_dash="dot", line_color="#374151",
                  annotation_text=f"mean {_ms(s.mean_gpu_time_s)} ms",
                  annotation_position="bottom left")
    slow = max(range(len(gpus)), key=lambda i: (gpus[i].cost.total_s, -i))
    fig.add_annotation(x=x[slow], y=totals[slow], text=f"slowest: GPU {gpus[slow].rank}, "
                       f"{_ms(gpus[slow].cost.total_s)} ms", showarrow=True, arrowhead=2,
                       ay=-40, font={"color": "#b91c1c"})
    fig.update_layout(barmode="stack", height=430, margin={"t": 30, "l": 60, "r": 20, "b": 40},
                      xaxis_title="GPU rank", yaxis_title="ms per step", xaxis_type="category",
                      legend={"orientation": "h", "y": 1.12}, bargap=0.15)
    return fig


def memory_figure(plan: Plan, facts: _Facts) -> go.Figure:
    x = _gpu_labels(plan)
    fig = go.Figure()
    colours = ["#4c78a8", "#9ecae9", "#72b7b2", "#f58518", "#ffbf79", "#b279a2"]
    for (label, arr), colour in zip(facts.hbm_terms.items(), colours, strict=True):
        if arr.any():
            fig.add_bar(x=x, y=_gib(arr), name=label, marker_color=colour,
                        hovertemplate=f"GPU %{{x}}<br>{label} %{{y:,.2f}} GiB<extra></extra>")
    free = [_gib(max(0, g.hbm_cap_bytes - g.hbm_bytes)) for g in plan.gpus]
    fig.add_bar(x=x, y=free, name="free (headroom)", marker_color="#e5e7eb",
                hovertemplate="GPU %{x}<br>free %{y:,.2f} GiB<extra></extra>")
    cap = plan.gpus[0].hbm_cap_bytes
    fig.add_hline(y=_gib(cap), line_color="#b91c1c",
                  annotation_text=f"HBM cap for embeddings {_gib(cap):,.1f} GiB",
                  annotation_position="top left")
    fig.update_layout(barmode="stack", height=380, margin={"t": 30, "l": 60, "r": 20, "b": 40},
                      xaxis_title="GPU rank", yaxis_title="GiB of HBM", xaxis_type="category",
                      legend={"orientation": "h", "y": 1.14}, bargap=0.15)
    return fig


def host_memory_figure(plan: Plan, facts: _Facts) -> go.Figure | None:
    if not any(a.any() for a in (*facts.ddr_terms.values(), *facts.ssd_terms.values())):
        return None
    hosts = [str(h.host) for h in plan.hosts]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("DDR per host", "SSD per host"))
    for label, arr in facts.ddr_terms.items():
        if arr.any():
            fig.add_bar(x=hosts, y=_gib(arr), name=f"DDR: {label}", row=1, col=1)
    fig.add_bar(x=hosts, y=[_gib(max(0, h.ddr_cap_bytes - h.ddr_bytes)) for h in plan.hosts],
                name="DDR free", marker_color="#e5e7eb", row=1, col=1)
    for label, arr in facts.ssd_terms.items():
        fig.add_bar(x=hosts, y=_gib(arr), name=f"SSD: {label}", row=1, col=2)
    fig.add_bar(x=hosts, y=[_gib(max(0, h.ssd_cap_bytes - h.ssd_bytes)) for h in plan.hosts],
                name="SSD free", marker_color="#f3f4f6", row=1, col=2)
    fig.update_layout(barmode="stack", height=340, margin={"t": 40, "l": 60, "r": 20, "b": 40})
    fig.update_xaxes(title_text="host", type="category")
    fig.update_yaxes(title_text="GiB")
    return fig


def network_figure(plan: Plan, facts: _Facts) -> go.Figure:
    hosts = [str(h.host) for h in plan.hosts]
    fig = go.Figure()
    fig.add_bar(x=hosts, y=facts.nvlink / 1e9, name="NVLink (inside the host)",
                marker_color="#4c78a8",
                hovertemplate="host %{x}<br>NVLink %{y:,.3f} GB per step<extra></extra>")
    fig.add_bar(x=hosts, y=facts.nic / 1e9, name="NIC (across hosts)", marker_color="#e45756",
                hovertemplate="host %{x}<br>NIC %{y:,.3f} GB per step<extra></extra>")
    fig.update_layout(barmode="group", height=320, margin={"t": 30, "l": 60, "r": 20, "b": 40},
                      xaxis_title="host", yaxis_title="GB per step (pieces' side)",
                      xaxis_type="category", legend={"orientation": "h", "y": 1.15})
    return fig


def placement_figure(plan: Plan, facts: _Facts, explanations: dict[str, Explanation]
                     ) -> tuple[go.Figure, str]:
    """Tables (x, grouped by sharding type) against GPUs (y); colour by sharding type."""
    w = len(plan.gpus)
    order = list(range(len(plan.tables)))
    note = ""
    limit = max(1, MAX_MAP_CELLS // max(1, w))
    if len(order) > limit:
        order = sorted(order, key=lambda i: -facts.table_cost[i])[:limit]
        note = f"the {limit:,} costliest of {len(plan.tables):,} tables"
    types = list(ShardingType)
    first_rank = {i: min(p.rank for p in plan.tables[i].pieces) for i in order}
    order.sort(key=lambda i: (types.index(plan.tables[i].sharding_type), first_rank[i],
                              plan.tables[i].name))
    names = [plan.tables[i].name for i in order]
    z = np.full((w, len(order)), np.nan)
    text = [[""] * len(order) for _ in range(w)]
    for col, i in enumerate(order):
        tp = plan.tables[i]
        ratio = f"{tp.cache_ratio:g}" if tp.cache_ratio is not None else "-"
        why = explanations.get(tp.name)
        why_s = f"<br>{esc(why.summary_line())}" if why else ""
        for r in {p.rank for p in tp.pieces}:
            ps = facts.cell_pieces[(i, r)]
            z[r, col] = types.index(tp.sharding_type)
            rows = "; ".join(f"{p.row_offset:,}+{p.row_count:,}" for p in ps[:3])
            cols = "; ".join(f"{p.col_offset}+{p.col_count}" for p in ps[:3])
            more = f" (+{len(ps) - 3} pieces)" if len(ps) > 3 else ""
            text[r][col] = (f"<b>{esc(tp.name)}</b> on GPU {r} (host {plan.gpus[r].host})<br>"
                            f"{tp.sharding_type.value}, tier {tp.tier.value}, cache ratio "
                            f"{ratio}<br>rows {rows}{more}<br>cols {cols}<br>cost here "
                            f"{_ms(facts.cell_cost[(i, r)])} ms{why_s}")
    n = len(types)
    scale = []
    for k, t in enumerate(types):
        scale += [[k / n, TYPE_COLOURS[t]], [(k + 1) / n, TYPE_COLOURS[t]]]
    fig = go.Figure(go.Heatmap(z=z, x=names, y=[str(g.rank) for g in plan.gpus], text=text,
                               hovertemplate="%{text}<extra></extra>", colorscale=scale,
                               zmin=-0.5, zmax=n - 0.5, showscale=False, xgap=0, ygap=1,
                               hoverongaps=False))
    present = {tp.sharding_type for tp in plan.tables}
    for t in types:
        if t in present:
            fig.add_scatter(x=[None], y=[None], mode="markers", name=t.value,
                            marker={"color": TYPE_COLOURS[t], "symbol": "square", "size": 12})
    height = min(900, max(260, 60 + 16 * w))
    fig.update_layout(height=height, margin={"t": 30, "l": 60, "r": 20, "b": 60},
                      xaxis={"title": "table (grouped by sharding type)", "type": "category",
                             "showticklabels": len(order) <= 60},
                      yaxis={"title": "GPU rank", "type": "category", "autorange": "reversed"},
                      legend={"orientation": "h", "y": 1.1}, plot_bgcolor="#ffffff")
    return fig, note


def mix_figure(plan: Plan, facts: _Facts) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tables per sharding type",
                                                        "tables per memory tier"))
    s = plan.summary
    types = list(s.tables_per_type)
    fig.add_bar(x=types, y=[s.tables_per_type[t] for t in types], showlegend=False,
                marker_color=[TYPE_COLOURS[ShardingType(t)] for t in types],
                hovertemplate="%{x}: %{y} tables<extra></extra>", row=1, col=1)
    tiers = list(s.tables_per_tier)
    fig.add_bar(x=tiers, y=[s.tables_per_tier[t] for t in tiers], showlegend=False,
                marker_color="#9d755d", hovertemplate="%{x}: %{y} tables<extra></extra>",
                row=1, col=2)
    fig.update_layout(height=300, margin={"t": 40, "l": 50, "r": 20, "b": 40})
    return fig


def solver_figure(plan: Plan) -> go.Figure | None:
    hist = plan.summary.solver_history
    if not hist:
        return None
    x: list[float] = [p.det_time for p in hist]
    title = "CP-SAT deterministic seconds"
    if max(x) - min(x) <= 0:
        x, title = list(range(1, len(hist) + 1)), "improvement (all within one time step)"
    fig = go.Figure()
    fig.add_scatter(x=x, y=[p.incumbent_s * 1e3 for p in hist], mode="lines+markers",
                    line_shape="hv", name="incumbent (step time)")
    proven = [(xi, p.bound_s) for xi, p in zip(x, hist, strict=True)
              if p.bound_s is not None and p.bound_s > 0]
    if proven:
        fig.add_scatter(x=[a for a, _ in proven], y=[b * 1e3 for _, b in proven],
                        mode="lines+markers", line_shape="hv", name="CP-SAT bound")
    fig.add_hline(y=plan.summary.lower_bound_s * 1e3, line_dash="dash", line_color="#b91c1c",
                  annotation_text="plan's lower bound", annotation_position="bottom right")
    fig.update_layout(height=320, margin={"t": 30, "l": 60, "r": 20, "b": 40},
                      xaxis_title=title, yaxis_title="ms per step",
                      legend={"orientation": "h", "y": 1.15})
    return fig


def _kpis(plan: Plan) -> str:
    s = plan.summary
    hw = plan.request.hardware
    used = max(g.hbm_bytes for g in plan.gpus)
    cap = plan.gpus[0].hbm_cap_bytes
    items = [("step estimate", f"{_ms(s.step_time_s)} ms"),
             ("lower bound", f"{_ms(s.lower_bound_s)} ms"), ("gap", f"{s.gap:.2%}"),
             ("imbalance", f"{s.imbalance:.3f}"),
             ("GPUs", f"{hw.hosts} x {hw.gpus_per_host} {hw.gpu.name}"),
             ("fullest GPU's HBM", f"{_gib(used):,.1f} / {_gib(cap):,.1f} GiB"),
             ("solver", f"{s.solver}: {s.status}")]
    return "<div class=\"kpi\">" + "".join(f"<div>{esc(k)}<b>{esc(v)}</b></div>"
                                           for k, v in items) + "</div>"


def _tables_html(plan: Plan, facts: _Facts, explanations: dict[str, Explanation]) -> str:
    order = sorted(range(len(plan.tables)), key=lambda i: -facts.table_cost[i])
    rows = []
    for i in order:
        tp = plan.tables[i]
        ranks = sorted({p.rank for p in tp.pieces})
        rk = ", ".join(map(str, ranks[:8])) + (f" ... ({len(ranks)})" if len(ranks) > 8 else "")
        ex = explanations.get(tp.name)
        why = _explanation_html(ex) if ex else "<span class=\"note\">not explained (planner " \
            f"explain PLAN {esc(tp.name)})</span>"
        ratio = f"{tp.cache_ratio:g}" if tp.cache_ratio is not None else ""
        rows.append(f"<tr id=\"table-{esc(tp.name)}\"><td>{esc(tp.name)}</td>"
                    f"<td>{tp.sharding_type.value}</td><td>{tp.tier.value}</td>"
                    f"<td class=\"n\">{ratio}</td><td class=\"n\">{len(tp.pieces)}</td>"
                    f"<td>{rk}</td><td class=\"n\">{_ms(facts.table_cost[i])}</td>"
                    f"<td>{why}</td></tr>")
    return ("<div class=\"scroll\"><table class=\"t\"><thead><tr><th>table</th><th>sharding"
            "</th><th>tier</th><th>cache ratio</th><th>pieces</th><th>GPUs</th>"
            "<th>own cost (ms)</th><th>why (click)</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table></div>")


def _explanation_html(ex: Explanation) -> str:
    items = []
    for o, what in ((ex.best_rejected, "best rejected"), (ex.best_unavailable,
                                                          "best not available")):
        if o is not None and o.loss_s is not None:
            why = f" ({esc(o.why_not)})" if o.why_not else ""
            items.append(f"<li>{what}: {esc(o.label)}{why}: step "
                         f"{_ms(o.makespan_s or 0)} ms ({o.loss_s * 1e3:+.4g} ms)</li>")
    items += [f"<li>{esc(b)}</li>" for b in ex.bounds]
    items += [f"<li class=\"warn\">warning: {esc(w)}</li>" for w in ex.warnings]
    return (f"<details><summary title=\"{esc(ex.summary_line())}\">{esc(ex.summary_line())}"
            f"</summary><ul>{''.join(items)}</ul></details>")


def costliest_explained(plan: Plan, n: int) -> dict[str, Explanation]:
    """Explanations of the n costliest tables (0 none, -1 all): what the report shows."""
    from planner.explain import explain_all

    if n == 0:
        return {}
    names = [t.name for t in plan.tables]
    if 0 < n < len(names):
        coster = PieceCoster(build_problem(plan.request))
        cost = {t.name: float(coster.table_rows(t)[1][:, 0:6].sum()) for t in plan.tables}
        names = sorted(names, key=lambda x: -cost[x])[:n]
    return explain_all(plan, names)


def render_html(plan: Plan, explanations: dict[str, Explanation] | None = None,
                extra_sections: list[str] | None = None) -> str:
    """The report page of a plan."""
    explanations = explanations or {}
    facts = _facts(plan)
    req = plan.request
    hw = req.hardware
    s = plan.summary
    sub = (f"{len(plan.tables):,} tables on {hw.hosts} x {hw.gpus_per_host} {hw.gpu.name} "
           f"({hw.name}), batch {req.model.batch_size_per_gpu}/GPU, comm "
           f"{req.model.fwd_comm_precision.value}/{req.model.bwd_comm_precision.value}; plan "
           f"{plan.plan_hash[:23]}...")
    overview = _kpis(plan) + "<ul>" + "".join(f"<li>{esc(d)}</li>" for d in s.decisions) + \
        "".join(f"<li class=\"warn\">warning: {esc(x)}</li>" for x in s.warnings) + "</ul>" + \
        f"<p class=\"note\">lower bound: {esc(s.lower_bound_note)}</p>"
    secs = [section("Overview", overview, "overview")]
    secs.append(section(
        "Cost per GPU", fig_html(cost_figure(plan), "cost-bars"), "cost",
        "Seconds per step by term, one bar per GPU, from the plan; the step time is the "
        "slowest GPU's." + (" Pipelined: the next batch's input all-to-all runs beside the "
                            "rest, so a GPU's time is communication + max(0, compute - input "
                            "all-to-all), marked by the black tick."
                            if req.model.pipelined else "")))
    heads = (f"HBM per GPU by term of the memory model (weights, optimizer state, replicas, "
             f"cache rows and their metadata), recomputed from the request; the plan's "
             f"per-GPU totals agree. Least headroom: "
             f"{_gib(min(g.hbm_cap_bytes - g.hbm_bytes for g in plan.gpus)):,.2f} GiB.")
    secs.append(section("Memory per GPU", fig_html(memory_figure(plan, facts), "memory-bars"),
                        "memory", heads))
    hm = host_memory_figure(plan, facts)
    if hm is not None:
        secs.append(section("Memory per host (DDR, SSD)", fig_html(hm, "host-memory"),
                            "host-memory"))
    secs.append(section(
        "Network per host", fig_html(network_figure(plan, facts), "network-bars"), "network",
        "The plan stores no byte counts: these are the cost model's bytes per step "
        "(cost_models/traffic.py) for each piece, recomputed from the plan's request: ids "
        "received, pooled vectors and gradients sent, and the data-parallel all-reduce (across "
        "hosts 1/G of it over the NIC). The sample owners' side of the all-to-alls (the "
        "'owner side' cost term) is not counted here."))
    fig, note = placement_figure(plan, facts, explanations)
    secs.append(section("Placement: tables x GPUs", fig_html(fig, "placement-map"), "placement",
                        "Colour: sharding type. Hover a cell for the rows, columns, tier, "
                        "cache ratio and what the piece costs on that GPU"
                        + (" and why the table is sharded so" if explanations else "")
                        + (f"; {note}" if note else "") + "."))
    secs.append(section("Sharding types and tiers", fig_html(mix_figure(plan, facts), "mix"),
                        "mix"))
    sf = solver_figure(plan)
    if sf is not None:
        secs.append(section("Solver: incumbent and bound", fig_html(sf, "solver-history"),
                            "solver", f"{esc(s.solver)}: {esc(s.status)}, "
                                      f"{s.solver_det_time:.3g} deterministic s."))
    else:
        why = next((d for d in s.decisions if "CP-SAT" in d), "")
        secs.append(section("Solver: incumbent and bound",
                            f"<p>No CP-SAT history in this plan ({esc(s.solver)}: "
                            f"{esc(s.status)}). {esc(why)}</p>", "solver"))
    secs.append(section("Tables", _tables_html(plan, facts, explanations), "tables",
                        "Costliest first; own cost is the sum over the table's pieces of what "
                        "each adds to its GPU (without the owner side). Click a row's "
                        "explanation for the best rejected alternative and what bound the "
                        "choice."))
    secs += extra_sections or []
    return page(f"Plan of {req.model.name}", sub, secs)


# Measured phases of `planner execute` and the cost term each is predicted by.
_PHASES = [(("input_a2a",), "input_a2a"), (("lookup",), "lookup"),
           (("output_a2a_fwd", "output_a2a_bwd"), "output_a2a"), (("backward",), "backward"),
           (("allreduce",), "allreduce")]


def measured_section(run: dict[str, Any]) -> str:
    """Predicted against measured per rank, from `planner execute ... -o run.json`. The
    executor's predictions are for the plan it ran (rows scaled by its `scale_rows`, its
    batch) on the plan's hardware; the measurements are from the device it ran on."""
    ranks = sorted(run.get("ranks", []), key=lambda r: r["rank"])
    if not ranks:
        return section("Predicted against measured", "<p>The run has no per-rank results.</p>",
                       "measured")
    x = [str(r["rank"]) for r in ranks]
    fig = go.Figure()
    pred = [sum(v for k, v in r["seconds_predicted"].items() if k != "total") * 1e3
            for r in ranks]
    meas = [sum(r["seconds_measured"].get(m, 0.0) for ms, _ in _PHASES for m in ms) * 1e3
            for r in ranks]
    fig.add_bar(x=x, y=pred, name="predicted (cost model)", marker_color="#4c78a8")
    fig.add_bar(x=x, y=meas, name=f"measured on {run.get('device', '?')}",
                marker_color="#e45756")
    fig.update_layout(barmode="group", height=320, yaxis_type="log", xaxis_type="category",
                      xaxis_title="rank", yaxis_title="ms per step (log)",
                      margin={"t": 30, "l": 60, "r": 20, "b": 40},
                      legend={"orientation": "h", "y": 1.15})
    rows = []
    for r in ranks:
        m, p = r["seconds_measured"], r["seconds_predicted"]
        cells = []
        for ms, name in _PHASES:
            mv, pv = sum(m.get(k, 0.0) for k in ms), p.get(name, 0.0)
            ratio = f" ({mv / pv:,.3g}x)" if pv > 0 else ""
            cells.append(f"<td class=\"n\">{mv * 1e3:,.4g} / {pv * 1e3:,.4g}{ratio}</td>")
        rows.append(f"<tr><td class=\"n\">{r['rank']}</td>{''.join(cells)}</tr>")
    table = ("<table class=\"t\"><thead><tr><th>rank</th>"
             + "".join(f"<th>{name} ms (measured / predicted)</th>" for _, name in _PHASES)
             + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    checks = run.get("checks", [])
    failed = [c for c in checks if not c.get("ok")]
    head = (f"<p>Run of plan {esc(str(run.get('plan_hash', ''))[:23])}: {run.get('world')} "
            f"ranks on {esc(run.get('device', '?'))}, batch {run.get('batch')}, rows x "
            f"{run.get('scale_rows')}, {run.get('steps')} steps; {len(checks) - len(failed)} of "
            f"{len(checks)} checks pass"
            + ("".join(f"<br><span class=\"bad\">fails: {esc(c.get('name'))}: "
                       f"{esc(c.get('detail'))}</span>" for c in failed)) + "</p>")
    return section("Predicted against measured (planner execute)",
                   head + fig_html(fig, "measured-bars") + table, "measured",
                   "Predictions are the cost model's for the plan the executor ran, on the "
                   "plan's hardware; measurements are from the device the run used.")
