"""CLI commands of this package, registered on the main `planner` app by planner/cli.py.
Heavy imports stay inside the command functions so `planner plan` starts fast.

  planner export PLAN.json --format torchrec [--device cuda|cpu] [--module-path P] [-o OUT]
  planner import tables TABLES.json --batch-size N [-o MODEL.json]
  planner import plan TORCHREC_PLAN.json --model MODEL [--preset P --hosts N | --hardware HW]
"""

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from planner.cli_common import fail, hardware_input, load_json, read_input, write_output
from planner.errors import PlannerError


class ExportFormat(StrEnum):
    torchrec = "torchrec"


class Device(StrEnum):
    cuda = "cuda"
    cpu = "cpu"


def _write(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
    else:
        write_output(output, text)
        typer.echo(f"written to {output}", err=True)


def export_cmd(
    plan_file: Annotated[str, typer.Argument(help="plan (or layout) JSON, or '-'")],
    fmt: Annotated[ExportFormat, typer.Option("--format")] = ExportFormat.torchrec,
    device: Annotated[Device, typer.Option(help="placement device: cuda for GPU jobs, cpu "
                                                "for gloo on CPU")] = Device.cuda,
    module_path: Annotated[str, typer.Option(help="the EmbeddingBagCollection's path in the "
                                                  "model DistributedModelParallel wraps")] = "",
    ec_module_path: Annotated[str, typer.Option(help="the EmbeddingCollection's path (the "
                                                     "sequence tables, pooling_mode none)")] = "",
    output: Annotated[Path | None, typer.Option("-o", "--output")] = None,
    strict: Annotated[bool, typer.Option(help="exit 1 when any table is adjusted")] = False,
) -> None:
    """Export a plan as TorchRec's per-table ParameterSharding (JSON).

    Each table says whether TorchRec runs it exactly as planned, adjusted (and how), or
    cannot express it. Exit 1 when a table is inexpressible (or adjusted, with --strict)."""
    from planner.interop.export import to_torchrec
    from planner.plan_model import EvaluateInput, PlanLayout
    from planner.validation import parse_json_model

    try:
        given = parse_json_model(EvaluateInput, read_input(plan_file, "plan"), "plan")
    except PlannerError as exc:
        fail(exc, exc.exit_code)
    layout = PlanLayout(schema_version=given.schema_version, request=given.request,
                        tables=given.tables)
    result = to_torchrec(layout, device=device.value, module_path=module_path,
                         ec_module_path=ec_module_path)
    _write(result.model_dump_json(indent=1) + "\n", output)
    for t in result.tables:
        if t.status != "exact":
            typer.echo(f"{t.status}: table '{t.name}': " + "; ".join(t.notes), err=True)
    counts = {s: len(result.by_status(s)) for s in ("exact", "adjusted", "inexpressible")}
    typer.echo(f"{counts['exact']} exact, {counts['adjusted']} adjusted, "
               f"{counts['inexpressible']} inexpressible", err=True)
    if counts["inexpressible"] or (strict and counts["adjusted"]):
        raise typer.Exit(1)


import_app = typer.Typer(no_args_is_help=True, help="Import TorchRec table configs or plans.")


@import_app.command("tables")
def import_tables_cmd(
    tables_file: Annotated[str, typer.Argument(help="JSON list of TorchRec table configs "
                                                    "(or {\"tables\": [...]}), or '-'")],
    batch_size: Annotated[int, typer.Option(help="batch size per GPU")],
    name: Annotated[str, typer.Option(help="model name")] = "torchrec_model",
    output: Annotated[Path | None, typer.Option("-o", "--output")] = None,
) -> None:
    """TorchRec table configs (name, num_embeddings, embedding_dim, feature_names,
    pooling_factors, data_type) -> our model spec JSON."""
    from planner.interop.importing import model_from_torchrec_tables

    try:
        raw = load_json(read_input(tables_file, "tables"), "tables", want_object=False)
        configs = raw.get("tables") if isinstance(raw, dict) else raw
        model = model_from_torchrec_tables(configs, batch_size, name=name)
    except PlannerError as exc:
        fail(exc, exc.exit_code)
    _write(model.model_dump_json(indent=1, exclude_defaults=True) + "\n", output)


@import_app.command("plan")
def import_plan_cmd(
    plan_file: Annotated[str, typer.Argument(help="TorchRec plan in `planner export` "
                                                  "format, or '-'")],
    model: Annotated[str, typer.Option(help="model spec JSON or a bundled fixture name")],
    preset: Annotated[str | None, typer.Option(help="hardware preset")] = None,
    hosts: Annotated[int | None, typer.Option(help="number of hosts")] = None,
    hardware: Annotated[Path | None, typer.Option(help="hardware spec JSON")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output")] = None,
) -> None:
    """A TorchRec plan -> our layout JSON, for `planner evaluate` and `planner check`."""
    from planner.interop.importing import layout_from_torchrec
    from planner.interop.torchrec_format import TorchRecExport
    from planner.planning import resolve
    from planner.validation import parse_json_model

    try:
        export = parse_json_model(TorchRecExport, read_input(plan_file, "plan"), "plan")
        hw = hardware_input(hardware, preset, hosts)
        request = resolve({"model": load_json(read_input(model, "model"), "model"), "hardware": hw})
        layout = layout_from_torchrec(export, request)
    except PlannerError as exc:
        fail(exc, exc.exit_code)
    _write(layout.model_dump_json(indent=1) + "\n", output)


def register(app: typer.Typer) -> None:
    """Add this package's commands to `app`."""
    app.command("export")(export_cmd)
    app.add_typer(import_app, name="import")
