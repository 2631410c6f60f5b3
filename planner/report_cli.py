"""The commands that help a person see and question a plan: `report`, `explain`, `diff` and
`sweep` (registered on the main `planner` app by planner/cli.py)."""

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from planner.cli_common import fail, hardware_input, load_json, read_input, write_output
from planner.errors import BadInputError, PlannerError
from planner.plan_model import EvaluateInput, Plan
from planner.validation import parse_json_model

out = Console(soft_wrap=False, width=160)
err = Console(stderr=True, soft_wrap=True)


class Fmt(StrEnum):
    table = "table"
    json = "json"


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:,.4f}"


def _load_plan(path: str) -> Plan:
    from planner.diff import as_plan

    return as_plan(parse_json_model(EvaluateInput, read_input(path, "plan"), "plan"))


def report_cmd(
    plan_file: Annotated[str, typer.Argument(help="plan JSON (or a layout, scored first), '-'")],
    output: Annotated[Path, typer.Option("-o", "--output", help="HTML file to write")] = Path(
        "report.html"),
    explain: Annotated[int, typer.Option(
        help="explain the N costliest tables (hover in the map, click in the table list); "
             "0 none, -1 all")] = 50,
    sweep: Annotated[Path | None, typer.Option(help="add a sweep's results (planner sweep "
                                                    "-o sweep.json)")] = None,
    measured: Annotated[Path | None, typer.Option(
        help="add predicted against measured per rank (planner execute ... -o run.json)")
    ] = None,
    compare: Annotated[str | None, typer.Option(
        help="add the diff against another plan of the same model")] = None,
) -> None:
    """Write a self-contained HTML report of a plan (plots inline, no network needed)."""
    from planner.report_html import costliest_explained, render_html

    try:
        p = _load_plan(plan_file)
        explanations = costliest_explained(p, explain)
        extra = []
        if sweep is not None:
            from planner.sweep import from_json, sweep_section

            extra.append(sweep_section(from_json(load_json(read_input(str(sweep), "sweep"),
                                                           "sweep"))))
        if measured is not None:
            from planner.report_html import measured_section

            extra.append(measured_section(load_json(read_input(str(measured), "run"), "run")))
        if compare is not None:
            from planner.diff import diff_plans, diff_section

            extra.append(diff_section(diff_plans(_load_plan(compare), p), compare))
        text = render_html(p, explanations, extra)
    except PlannerError as exc:
        fail(exc, exc.exit_code)
    write_output(output, text)
    out.print(f"report of {len(p.tables)} tables on {len(p.gpus)} GPUs written to {output} "
              f"({len(text) / 1e6:.1f} MB, self-contained)")


def explain_cmd(
    plan_file: Annotated[str, typer.Argument(help="plan JSON, or '-'")],
    table: Annotated[str, typer.Argument(help="table name")],
    fmt: Annotated[Fmt, typer.Option("--format")] = Fmt.table,
    top: Annotated[int, typer.Option(help="alternatives to list")] = 8,
) -> None:
    """Why TABLE is sharded as it is: the choice, the best rejected alternative and its loss
    on the step time, what bound the choice, and semantic warnings."""
    from planner.explain import explain_table

    try:
        p = _load_plan(plan_file)
        ex = explain_table(p, table)
    except PlannerError as exc:
        fail(exc, exc.exit_code)
    if fmt is Fmt.json:
        sys.stdout.write(json.dumps(ex.to_dict(), indent=1) + "\n")
        return
    c = ex.chosen
    ranks = sorted({x.rank for x in c.placement.pieces}) if c.placement else []
    out.print(f"[bold]{ex.table}[/]: {c.label} on GPUs {', '.join(map(str, ranks[:16]))}"
              f"{' ...' if len(ranks) > 16 else ''}; its own cost {_ms(c.work_s)} ms of GPU "
              f"time (largest piece {_ms(c.max_piece_s)} ms); plan step {_ms(ex.step_time_s)} ms")
    b = ex.best_rejected
    if b is None or b.loss_s is None:
        out.print("best rejected alternative: none (the planner had no other candidate that "
                  "fits next to the other tables)")
    else:
        how = "scored with planning.evaluate" if b.evaluated else "estimated"
        out.print(f"best rejected alternative: [bold]{b.label}[/], step {_ms(b.makespan_s)} "
                  f"ms, {'loses' if b.loss_s > 0 else 'changes the step by'} "
                  f"{b.loss_s * 1e3:+.4f} ms on the makespan ({how}; own cost "
                  f"{(b.work_s - c.work_s) * 1e3:+.4f} ms)")
    u = ex.best_unavailable
    if u is not None and u.loss_s is not None:
        out.print(f"best alternative the planner did not have: {u.label}, "
                  f"{u.loss_s * 1e3:+.4f} ms ({u.why_not})")
    out.print("[bold]what bound the choice[/]:")
    for x in ex.bounds:
        out.print(f"  - {x}")
    for w in ex.warnings:
        out.print(f"[yellow]warning:[/] {w}")
    for n in ex.notes:
        out.print(f"note: {n}")
    t = Table(title=f"alternatives (best {top} by step time)")
    for col in ("option", "available", "own ms", "step ms", "vs plan ms", "why not"):
        t.add_column(col, justify="right" if "ms" in col else "left")
    for o in ex.alternatives[:top]:
        t.add_row(o.label, "yes" if o.available else "no", _ms(o.work_s), _ms(o.makespan_s),
                  "-" if o.loss_s is None else f"{o.loss_s * 1e3:+.4f}", o.why_not or "")
    out.print(t)


