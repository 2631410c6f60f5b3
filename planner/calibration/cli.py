"""`planner calibrate`: measure this machine, fit the constants, write a hardware profile.

Heavy imports (torch, scipy) stay inside the command so `planner plan` starts fast."""

import json
import os
import shlex
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from planner.calibration.bench import Measurements


class CalDevice(StrEnum):
    cpu = "cpu"
    cuda = "cuda"


def register(app: typer.Typer) -> None:
    """Add `calibrate` to `app`."""

    @app.command("calibrate")
    def calibrate_cmd(
        output: Annotated[Path, typer.Option("-o", "--output",
                                             help="hardware profile JSON to write")],
        device: Annotated[CalDevice | None, typer.Option(
            help="cpu (executor kernels on CPU, gloo; the default) or cuda (CUDA kernels, "
                 "NCCL)")] = None,
        world_size: Annotated[int | None, typer.Option(
            help="largest number of ranks for the collectives; every world size from 2 to "
                 "this is measured (two or more sizes tell a call's latency from a peer's; "
                 "default 3)")] = None,
        preset: Annotated[str | None, typer.Option(
            help="base preset: capacities, topology and every constant not fitted "
                 "(default h100)")] = None,
        long: Annotated[bool, typer.Option(
            "--long", help="more shapes, sizes and repeats (minutes, not seconds)")] = False,
        smoke: Annotated[bool, typer.Option(
            "--smoke", help="a seconds-long run (tests): few shapes, 2 ranks only")] = False,
        reps: Annotated[int | None, typer.Option(help="timed repeats per point")] = None,
        sessions: Annotated[list[Path] | None, typer.Option(
            "--from", help="measure nothing: fit the measurements of earlier calibrations "
                           "(their .provenance.json, or the profile beside it), each point "
                           "the median over them; repeat for each session (three or more "
                           "made at different times outvote one slow spell)")] = None,
        quiet: Annotated[bool, typer.Option(help="no progress line")] = False,
    ) -> None:
        """Time the executor's lookups and backwards (small table-wise plans it runs), host
        tiers and collectives on this machine, fit the cost model's latency and bandwidth
        constants (robust least squares, 95% intervals), and
        write a hardware profile that `planner plan --hardware` takes (provenance and every
        fit in OUTPUT's .provenance.json beside it). With --from, fit earlier sessions'
        measurements instead, each point the median over them."""
        from planner.cli_common import check_output, fail, write_output

        check_output(output)
        start = time.monotonic()
        extra: dict[str, object] = {}
        if sessions:
            if long or smoke or reps is not None or world_size is not None:
                fail("--from fits earlier sessions' measurements: --long, --smoke, --reps "
                     "and --world-size are options of a measuring run", 2)
            from planner.calibration.sessions import about_sessions, load_session, merge, spread
            from planner.errors import BadInputError

            try:
                got = [load_session(path) for path in sessions]
                m = merge(got)
                spreads = spread(got, m)
            except BadInputError as exc:
                fail(exc, 2)
            for name, given, theirs in (("--device", device and device.value,
                                         got[0].about["device"]),
                                        ("--preset", preset, got[0].about["base_preset"])):
                if given is not None and given != theirs:
                    fail(f"{name} {given}: the sessions were measured with {theirs}", 2)
            dev, base = CalDevice(got[0].about["device"]), str(got[0].about["base_preset"])
            extra = {"sessions": about_sessions(got), "session_spread": spreads,
                     "merged": f"each point the median over {len(got)} sessions' measured "
                               "figures (planner/calibration/sessions.py)"}
        else:
            dev, base = device or CalDevice.cpu, preset or "h100"
            m = _measure(dev, 3 if world_size is None else world_size, base, long, smoke,
                         reps, quiet)
        from planner.calibration.profile import (
            COLLECTIVE_NAMES,
            HOST_NAMES,
            KERNEL_NAMES,
            build_profile,
        )
        from planner.errors import BadInputError
        from planner.spec import HardwareSpec
        from planner.validation import validate_model

        command = "planner " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        try:
            spec, provenance = build_profile(base, m, dev.value, command)
            resolved = validate_model(HardwareSpec, spec)
        except (BadInputError, ValueError) as exc:
            fail(f"the fitted profile is not valid: {exc}", 1)
        except (KeyError, TypeError) as exc:
            if not sessions:
                raise
            # Sessions of another code's format agree with each other but lack a term.
            fail(f"--from: the sessions' points lack what this fit reads ({exc!r}): "
                 "calibrate them again with this version", 2)
        provenance = {**provenance, **extra}
        write_output(output, json.dumps(spec, indent=1) + "\n")
        side = output.with_suffix(".provenance.json")
        write_output(side, json.dumps(provenance, indent=1) + "\n")
        c = resolved.constants.model_dump()  # the preset's defaults where nothing was fitted
        eff = provenance["effective_bandwidth_gb_per_s"]
        fits = provenance["fits"]
        print(f"wrote {output} (and {side.name}) in {time.monotonic() - start:.1f} s")
        print("  effective bandwidths (GB/s): " + ", ".join(
            f"{k} {v:.3g}" if v else f"{k} not seen (preset's kept)" for k, v in eff.items()))
        for name in (n for n in (*KERNEL_NAMES, *HOST_NAMES, *COLLECTIVE_NAMES)
                     if not n.startswith("inv_")):
            # The step fit's call first: it is the profile's (build_profile).
            fit = next((f["constants"][name] for k in (
                "step_alltoall", "kernels", "host", "collectives")
                if (f := fits[k]) and name in f["constants"]), None)
            interval = f"95% {fit['ci95'][0]:.3g} .. {fit['ci95'][1]:.3g}" if fit else \
                f"{base}'s"
            print(f"  {name:26s} {c.get(name, 0.0):.3g} s  ({interval})")
        ov = fits["overlap"]
        print(f"  {'pipeline_overlap':26s} {c.get('pipeline_overlap', 1.0):.3g}    "
              + (f"(shares' 95% {ov['ci95_raw'][0]:.3g} .. {ov['ci95_raw'][1]:.3g}, "
                 f"{ov['points']} ranks"
                 + ("" if ov["determined"] else f": not determined, {base}'s kept") + ")"
                 if ov else f"({base}'s)"))
        for k in ("kernels", "host", "collectives", "step_alltoall"):
            f = fits[k]
            if f is None:
                continue
            print(f"  {k} fit: median |rel. residual| {f['rel_residual_median']:.3f}, "
                  f"p90 {f['rel_residual_p90']:.3f}, {f['points']} points, "
                  f"{f['outliers']} outliers")


