"""`planner sweep MODEL.json --preset h100 --hosts 1,2,4,8,16,32`: how many hosts does a model
need? One plan per (preset, host count), in parallel processes; for each: the step time, the
lower bound, the HBM headroom, or why there is no plan (infeasible, with its certificate's
reason, or no plan found within the budget). Then the smallest host count that fits and the
fastest one, per preset.
"""

import math
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from planner.errors import BadInputError, InfeasibleError, NoPlanFoundError, PlannerError

# At most this many planning processes (the machines this runs on have 2 cores).
MAX_WORKERS = 2


@dataclass
class SweepPoint:
    preset: str
    hosts: int
    gpus: int
    status: str  # ok | infeasible | no plan found | bad input
    step_time_s: float | None = None
    lower_bound_s: float | None = None
    gap: float | None = None
    hbm_headroom_bytes: int | None = None  # the fullest GPU's free HBM
    hbm_used_fraction: float | None = None  # of the cluster's HBM for embeddings
    tiers: dict[str, int] | None = None
    solver: str | None = None
    reason: str | None = None
    planning_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def plan_point(model: dict[str, Any], preset: str, hosts: int, hardware: dict[str, Any] | None,
               options: dict[str, Any]) -> SweepPoint:
    """One plan of the sweep (runs in a worker process)."""
    from planner.planning import plan, resolve

    hw = dict(hardware) if hardware is not None else {"preset": preset}
    hw["hosts"] = hosts
    start = time.perf_counter()
    gpus = 0
    try:
        req = resolve({"model": model, "hardware": hw, "options": options})
        gpus = req.hardware.hosts * req.hardware.gpus_per_host
        p = plan(req)
    except InfeasibleError as e:
        return SweepPoint(preset, hosts, gpus, "infeasible", reason=e.reason,
                          planning_s=time.perf_counter() - start)
    except NoPlanFoundError as e:
        return SweepPoint(preset, hosts, gpus, "no plan found", reason=e.reason,
                          planning_s=time.perf_counter() - start)
    except BadInputError as e:
        # "more than all memory of the cluster" is the input check's way of saying infeasible
        status = "infeasible" if "more than all memory" in e.message else "bad input"
        return SweepPoint(preset, hosts, gpus, status, reason=str(e),
                          planning_s=time.perf_counter() - start)
    s = p.summary
    cap = sum(g.hbm_cap_bytes for g in p.gpus)
    return SweepPoint(
        preset, hosts, len(p.gpus), "ok", s.step_time_s, s.lower_bound_s, s.gap,
        min(g.hbm_cap_bytes - g.hbm_bytes for g in p.gpus),
        sum(g.hbm_bytes for g in p.gpus) / cap if cap else None, dict(s.tables_per_tier),
        f"{s.solver}: {s.status}", None, time.perf_counter() - start)


def run_sweep(model: dict[str, Any], presets: list[str], hosts: list[int],
              hardware: dict[str, Any] | None = None, options: dict[str, Any] | None = None,
              workers: int = MAX_WORKERS,
              on_done: Callable[[SweepPoint], None] | None = None) -> list[SweepPoint]:
    """Plan every (preset, host count), at most `workers` at a time in separate processes
    (largest first, so the slowest plans start early); points in (preset, hosts) order."""
    options = options or {}
    jobs = [(pr, h) for pr in presets for h in hosts]
    workers = max(1, min(workers, MAX_WORKERS, len(jobs)))
    results: dict[tuple[str, int], SweepPoint] = {}
    if workers == 1:
        for pr, h in jobs:
            results[(pr, h)] = pt = plan_point(model, pr, h, hardware, options)
            if on_done:
                on_done(pt)
    else:
        # spawn: a clean interpreter per worker (OR-Tools' threads and fork do not mix)
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as ex:
            futs: dict[Future[SweepPoint], tuple[str, int]] = {
                ex.submit(plan_point, model, pr, h, hardware, options): (pr, h)
                for pr, h in sorted(jobs, key=lambda j: -j[1])}
            pending = set(futs)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    pr, h = futs[f]
                    try:
                        pt = f.result()
                    except PlannerError as e:  # pragma: no cover - plan_point catches these
                        pt = SweepPoint(pr, h, 0, "error", reason=str(e))
                    results[(pr, h)] = pt
                    if on_done:
                        on_done(pt)
    return [results[j] for j in jobs]


def smallest_feasible(points: list[SweepPoint], preset: str) -> SweepPoint | None:
    ok = [p for p in points if p.preset == preset and p.ok]
    return min(ok, key=lambda p: p.hosts) if ok else None


def fastest(points: list[SweepPoint], preset: str) -> SweepPoint | None:
    ok = [p for p in points if p.preset == preset and p.ok and p.step_time_s is not None]
    return min(ok, key=lambda p: (p.step_time_s, p.hosts)) if ok else None


def to_json(points: list[SweepPoint]) -> dict[str, Any]:
    presets = list(dict.fromkeys(p.preset for p in points))
    return {"points": [asdict(p) for p in points],
            "smallest_feasible": {pr: (s.hosts if (s := smallest_feasible(points, pr)) else None)
                                  for pr in presets},
            "fastest": {pr: (f.hosts if (f := fastest(points, pr)) else None)
                        for pr in presets}}


def from_json(data: dict[str, Any]) -> list[SweepPoint]:
    return [SweepPoint(**p) for p in data["points"]]


