"""`planner`: plan, check, evaluate, schema, presets. Exit codes: 0 ok, 1 plan fails the
checker, 2 bad input, 3 infeasible."""

import json
import logging
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from planner.check import check_plan
from planner.cli_common import (
    check_output,
    fail,
    hardware_input,
    load_json,
    read_input,
    write_output,
)
from planner.errors import PlannerError
from planner.evaluation import evaluate_input
from planner.plan_model import EvaluateInput, Plan
from planner.planning import plan
from planner.presets import DEFAULT_PRESET, fixture_names, preset_dict, preset_names
from planner.progress import solver_progress
from planner.spec import HardwareSpec, ModelSpec, PlanRequest
from planner.validation import parse_json_model

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Embedding-table sharding planner for DLRMs.")
out = Console(soft_wrap=False, width=160)
err = Console(stderr=True, soft_wrap=True)


class Format(StrEnum):
    table = "table"
    json = "json"


def _emit(plan_obj: Plan, fmt: Format, output: Path | None, seconds: float | None,
          detail: bool = False) -> None:
    """Print or write the plan. With -o the plan goes to the file and the terminal gets one
    line (the full view too with --detail); with --format json and -o, stdout stays empty."""
    from planner.report import render, summary_line

    text = plan_obj.model_dump_json(indent=1) + "\n"
    if output is not None:
        write_output(output, text)
    if fmt is Format.json:
        if output is None:
            sys.stdout.write(text)
        else:
            err.print(f"written to {output}")
        return
    if output is None or detail:
        render(plan_obj, out, seconds, detail=detail)
    else:
        out.print(summary_line(plan_obj), highlight=False)
    if output is not None:
        out.print(f"written to {output}")


class EstimatorName(StrEnum):
    analytic = "analytic"
    torchrec = "torchrec"


@app.command("plan")
def plan_cmd(
    model: Annotated[str, typer.Argument(help="model spec JSON file, '-' for stdin, or a "
                                              "bundled fixture name")],
    hardware: Annotated[Path | None, typer.Option(help="hardware spec JSON file")] = None,
    preset: Annotated[str | None, typer.Option(help=f"hardware preset (default "
                                                    f"{DEFAULT_PRESET})")] = None,
    hosts: Annotated[int | None, typer.Option(help="number of hosts")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write plan JSON")] = None,
    fmt: Annotated[Format, typer.Option("--format")] = Format.table,
    solver: Annotated[str, typer.Option(help="auto (heuristic, then the search when the gap "
                                             "is over 1%) | greedy (heuristic only) | ilp "
                                             "(heuristic, then the search, CP-SAT always)")
                      ] = "auto",
    time_limit: Annotated[float, typer.Option(
        help="the search's budget in deterministic seconds, CP-SAT's and ruin and "
             "recreate's (about one second each on one core; deterministic, so the same "
             "request gives the same plan)")] = 2.0,
    seed: Annotated[int, typer.Option(help="CP-SAT's and ruin and recreate's random "
                                           "seed")] = 0,
    estimator: Annotated[EstimatorName, typer.Option(
        help="what prices a piece: analytic (our cost model over the hardware profile) or "
             "torchrec (TorchRec's EmbeddingPerfEstimator; needs torchrec)")]
    = EstimatorName.analytic,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="no live progress")] = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="log decisions")] = False,
    detail: Annotated[bool, typer.Option(
        "--detail", help="list each GPU's tables (with -o: print the full view too)")] = False,
) -> None:
    """Plan MODEL on a hardware preset or spec and print the plan."""
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    check_output(output)
    try:
        model_raw = load_json(read_input(model, "model"), "model")
        hw = hardware_input(hardware, preset, hosts)
        raw = {"model": model_raw, "hardware": hw,
               "options": {"solver": solver, "time_limit_s": time_limit, "seed": seed,
                           "estimator": estimator.value}}
        start = time.perf_counter()
        with solver_progress(err, not quiet) as progress:
            result = plan(raw, progress)
        seconds = time.perf_counter() - start
    except PlannerError as exc:
        fail(exc, exc.exit_code)
    _emit(result, fmt, output, seconds, detail)