def diff_cmd(
    a_file: Annotated[str, typer.Argument(help="plan A (JSON; a layout is scored first)")],
    b_file: Annotated[str, typer.Argument(help="plan B")],
    fmt: Annotated[Fmt, typer.Option("--format")] = Fmt.table,
    html: Annotated[Path | None, typer.Option(help="also write the diff as an HTML page")
                    ] = None,
) -> None:
    """What differs between two plans, per table and per GPU, and what it costs."""
    from planner.diff import diff_page, diff_plans

    try:
        d = diff_plans(_load_plan(a_file), _load_plan(b_file))
    except PlannerError as exc:
        fail(exc, exc.exit_code)
    if html is not None:
        write_output(html, diff_page(d, a_file, b_file), "--html")
    if fmt is Fmt.json:
        sys.stdout.write(json.dumps(d.to_dict(), indent=1) + "\n")
        return
    for n in d.request_notes:
        out.print(f"[yellow]note:[/] {n}")
    out.print(f"step A {_ms(d.step_a_s)} ms (slowest GPU {d.slowest_a}) -> B "
              f"{_ms(d.step_b_s)} ms (slowest GPU {d.slowest_b}): "
              f"{(d.step_b_s - d.step_a_s) * 1e3:+.4f} ms; bound {_ms(d.bound_a_s)} -> "
              f"{_ms(d.bound_b_s)} ms")
    if not d.tables and not d.gpus:
        out.print("the plans place every piece alike and every GPU's figures agree")
        return
    t = Table(title=f"{len(d.tables)} table(s) differ")
    for col in ("table", "change", "A", "B"):
        t.add_column(col)
    for x in d.tables:
        t.add_row(x.name, x.change, x.a or "-", x.b or "-")
    out.print(t)
    g = Table(title=f"{len(d.gpus)} GPU(s) differ (ms per step)")
    for col in ("rank", "host", "A", "B", "delta", "HBM GiB A -> B", "out", "in", "terms"):
        g.add_column(col, justify="right" if col in ("rank", "host", "A", "B", "delta")
                     else "left")
    for x in d.gpus:
        hbm = "-" if x.hbm_a is None or x.hbm_b is None else \
            f"{x.hbm_a / 2**30:,.2f} -> {x.hbm_b / 2**30:,.2f}"
        terms = ", ".join(f"{k.removesuffix('_s')} {v * 1e3:+.4f}"
                          for k, v in x.terms_delta_s.items())
        g.add_row(str(x.rank), str(x.host), _ms(x.total_a_s), _ms(x.total_b_s),
                  "-" if x.delta_s is None else f"{x.delta_s * 1e3:+.4f}", hbm,
                  ", ".join(x.tables_out[:4]) or ("" if x.pieces_moved else "(none moved)"),
                  ", ".join(x.tables_in[:4]), terms)
    out.print(g)


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BadInputError("--hosts", f"expected comma-separated host counts, got {text!r}"
                            ) from None
    if not vals or any(v < 1 for v in vals):
        raise BadInputError("--hosts", f"expected positive host counts, got {text!r}")
    return sorted(set(vals))


