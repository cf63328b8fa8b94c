"""`maxinstr compare`: what changed between runs, and whether it is beyond noise."""

from __future__ import annotations

import sys
from pathlib import Path

from typing import TYPE_CHECKING

import click

from maxinstr.cli import batch_command
from maxinstr.errors import MaxinstrError

if TYPE_CHECKING:
    from maxinstr.analyze.compare import Side


def _runs_in(p: Path) -> list[Path]:
    """The run directories directly inside ``p`` (what ``maxinstr run --repeat N`` writes: r1..rN)."""
    if not p.is_dir() or (p / "meta.json").exists():
        return []
    return sorted(c for c in p.iterdir() if (c / "meta.json").is_file())


def _side(path: str, trace: str | None, warmup: int | None, quiet: bool) -> Side:
    from maxinstr.analyze.compare import Side
    from maxinstr.analyze.report import analyze
    from maxinstr.analyze.schema import is_report_file as _is_report_file
    from maxinstr.cli.report import load_report_file, open_trace_with_progress
    from maxinstr.rundir import load

    if _is_report_file(path):
        return Side(path, load_report_file(path))
    p = Path(path)
    if p.is_dir() and (p / "meta.json").exists():
        run = load(p)
        tr = open_trace_with_progress(trace, quiet) if trace else None  # spinner on a terminal
        return Side(path, analyze(run=run, trace=tr, warmup=warmup))
    repeats = _runs_in(p)
    if repeats:
        # fresh-process repeats of one program: pooled into one side; their spread is the noise
        if trace:
            raise MaxinstrError(f"{path}: --trace goes with one run directory, not a folder of {len(repeats)} runs")
        return Side(path, [analyze(run=load(r), warmup=warmup) for r in repeats])
    if p.exists():
        # a bare trace file or folder
        return Side(path, analyze(trace=open_trace_with_progress(path, quiet), warmup=warmup))
    raise MaxinstrError(f"{path}: no such run directory, report or trace")


@click.command("compare", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("runs", nargs=-1, required=True, metavar="RUN_A RUN_B [RUN ...]")
@click.option("--trace", "traces", multiple=True, metavar="FILE",
              help="A trace for each run directory, in order (repeat the option).")
@click.option("--format", "fmt", type=click.Choice(("text", "json", "md")), default="text", show_default=True)
@click.option("-o", "--output", metavar="PATH", help="Write here instead of stdout.")
@click.option("--warmup", type=click.IntRange(min=0), default=None, help="Warm-up instances per stage (overrides the sessions').")
@click.option("--quiet", is_flag=True, help="No progress display.")
@click.option("--width", type=click.IntRange(min=40), default=None, metavar="COLUMNS",
              help="Text width (default: COLUMNS, else the terminal's, else 120).")
@batch_command
def command(runs: tuple[str, ...], traces: tuple[str, ...], fmt: str, output: str | None, warmup: int | None, quiet: bool,
            width: int | None) -> None:
    """Compare runs against the first: per-stage median/p90 deltas with a noise bound from the
    runs' own spread, GPU-time and kernel-mix changes, and the settings that differ.

    Each RUN is a run directory, a saved JSON report, a trace, or a folder of fresh-process
    repeats (what `maxinstr run --repeat N -o DIR` writes): repeats are pooled, and their
    run-to-run spread bounds the noise. With one run per side a change beyond that run's own
    spread is "cannot tell": fresh processes of one program differ by more.

    \b
      maxinstr compare runs/before runs/after
      maxinstr compare runs/before-x3 runs/after-x3          (folders of --repeat 3 runs)
      maxinstr compare runs/bs1 runs/bs8 runs/bs32            (each against the first)
      maxinstr compare runs/a runs/b --trace a.sqlite --trace b.sqlite --format md -o delta.md
    """
    if len(runs) < 2:
        raise click.UsageError("give at least two runs to compare")
    if traces and len(traces) != len(runs):
        raise click.UsageError(f"--trace given {len(traces)} time(s) for {len(runs)} runs: give one per run or none")
    from maxinstr.analyze.compare import compare

    sides = [_side(r, traces[i] if traces else None, warmup, quiet) for i, r in enumerate(runs)]
    result = compare(sides)
    if fmt == "json":
        from maxinstr.render.json import render

        text = render(result)
    elif fmt == "md":
        from maxinstr.render.markdown import render_compare as markdown

        text = markdown(result)
    else:
        from maxinstr.cli.report import text_width
        from maxinstr.render.text import render_compare as terminal

        tty = output is None and sys.stdout.isatty()
        text = terminal(result, color=tty, width=text_width(tty, width))
    if output:
        try:
            Path(output).write_text(text)
        except OSError as exc:
            raise MaxinstrError(f"{output}: cannot write ({exc.strerror or exc})") from None
        click.echo(f"maxinstr: wrote {output}", err=True)
    else:
        click.echo(text, nl=False)
