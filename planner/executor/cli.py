"""CLI commands of this package, registered on the main `planner` app by planner/cli.py.
Heavy imports stay inside the command functions so `planner plan` starts fast."""

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn

import typer

# Exit codes beside planner's (0 ok, 2 bad input): a check failed, a rank failed.
EXIT_CHECK_FAILED = 1
EXIT_RANK_FAILED = 4


class Device(StrEnum):
    cpu = "cpu"
    cuda = "cuda"


class Policy(StrEnum):
    lfu = "lfu"
    lru = "lru"


class Clock(StrEnum):
    wall = "wall"
    cpu = "cpu"


class Kernels(StrEnum):
    torch = "torch"
    fbgemm = "fbgemm"
    auto = "auto"


class Format(StrEnum):
    table = "table"
    json = "json"


def fail_plain(message: object, code: int) -> NoReturn:
    """`error: message` on stderr as it is, then exit with `code`. Not through rich: a rank's
    error carries torch.distributed's text ("[/pytorch/third_party/gloo/...]"), which rich
    would read as markup (MarkupError, exit 1 instead of `code`)."""
    sys.stdout.flush()
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add this package's commands to `app`."""

    @app.command("execute")
    def execute_cmd(
        plan: Annotated[Path, typer.Argument(help="plan JSON (from `planner plan -o`)")],
        scale_rows: Annotated[float, typer.Option(
            help="run every table with this fraction of its rows (same shape of plan)")] = 1.0,
        batch: Annotated[int | None, typer.Option(help="samples per rank (default: the "
                                                       "plan's)")] = None,
        steps: Annotated[int, typer.Option(
            help="training steps measured (memory, outputs, weights, bytes, cache hits)")
        ] = 5,
        timed_steps: Annotated[int | None, typer.Option(
            min=1, help="training steps timed after them, the memory probe stopped "
                        "(default: as many as --steps)")] = None,
        warmup_steps: Annotated[int | None, typer.Option(
            help="forward-only steps first, to warm caches (default: as many as the plan's "
                 "caches need to reach their steady state)")] = None,
        seed: Annotated[int, typer.Option()] = 0,
        lr: Annotated[float, typer.Option(help="learning rate")] = 0.01,
        device: Annotated[Device, typer.Option(help="cpu (gloo) or cuda (NCCL)")] = Device.cpu,
        cache_policy: Annotated[Policy | None, typer.Option(
            help="run every cache with this policy (default: each table's cache_policy, lfu "
                 "when absent)")] = None,
        timeout: Annotated[float, typer.Option(help="seconds for the whole run")] = 600.0,
        collective_timeout: Annotated[float, typer.Option(
            help="seconds a collective may wait for a peer")] = 60.0,
        reference: Annotated[bool, typer.Option(
            help="check outputs and weights against the unsharded reference")] = True,
        run_dir: Annotated[Path | None, typer.Option(
            help="keep the ranks' files here (default: a temporary directory)")] = None,
        prepare_only: Annotated[bool, typer.Option(
            help="write the job to --run-dir and print the torchrun command")] = False,
        collect: Annotated[bool, typer.Option(
            help="report on a finished torchrun run in --run-dir")] = False,
        output: Annotated[Path | None, typer.Option("-o", "--output",
                                                    help="write the report JSON")] = None,
        fmt: Annotated[Format, typer.Option("--format")] = Format.table,
        compare: Annotated[bool, typer.Option(
            "--compare", help="per rank and phase: the plan's predicted seconds beside the "
                              "measured ones (compute: the rank's CPU time; collectives: "
                              "wall time after a barrier; medians over the steps), the "
                              "errors, Spearman over ranks and the slowest rank")] = False,
        collective_clock: Annotated[Clock, typer.Option(
            help="with --compare, collectives in wall time after a barrier, or in the CPU "
                 "time of the threads doing them (the caller and its process group's gloo "
                 "threads: steadier on a shared machine)")] = Clock.wall,
        kernels: Annotated[Kernels, typer.Option(
            help="the ranks' embedding kernels: torch (embedding_bag), fbgemm (FBGEMM's "
                 "table-batched embedding with its fused optimizer for the hbm pieces it "
                 "serves, torch for the rest), auto (fbgemm where fbgemm_gpu imports)")
        ] = Kernels.torch,
        eps: Annotated[float, typer.Option(
            help="epsilon of the Adagrad, row-wise Adagrad and Adam updates")] = 1e-8,
        fault: Annotated[str | None, typer.Option(
            hidden=True, help="test hook: die:RANK:STEP, kill:RANK:STEP, hang:RANK:STEP or "
                              "alloc:RANK:BYTES")] = None,
    ) -> None:
        """Run PLAN for real on torch.distributed, one process per rank, and check it against
        the cost model and an unsharded reference. Exit 1 if a check fails, 4 if a rank dies
        or hangs."""
        from rich.console import Console

        from planner.cli_common import check_output, fail, write_output
        from planner.errors import PlannerError
        from planner.plan_model import Plan
        from planner.validation import parse_json_model

        check_output(output)
        try:
            plan_obj = parse_json_model(Plan, plan.read_text(), "plan")
        except (OSError, PlannerError) as exc:
            fail(exc, 2)
        try:
            import torch  # noqa: F401
        except ImportError:
            fail("the executor needs torch: pip install torch==2.13.0 (the CPU wheel; on a "
                 "GPU machine your CUDA build of torch), or run scripts/setup.sh", 2)
        from planner.executor.job import RunOptions
        from planner.executor.launch import RankFailure
        from planner.executor.run import collect as collect_run
        from planner.executor.run import execute, prepare

        opts = RunOptions(steps=steps, timed_steps=timed_steps, warmup_steps=warmup_steps,
                          seed=seed, lr=lr,
                          device=device.value,
                          cache_policy=cache_policy.value if cache_policy else None,
                          collective_timeout_s=collective_timeout, eps=eps, fault=fault,
                          kernels=kernels.value)
        if (prepare_only or collect) and run_dir is None:
            fail("--prepare-only and --collect need --run-dir", 2)
        try:
            if prepare_only:
                assert run_dir is not None
                world = prepare(plan_obj, opts, run_dir, scale_rows, batch, reference)
                print(f"torchrun --nnodes HOSTS --nproc-per-node GPUS_PER_HOST "
                      f"--rdzv-endpoint HOST0:29500 -m planner.executor.worker {run_dir}\n"
                      f"({world} ranks in all), then: planner execute {plan} --run-dir "
                      f"{run_dir} --collect")
                return
            if collect:
                assert run_dir is not None
                rep = collect_run(run_dir)
            else:
                rep = execute(plan_obj, opts, scale_rows, batch, run_dir, timeout, reference)
        except RankFailure as exc:
            fail_plain(exc, EXIT_RANK_FAILED)
        except ValueError as exc:
            fail_plain(exc, 2)
        body = json.dumps(rep.to_json(), indent=1) + "\n"
        if output is not None:
            write_output(output, body)
        if fmt is Format.json:
            sys.stdout.write(body)
        else:
            from planner.executor.report import render

            render(rep, Console(soft_wrap=False, width=160), compare=compare,
                   cpu_clock=collective_clock is Clock.cpu)
        if not rep.ok:
            raise typer.Exit(EXIT_CHECK_FAILED)
