"""The executor's report as tables: per rank, measured beside predicted; then the checks."""

from rich.console import Console
from rich.table import Table

from planner.executor.run import ExecutionReport

_PHASES = [  # (measured phases, predicted cost term)
    (("input_a2a",), "input_a2a"),
    (("lookup",), "lookup"),
    (("output_a2a_fwd", "output_a2a_bwd"), "output_a2a"),
    (("backward",), "backward"),
    (("allreduce",), "allreduce"),
]


def _b(x: float) -> str:
    return f"{x:,.0f}"


def render(rep: ExecutionReport, out: Console) -> None:
    out.print(f"plan {rep.plan_hash[:12]}: {rep.world} ranks on {rep.device}, batch {rep.batch} "
              f"per rank, {rep.steps} measured steps, rows x {rep.scale_rows:g}")
    t = Table(title="bytes per step (measured / predicted)")
    t.add_column("rank", justify="right")
    for name in ("input lengths recv", "input ids recv", "output fwd sent", "output bwd recv",
                 "all-reduce sent"):
        t.add_column(name, justify="right")
    for r in rep.ranks:
        b = r["bytes"]
        t.add_row(str(r["rank"]), *[f"{_b(b[k]['measured'])} / {_b(b[k]['predicted'])}" for k in
                                    ("input_lengths", "input_ids", "output_fwd",
                                     "output_bwd", "allreduce")])
    out.print(t)
    t = Table(title="seconds per step (measured here / predicted for the plan's hardware)")
    t.add_column("rank", justify="right")
    for _, name in _PHASES:
        t.add_column(name, justify="right")
    t.add_column("cache miss (pred.)", justify="right")
    for r in rep.ranks:
        m, p = r["seconds_measured"], r["seconds_predicted"]
        cells = [f"{sum(m.get(x, 0.0) for x in ms):.2e} / {p.get(name, 0.0):.2e}"
                 for ms, name in _PHASES]
        t.add_row(str(r["rank"]), *cells, f"{p.get('cache_miss', 0.0):.2e}")
    out.print(t)
    t = Table(title="memory held, bytes (measured / predicted)")
    t.add_column("rank", justify="right")
    for tier in ("hbm", "ddr", "ssd"):
        t.add_column(tier, justify="right")
    t.add_column("LFU counters (not modeled)", justify="right")
    for r in rep.ranks:
        mem = r["memory"]
        t.add_row(str(r["rank"]), *[f"{_b(mem[k]['measured'])} / {_b(mem[k]['predicted'])}"
                                    for k in ("hbm", "ddr", "ssd")], _b(r["executor_extra_ddr"]))
    out.print(t)
    if any("peak_memory" in r for r in rep.ranks):
        t = Table(title="memory peak, bytes, allocator-measured (per phase, over the measured "
                        "steps) / memory model")
        t.add_column("rank", justify="right")
        t.add_column("model", justify="right")
        t.add_column("step peak", justify="right")
        t.add_column("ratio", justify="right")
        t.add_column("held after init", justify="right")
        t.add_column("largest phase transients", justify="left")
        for r in rep.ranks:
            pm = r.get("peak_memory")
            if pm is None:
                continue
            tr = sorted(pm["phase_transient"].items(), key=lambda kv: -kv[1])[:3]
            t.add_row(str(r["rank"]), _b(pm["predicted"]), _b(pm["measured_step_peak"]),
                      f"{pm['ratio']:.3g}", _b(pm["held_after_init"]),
                      ", ".join(f"{k} +{_b(v)}" for k, v in tr))
        out.print(t)
    cached = [p for p in rep.pieces if p["hit_rate"]["predicted"] is not None]
    if cached:
        t = Table(title="cache hit rate (measured / predicted)")
        for c in ("table", "piece", "rank", "tier", "hit rate"):
            t.add_column(c)
        for p in cached:
            h = p["hit_rate"]
            meas = "-" if h["measured"] is None else f"{h['measured']:.4f}"
            t.add_row(p["table"], p["key"], str(p["rank"]), p["tier"],
                      f"{meas} / {h['predicted']:.4f}")
        out.print(t)
    t = Table(title="checks")
    t.add_column("")
    t.add_column("check")
    t.add_column("detail")
    for c in rep.checks:
        t.add_row("[green]pass[/]" if c.ok else "[red]FAIL[/]", c.name, c.detail)
    out.print(t)