@app.command("check")
def check_cmd(
    plan_file: Annotated[str, typer.Argument(help="plan JSON, or '-'")],
    strict: Annotated[bool, typer.Option(
        "--strict", help="a claimed bound (or status optimal) the checker cannot re-prove "
                         "within its budget fails the check instead of warning")] = False,
    proof_budget: Annotated[float | None, typer.Option(
        help="deterministic seconds for re-proving a CP-SAT bound (default: twice the "
             "request's time limit, 1 to 60)", min=0.01)] = None,
) -> None:
    """Verify a plan from its request alone: coverage, structure, caps, every figure, the
    lower bound (a CP-SAT bound is re-proven) and the hash."""
    try:
        p = parse_json_model(Plan, read_input(plan_file, "plan"), "plan")
    except PlannerError as exc:
        fail(exc, exc.exit_code)
    report = check_plan(p, strict=strict, proof_budget=proof_budget)
    for w in report.warnings:
        err.print(f"[yellow]warning:[/] {w}", highlight=False)
    if report.ok:
        proven = "".join(f"; bound re-proven ({x.detail})" for x in report.proofs
                         if x.outcome == "verified")
        out.print(f"[green]ok[/]: {len(p.tables)} tables on {len(p.gpus)} GPUs; every row and "
                  "column covered once, every cap respected, every figure recomputed"
                  f"{proven}", highlight=False)
        return
    for e in report.errors:
        err.print(f"[red]fail:[/] {e}", highlight=False)
    raise typer.Exit(1)


@app.command("evaluate")
def evaluate_cmd(
    plan_file: Annotated[str, typer.Argument(help="plan or layout JSON, or '-'")],
    fmt: Annotated[Format, typer.Option("--format")] = Format.table,
    output: Annotated[Path | None, typer.Option("-o", "--output")] = None,
    detail: Annotated[bool, typer.Option("--detail", help="list each GPU's tables")] = False,
    estimator: Annotated[EstimatorName | None, typer.Option(
        help="price the layout by this estimator instead of the one its request "
             "names")] = None,
) -> None:
    """Score any plan (ours, hand-made or foreign) under the cost model."""
    check_output(output)
    try:
        given = parse_json_model(EvaluateInput, read_input(plan_file, "plan"), "plan")
        result = evaluate_input(given, estimator.value if estimator else None)
    except PlannerError as exc:
        fail(exc, exc.exit_code)
    err.print(result.note, highlight=False)
    _emit(result.plan, fmt, output, None, detail)


class SchemaKind(StrEnum):
    request = "request"
    model = "model"
    hardware = "hardware"
    plan = "plan"


@app.command("schema")
def schema_cmd(kind: Annotated[SchemaKind, typer.Argument()] = SchemaKind.request) -> None:
    """Print the JSON Schema of the input (request, model, hardware) or of the plan."""
    model = {"request": PlanRequest, "model": ModelSpec, "hardware": HardwareSpec,
             "plan": Plan}[kind.value]
    sys.stdout.write(json.dumps(model.model_json_schema(), indent=1) + "\n")


@app.command("presets")
def presets_cmd() -> None:
    """List the bundled hardware presets and model fixtures."""
    t = Table(title="Hardware presets")
    for col in ("name", "GPUs/host", "GPU", "HBM", "HBM GB/s", "NIC GB/s", "DDR", "SSD"):
        t.add_column(col)
    for name in preset_names():
        spec = HardwareSpec.model_validate(preset_dict(name))
        t.add_row(name, str(spec.gpus_per_host), spec.gpu.name,
                  spec.gpu.hbm_capacity_bytes.human_readable(),
                  f"{spec.gpu.hbm_bandwidth_gb_per_s:g}", f"{spec.links.nic_gb_per_s:g}",
                  spec.host.ddr_capacity_bytes.human_readable(),
                  spec.host.ssd_capacity_bytes.human_readable())
    out.print(t)
    out.print("model fixtures: " + ", ".join(fixture_names()))


def _register_commands() -> None:
    # Commands owned by other packages: serve (api), execute (executor), export/import (interop).
    from api.cli import register as register_service
    from planner.calibration.cli import register as register_calibrate
    from planner.executor.cli import register as register_executor
    from planner.interop.cli import register as register_interop

    for register in (register_service, register_executor, register_interop,
                     register_calibrate):
        register(app)


_register_commands()
from planner.report_cli import register as _register_report  # noqa: E402

_register_report(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