def sweep_cmd(
    model: Annotated[str, typer.Argument(help="model spec JSON, '-', or a bundled fixture")],
    hosts: Annotated[str, typer.Option(help="host counts, comma-separated")] = "1,2,4,8",
    preset: Annotated[str | None, typer.Option(
        help="hardware preset(s), comma-separated (default h100)")] = None,
    hardware: Annotated[Path | None, typer.Option(help="hardware spec JSON instead")] = None,
    solver: Annotated[str, typer.Option(help="auto | greedy | ilp")] = "auto",
    time_limit: Annotated[float, typer.Option(help="CP-SAT deterministic seconds")] = 2.0,
    workers: Annotated[int, typer.Option(help="planning processes (at most 2)")] = 2,
    output: Annotated[Path | None, typer.Option("-o", "--output",
                                                help="write the results JSON")] = None,
    html: Annotated[Path | None, typer.Option(help="write an HTML page with the plot")] = None,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="no progress bar")] = False,
) -> None:
    """Plan MODEL on each host count (and preset): step time, bound, HBM headroom, and the
    smallest host count that fits."""
    from planner.sweep import fastest, run_sweep, smallest_feasible, sweep_page, to_json

    try:
        model_raw: dict[str, Any] = load_json(read_input(model, "model"), "model")
        counts = _int_list(hosts)
        if hardware is not None:
            hw = hardware_input(hardware, preset, None)
            presets = [hardware.stem]
        else:
            hw = None
            presets = [x.strip() for x in (preset or "h100").split(",") if x.strip()]
            from planner.presets import preset_choices

            # The names and aliases `planner plan --preset` and the HTTP API accept.
            for pr in presets:
                if pr not in preset_choices():
                    raise BadInputError("--preset", f"unknown preset '{pr}' (presets: "
                                                    f"{', '.join(preset_choices())})")
        opts = {"solver": solver, "time_limit_s": time_limit}
        n = len(presets) * len(counts)
        progress = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("{task.description}"),
                            console=err, disable=quiet or not err.is_terminal)
        with progress:
            task = progress.add_task("", total=n)

            def done(pt: Any) -> None:
                progress.update(task, advance=1,
                                description=f"{pt.preset} x {pt.hosts}: {pt.status}")

            points = run_sweep(model_raw, presets, counts, hw, opts, workers, done)
    except PlannerError as exc:
        fail(exc, exc.exit_code)
    t = Table(title=f"sweep of {model_raw.get('name', model)}")
    for col in ("preset", "hosts", "GPUs", "step ms", "bound ms", "gap", "HBM headroom GiB",
                "tiers", "status"):
        t.add_column(col, justify="left" if col in ("preset", "tiers", "status") else "right")
    for p in points:
        if p.ok:
            t.add_row(p.preset, str(p.hosts), str(p.gpus), _ms(p.step_time_s),
                      _ms(p.lower_bound_s), f"{p.gap or 0:.2%}",
                      f"{(p.hbm_headroom_bytes or 0) / 2**30:,.1f}",
                      ", ".join(f"{k} {v}" for k, v in (p.tiers or {}).items()), "ok")
        else:
            t.add_row(p.preset, str(p.hosts), "", "", "", "", "", "",
                      f"[red]{p.status}[/]: {(p.reason or '')[:90]}")
    out.print(t)
    for pr in presets:
        s, f = smallest_feasible(points, pr), fastest(points, pr)
        if s is None:
            out.print(f"{pr}: [red]no host count in the sweep fits[/]")
        else:
            out.print(f"{pr}: smallest host count that fits: [bold]{s.hosts}[/] "
                      f"({_ms(s.step_time_s)} ms per step); fastest step: "
                      f"{f.hosts if f else '-'} hosts")
    if output is not None:
        write_output(output, json.dumps(to_json(points), indent=1) + "\n")
        out.print(f"results written to {output}")
    if html is not None:
        write_output(html, sweep_page(points, str(model_raw.get("name", model))), "--html")
        out.print(f"plot written to {html}")
    if not any(p.ok for p in points):
        raise typer.Exit(3)


def register(app: typer.Typer) -> None:
    """Add `report`, `explain`, `diff` and `sweep` to the planner app."""
    app.command("report")(report_cmd)
    app.command("explain")(explain_cmd)
    app.command("diff")(diff_cmd)
    app.command("sweep")(sweep_cmd)
