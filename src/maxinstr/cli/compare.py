"""`maxinstr compare`: what changed between runs, and whether it is beyond noise. The analysis
stack (numpy) is imported inside the command, after :func:`maxinstr.cli.batch_process`."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from maxinstr.analyze.schema import is_report_file
from maxinstr.analyze.schema_check import read_report
from maxinstr.cli import batch_command, output_option, refuse_input_as_output, width_option, write_output
from maxinstr.cli.report import discover, open_trace_with_progress
from maxinstr.errors import MaxinstrError
from maxinstr.render import compare_view
from maxinstr.render.terminal import text_width

if TYPE_CHECKING:
    from maxinstr.analyze.compare import Side
    from maxinstr.analyze.report import Analysis


NO_TRACE = "-"
"""``--trace -``: no trace of its own for this run (a folder of repeats, a run whose meta.json
names its trace): the place of a run in the ordered --trace list."""


def _runs_in(p: Path) -> list[Path]:
    """The run directories directly inside ``p`` (what ``maxinstr run --repeat N`` writes: r1..rN)."""
    if not p.is_dir() or (p / "meta.json").exists():
        return []
    return sorted(c for c in p.iterdir() if (c / "meta.json").is_file())


def _sweep_value(run: Path) -> str:
    """Which ``maxinstr run --sweep`` value a run had: its launch.json label without the repeat
    (``BATCH=8`` of ``BATCH=8.r2``); '' for a run that was not part of a sweep."""
    from maxinstr.launch.runner import read_launch, sweep_label  # numpy

    try:
        launch = read_launch(run) or {}
    except MaxinstrError:
        return ""
    return sweep_label(str(launch.get("label") or ""))


def _one_program(path: str, runs: list[Path]) -> None:
    """A folder pooled into one side must hold repeats of one program: runs of different --sweep
    values pooled would be a median of two settings. MaxinstrError names them."""
    values = sorted({_sweep_value(r) for r in runs})
    if len(values) > 1:
        shown = ", ".join(v or "(none)" for v in values)
        # one run a value (what --sweep without --repeat writes): each run is a side
        how = (f": maxinstr compare {' '.join(shlex.quote(str(r)) for r in runs)}" if len(values) == len(runs)
               else " (a folder each)")
        raise MaxinstrError(f"{path}: holds runs of {len(values)} --sweep values ({shown}), not repeats of one "
                            f"program: give each value's runs as a side of its own{how}")


def _sweep_folders(p: Path) -> list[Path]:
    """The folders of repeats inside ``p``, one per value of a ``maxinstr run --sweep ... --repeat N``."""
    if not p.is_dir() or (p / "meta.json").exists():
        return []
    return sorted(c for c in p.iterdir() if c.is_dir() and not (c / "meta.json").exists() and _runs_in(c))


def _analyze_run(run_dir: Path, trace: str | None, warmup: int | None, quiet: bool,
                 output: str | None = None) -> tuple[Analysis, list[str]]:
    """One run directory with the trace and warm run beside it (as cli.report.discover finds them) unless given."""
    from maxinstr.analyze.report import analyze  # numpy
    from maxinstr.rundir import load

    run = load(run_dir)
    trace_path, unprofiled, notes = discover(str(run_dir), run.meta, trace, None)
    refuse_input_as_output(output, [trace_path])  # the trace its meta.json names
    tr = open_trace_with_progress(trace_path, quiet) if trace_path else None  # spinner on a terminal
    unprof = load(unprofiled) if unprofiled else None
    return analyze(run=run, trace=tr, unprofiled_run=unprof, warmup=warmup), notes


def _side(path: str, trace: str | None, warmup: int | None, quiet: bool, output: str | None = None) -> Side:
    from maxinstr.analyze.compare import Side  # numpy
    from maxinstr.analyze.report import analyze

    if is_report_file(path):
        if trace:
            raise MaxinstrError(f"{path}: a saved report has its kernels already: give --trace {NO_TRACE} for it")
        return Side(path, read_report(path))
    p = Path(path)
    if p.is_dir() and (p / "meta.json").exists():
        analysis, notes = _analyze_run(p, trace, warmup, quiet, output)
        return Side(path, analysis, notes)
    if repeats := _runs_in(p):
        # fresh-process repeats of one program: pooled into one side; their spread is the noise
        if trace and len(repeats) > 1:
            raise MaxinstrError(f"{path}: one --trace cannot belong to {len(repeats)} runs: each run's own trace comes "
                                f"from its meta.json (maxinstr run records it); give --trace {NO_TRACE} for this folder")
        _one_program(path, repeats)
        analyses, notes = [], []
        for r in repeats:
            analysis, found = _analyze_run(r, trace, warmup, quiet, output)  # a trace given: the folder's one run
            analyses.append(analysis)
            notes += [f"{r.name}: {n}" for n in found]
        return Side(path, analyses, notes)
    if sweep := _sweep_folders(p):
        raise MaxinstrError(f"{path}: a --sweep folder (one folder of runs per value), not one side: compare the values, "
                            f"maxinstr compare {' '.join(shlex.quote(str(c)) for c in sweep)}")
    if p.exists():  # a bare trace file or folder
        if trace:
            raise MaxinstrError(f"{path}: a trace itself: give --trace {NO_TRACE} for it")
        return Side(path, analyze(trace=open_trace_with_progress(path, quiet), warmup=warmup))
    raise MaxinstrError(f"{path}: no such run directory, report or trace")


@click.command("compare", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("runs", nargs=-1, required=True, metavar="RUN_A RUN_B [RUN ...]")
@click.option("--trace", "traces", multiple=True, metavar="FILE",
              help="A trace for each run, in order (repeat the option; '-' for a run that needs none: a folder of "
                   "repeats, a run whose meta.json names its trace). Without it a run directory's own trace "
                   "(meta.json) is used, as by maxinstr report.")
@click.option("--format", "fmt", type=click.Choice(("text", "json", "md")), default="text", show_default=True)
@output_option
@click.option("--warmup", type=click.IntRange(min=0), default=None, help="Warm-up instances per stage (overrides the sessions').")
@click.option("--quiet", is_flag=True, help="No progress display.")
@width_option
@batch_command
def command(runs: tuple[str, ...], traces: tuple[str, ...], fmt: str, output: str | None, warmup: int | None, quiet: bool,
            width: int | None) -> None:
    """Compare runs against the first: per-stage median/p90 deltas with a noise bound from the
    runs' own spread, GPU-time and kernel-mix changes, and the settings that differ.

    Each RUN is a run directory, a saved JSON report, a trace, or a folder of fresh-process
    repeats (what `maxinstr run --repeat N -o DIR` writes; with --sweep, DIR/NAME=VALUE per
    value): repeats are pooled, and their run-to-run spread bounds the noise. With one run per
    side a change beyond that run's own spread is "cannot tell": fresh processes of one program
    differ by more. A run directory's trace is the one its meta.json names (maxinstr run
    records it), unless --trace gives one.

    \b
      maxinstr compare runs/before runs/after
      maxinstr compare runs/before-x3 runs/after-x3          (folders of --repeat 3 runs)
      maxinstr compare runs/bs1 runs/bs8 runs/bs32            (each against the first)
      maxinstr compare runs/sweep/BATCH=1 runs/sweep/BATCH=8  (--sweep BATCH=1,8 --repeat 3)
      maxinstr compare runs/a runs/b --trace a.sqlite --trace b.sqlite --format md -o delta.md
    """
    if len(runs) < 2:
        raise click.UsageError("give at least two runs to compare")
    if traces and len(traces) != len(runs):
        raise click.UsageError(f"--trace given {len(traces)} time(s) for {len(runs)} runs: give one per run or none")
    from maxinstr.analyze.compare import compare  # numpy

    given = traces or (NO_TRACE,) * len(runs)
    refuse_input_as_output(output, [*runs, *(t for t in traces if t != NO_TRACE)])
    result = compare([_side(r, None if t == NO_TRACE else t, warmup, quiet, output) for r, t in zip(runs, given)])
    color = output is None and fmt == "text" and sys.stdout.isatty()
    write_output(output, compare_view(fmt).render_compare(result, width=text_width(color, width), color=color))