def _measure(device: CalDevice, world_size: int, preset: str, long: bool, smoke: bool,
             reps: int | None, quiet: bool) -> "Measurements":
    """Every microbenchmark and calibration plan on this machine, with a progress line."""
    from planner.cli_common import fail

    if world_size < 1 or world_size > 64:
        fail("--world-size must be between 1 and 64", 2)
    import torch

    if device is CalDevice.cuda:
        if not torch.cuda.is_available():
            fail("--device cuda: no CUDA device is visible to torch on this machine "
                 f"(torch {torch.__version__}); calibrate with --device cpu", 2)
        if world_size > torch.cuda.device_count():
            world_size = torch.cuda.device_count()
    from dataclasses import replace

    from planner.calibration.bench import (
        BenchConfig,
        Measurements,
        bench_collectives,
        bench_host_tiers,
        steps_of,
    )
    worlds = tuple(w for w in range(2, world_size + 1)) if world_size >= 2 else ()
    if smoke:
        cfg = replace(BenchConfig.smoke(), world_sizes=worlds[:1])
    elif long:
        cfg = replace(BenchConfig.long(world_size), world_sizes=worlds)
    else:
        # Two world sizes tell a call's latency from a peer's.
        cfg = replace(BenchConfig(), world_sizes=worlds[:2])
    if reps is not None:
        cfg = replace(cfg, reps=max(1, reps))
    # The calibration plans and host tiers run in as many ranks as the executor would
    # run here (one per core on CPU, one per GPU).
    slots = len(os.sched_getaffinity(0)) if device is CalDevice.cpu else world_size
    cfg = replace(cfg, compute_ranks=max(1, min(world_size, slots)))
    total = steps_of(cfg)
    done = [0]
    start = time.monotonic()

    def tick() -> None:
        done[0] += 1
        if not quiet:
            width = 30
            fill = width * done[0] // max(total, 1)
            sys.stderr.write(f"\rcalibrate [{'#' * fill}{'.' * (width - fill)}] "
                             f"{done[0]}/{total} {time.monotonic() - start:5.1f} s")
            sys.stderr.flush()

    # As the executor's ranks run (worker.py): one thread, deterministic algorithms
    # (9% slower on a rank's backward loop here, measured: index_put_ and index_add_
    # take their deterministic paths).
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    m = Measurements()
    try:
        bench_host_tiers(cfg, device.value, m, tick)
    except RuntimeError as exc:
        fail(f"host-tier benchmark failed: {exc}", 4)
    from planner.calibration.executed import bench_executed

    try:
        # Lookups and backwards: small table-wise plans run by the executor itself.
        # and their all-to-all phases, where the all-to-all's call is timed.
        got = bench_executed(cfg.compute_ranks, device.value, preset, cfg.executed_reps,
                             tick, cfg.executed_plans)
        m.lookup, m.backward, m.step_alltoall = got.lookup, got.backward, got.alltoall
    except (RuntimeError, OSError) as exc:
        fail(f"calibration plans failed to run: {exc}", 4)
    if cfg.compute_ranks >= 2:
        from planner.calibration.executed import bench_overlap

        try:
            # pipeline_overlap: calibration plans run in turn and pipelined.
            m.overlap = bench_overlap(cfg.compute_ranks, device.value, preset,
                                      cfg.executed_reps, tick, cfg.overlap_plans)
        except (RuntimeError, OSError) as exc:
            fail(f"overlap plans failed to run: {exc}", 4)
    if device is CalDevice.cuda and torch.cuda.device_count() < 2:
        cfg = replace(cfg, world_sizes=())
    if not cfg.world_sizes:
        # All-to-all and all-reduce need two ranks (two GPUs with --device cuda).
        sys.stderr.write("\nnote: one rank: collectives not measured, their constants "
                         f"are {preset}'s\n")
    try:
        bench_collectives(cfg, device.value, m, tick)
    except RuntimeError as exc:
        fail(f"collective benchmark failed: {exc}", 4)
    if not quiet:
        sys.stderr.write("\n")
    return m