def sweep_figure(points: list[SweepPoint]) -> go.Figure:
    """Step time and bound against hosts (log 2 axis) per preset, infeasible host counts
    marked on the axis; HBM headroom below."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.65, 0.35],
                        vertical_spacing=0.08,
                        subplot_titles=("step time and lower bound (ms)",
                                        "fullest GPU's free HBM (GiB)"))
    presets = list(dict.fromkeys(p.preset for p in points))
    palette = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#b279a2"]
    ok_steps = [p.step_time_s * 1e3 for p in points if p.ok and p.step_time_s]
    floor = min(ok_steps) if ok_steps else 1.0
    for i, pr in enumerate(presets):
        colour = palette[i % len(palette)]
        pts = sorted((p for p in points if p.preset == pr), key=lambda p: p.hosts)
        ok = [p for p in pts if p.ok]
        fig.add_scatter(x=[p.hosts for p in ok], y=[(p.step_time_s or 0) * 1e3 for p in ok],
                        mode="lines+markers", name=f"{pr}: step time", line_color=colour,
                        hovertemplate="%{x} hosts: %{y:.4g} ms<extra></extra>", row=1, col=1)
        fig.add_scatter(x=[p.hosts for p in ok], y=[(p.lower_bound_s or 0) * 1e3 for p in ok],
                        mode="lines", name=f"{pr}: lower bound", line={"color": colour,
                                                                        "dash": "dash"},
                        hovertemplate="%{x} hosts: bound %{y:.4g} ms<extra></extra>",
                        row=1, col=1)
        bad = [p for p in pts if not p.ok]
        if bad:
            fig.add_scatter(x=[p.hosts for p in bad], y=[floor] * len(bad), mode="markers+text",
                            marker={"symbol": "x", "size": 12, "color": "#b91c1c"},
                            text=[p.status for p in bad], textposition="top center",
                            name=f"{pr}: no plan", hovertext=[p.reason or p.status for p in bad],
                            hoverinfo="text", row=1, col=1)
        small = smallest_feasible(points, pr)
        if small is not None and small.step_time_s is not None:
            fig.add_annotation(x=math.log10(small.hosts), y=math.log10(small.step_time_s * 1e3),
                               text=f"smallest that fits: {small.hosts}", showarrow=True,
                               arrowhead=2, ay=-35, row=1, col=1)
        fig.add_scatter(x=[p.hosts for p in ok],
                        y=[(p.hbm_headroom_bytes or 0) / 2**30 for p in ok],
                        mode="lines+markers", name=f"{pr}: HBM headroom",
                        line={"color": colour, "dash": "dot"},
                        hovertemplate="%{x} hosts: %{y:,.2f} GiB free<extra></extra>",
                        row=2, col=1)
    hosts = sorted({p.hosts for p in points})
    fig.update_xaxes(type="log", tickvals=hosts, ticktext=[str(h) for h in hosts])
    fig.update_xaxes(title_text="hosts", row=2, col=1)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_layout(height=560, margin={"t": 40, "l": 60, "r": 20, "b": 40},
                      legend={"orientation": "h", "y": -0.12})
    return fig


def sweep_table_html(points: list[SweepPoint]) -> str:
    from planner.report_html import esc

    rows = []
    for p in points:
        if p.ok:
            cells = [f"{(p.step_time_s or 0) * 1e3:,.4g}", f"{(p.lower_bound_s or 0) * 1e3:,.4g}",
                     f"{p.gap or 0:.2%}", f"{(p.hbm_headroom_bytes or 0) / 2**30:,.1f}",
                     ", ".join(f"{k} {v}" for k, v in (p.tiers or {}).items())]
            status = "ok"
        else:
            cells = ["", "", "", "", ""]
            status = f"<span class=\"bad\">{esc(p.status)}</span>: {esc(p.reason or '')}"
        rows.append(f"<tr><td>{esc(p.preset)}</td><td class=\"n\">{p.hosts}</td>"
                    + "".join(f"<td class=\"n\">{c}</td>" for c in cells)
                    + f"<td>{status}</td></tr>")
    return ("<table class=\"t\"><thead><tr><th>preset</th><th>hosts</th><th>step (ms)</th>"
            "<th>bound (ms)</th><th>gap</th><th>HBM headroom (GiB)</th><th>tiers</th>"
            "<th>status</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def sweep_section(points: list[SweepPoint]) -> str:
    from planner.report_html import esc, fig_html, section

    presets = list(dict.fromkeys(p.preset for p in points))
    lines = []
    for pr in presets:
        s, f = smallest_feasible(points, pr), fastest(points, pr)
        if s is None:
            lines.append(f"{pr}: no host count in the sweep fits")
        else:
            lines.append(f"{pr}: the smallest host count that fits is {s.hosts} "
                         f"({(s.step_time_s or 0) * 1e3:,.4g} ms per step)"
                         + (f"; the fastest step is on {f.hosts} hosts "
                            f"({(f.step_time_s or 0) * 1e3:,.4g} ms)" if f else ""))
    body = ("<ul>" + "".join(f"<li>{esc(x)}</li>" for x in lines) + "</ul>"
            + fig_html(sweep_figure(points), "sweep-plot") + sweep_table_html(points))
    return section("Capacity sweep", body, "sweep",
                   "One plan per host count (batch per GPU fixed, so more hosts train more "
                   "samples per step). The headroom is the fullest GPU's free HBM.")


def sweep_page(points: list[SweepPoint], model_name: str) -> str:
    from planner.report_html import page

    hosts = sorted({p.hosts for p in points})
    presets = ", ".join(dict.fromkeys(p.preset for p in points))
    return page(f"Capacity sweep of {model_name}",
                f"{presets} on {', '.join(map(str, hosts))} hosts", [sweep_section(points)])
