"""`maxinstr report`: a per-stage report from a run directory, a trace, or both.

The analysis stack (traces, rundir, analyze: numpy) is imported inside the command, after
:func:`maxinstr.cli.batch_process` has set numpy's environment, and never by ``--help``."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from maxinstr._text import visible
from maxinstr.analyze.schema import is_report_file
from maxinstr.analyze.schema_check import read_report
from maxinstr.cli import batch_command, output_option, refuse_input_as_output, width_option, write_output
from maxinstr.errors import MaxinstrError, TraceError
from maxinstr.render import VIEWS, view
from maxinstr.render.terminal import text_width

if TYPE_CHECKING:
    from maxinstr.analyze.report import TraceArg
    from maxinstr.rundir import Run
    from maxinstr.traces.model import Trace


class Progress:
    """A spinner on stderr while inputs load and the report is computed (none when quiet or not on a terminal)."""

    def __init__(self, quiet: bool = False) -> None:
        self._status = None
        if not quiet and _may_be_terminal():  # else rich is not imported at all (a tenth of the imports of a report)
            from rich.console import Console

            console = Console(stderr=True)
            self._status = console.status("maxinstr report ...") if console.is_terminal else None

    def __enter__(self) -> Progress:
        if self._status is not None:
            self._status.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)

    def update(self, message: str) -> None:
        """Show ``message``: text, never rich markup (it quotes paths and a reader's words, and a
        run directory named ``r[/]`` made rich raise MarkupError), control characters escaped."""
        if self._status is not None:
            from rich.text import Text  # (rich is loaded already when there is a status)

            self._status.update(Text(visible(message)))


def _may_be_terminal() -> bool:
    """False when rich's Console(stderr=True).is_terminal would be False for certain: stderr is
    not a tty and no environment variable (FORCE_COLOR, TTY_COMPATIBLE) says otherwise."""
    if os.environ.get("TTY_COMPATIBLE", "") == "1" or os.environ.get("FORCE_COLOR") is not None:
        return True
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except Exception:  # noqa: BLE001 - a closed or odd stream: rich says False too
        return False


def open_trace_with_progress(path: str, quiet: bool = False, progress: Progress | None = None) -> Trace:
    """Open a trace, showing a spinner and the reader's progress messages on stderr while it loads."""
    from maxinstr.traces import open_trace  # numpy: after batch_process()

    if not Path(path).exists():
        raise MaxinstrError(f"{path}: no such trace file or folder")
    with Progress(quiet) if progress is None else contextlib.nullcontext(progress) as on:
        on.update(f"reading {path} ...")
        return open_trace(path, progress=lambda msg: on.update(f"{path}: {msg}"))


WARM_RUN_DIR = "warm-run"
"""Where `maxinstr run --warm-run` leaves its unprofiled run of the same program."""


def discover(run_dir: str, meta: dict, trace_path: str | None, unprofiled: str | None) -> tuple[str | None, str | None, list[str]]:
    """Inputs `maxinstr run` left beside a run directory: the profiler's trace (meta.json
    ``profiler.trace``) and the unprofiled warm run (``RUN/warm-run``), used when not given."""
    notes: list[str] = []
    prof = meta.get("profiler") if isinstance(meta, dict) else None
    if trace_path is None and isinstance(prof, dict) and prof.get("trace"):
        from maxinstr.rundir.format import inside, run_artifact  # numpy: after batch_process()

        found = run_artifact(run_dir, prof["trace"])
        recorded = Path(str(prof["trace"]))
        if found:
            trace_path = found
            notes.append(f"trace {found} found in meta.json (profiler.trace)")
        elif not inside(run_dir, recorded if recorded.is_absolute() else Path(run_dir) / recorded):
            notes.append(f"meta.json names the trace {prof['trace']}, outside the run directory: not read "
                         "(give --trace to use it)")
        else:
            notes.append(f"meta.json names the trace {prof['trace']}, which is missing: no kernels in this report")
    warm = Path(run_dir) / WARM_RUN_DIR
    if unprofiled is None and (warm / "meta.json").is_file():
        unprofiled = str(warm)
        notes.append(f"headline timings from the unprofiled warm run {warm}")
    return trace_path, unprofiled, notes


def _program(command: object) -> tuple[str | None, list[str]]:
    """(the program a recorded command ran: its script under an interpreter, else its
    executable; its arguments without paths, which differ from run to run: --run-dir /tmp/a)."""
    if not isinstance(command, list) or not command or not all(isinstance(w, str) for w in command):
        return None, []
    words = list(command)
    if Path(words[0]).name.startswith("python") and len(words) > 1:
        words = words[2:] if words[1] == "-m" and len(words) > 2 else words[1:]  # the script, or -m's module
    return Path(words[0]).name, [w for w in words[1:] if "/" not in w]


def unprofiled_problem(path: str, run: Run, unprof: Run) -> list[str]:
    """--unprofiled must be the same program run without the profiler: another program (or one
    sharing no stage with the run) is refused in one line; the same one with other arguments is
    said in a note."""
    prog, args = _program(run.meta.get("command"))
    uprog, uargs = _program(unprof.meta.get("command"))
    if prog and uprog and prog != uprog:
        raise MaxinstrError(f"{path}: --unprofiled is a run of {uprog}, this run is of {prog}: give an unprofiled "
                            "run of the same program")
    if len(run.stages) and len(unprof.stages) and not set(run.stage_names().tolist()) & set(unprof.stage_names().tolist()):
        raise MaxinstrError(f"{path}: --unprofiled shares no stage name with this run: give an unprofiled run of the "
                            "same program")
    if prog and uprog and args != uargs:
        def pairs(words: list[str]) -> list[str]:  # "--mode kvcache" one item: a flag and its value
            out: list[str] = []
            for w in words:
                if out and out[-1].startswith("-") and " " not in out[-1] and not w.startswith("-"):
                    out[-1] += f" {w}"
                else:
                    out.append(w)
            return out

        mine, theirs = pairs(args), pairs(uargs)
        return [f"--unprofiled {path} ran {prog} with {' '.join(w for w in theirs if w not in mine) or 'other arguments'}"
                f" (this run: {' '.join(w for w in mine if w not in theirs) or 'other arguments'}): its headline timings "
                "are of that configuration"]
    return []


def _is_bare_trace(path: str) -> bool:
    """A positional argument that is neither a run directory nor a saved report: a trace file,
    or a folder without meta.json and parts/ (rocprofv3 writes its trace as a folder)."""
    p = Path(path)
    if p.is_file():
        return not is_report_file(path)
    return p.is_dir() and not (p / "meta.json").exists() and not (p / "parts").is_dir()


@click.command("report", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dir", required=False, metavar="[RUN_DIR | TRACE | REPORT.json]")
@click.option("--trace", "trace_paths", metavar="FILE", multiple=True,
              help="Vendor trace: nsys .sqlite/.nsys-rep, rocprofv3 folder/CSV, RPD, Kineto JSON. Repeat it for a "
                   "multi-rank run, one trace per rank: the rank comes from RANK=FILE, else from the file name "
                   "(r0.sqlite, rank1.nsys-rep), else from the order of the ranks.")
@click.option("--format", "fmt", type=click.Choice(tuple(VIEWS)), default="text", show_default=True)
@output_option
@click.option("--unprofiled", metavar="RUN_DIR", help="An unprofiled run of the same program: headline timings come from it.")
@click.option("--warmup", type=click.IntRange(min=0), default=None, help="Warm-up instances per stage (overrides the session's).")
@click.option("--quiet", is_flag=True, help="No progress display.")
@width_option
@batch_command
def command(run_dir: str | None, trace_paths: tuple[str, ...], fmt: str, output: str | None, unprofiled: str | None,
            warmup: int | None, quiet: bool, width: int | None) -> None:
    """Per-stage report: where the time goes, stage by stage, and why.

    RUN_DIR is what maxinstr.session() wrote; --trace adds a profiler's kernels. Either alone
    works (a trace given in RUN_DIR's place is read as --trace). A saved JSON report can be
    given instead of RUN_DIR to render it again.

    \b
      maxinstr report runs/decode
      maxinstr report runs/decode --trace runs/decode/profile.sqlite --format md -o note.md
      maxinstr report profile.nsys-rep            (a trace alone: its NVTX/roctx ranges are the stages)
      maxinstr report runs/decode --format html -o report.html
      maxinstr report runs/decode --format perfetto -o trace.json   (open in ui.perfetto.dev)
    """
    paths = list(trace_paths)
    bare_folder = None
    given_unprofiled = unprofiled
    if run_dir and not Path(run_dir).exists():
        # what is missing, by what the name says it is (a trace's suffix is no run directory)
        what = ("report or trace file" if run_dir.endswith(".json") and not run_dir.endswith(".trace.json")
                else "trace file" if Path(run_dir).suffix else "run directory")
        raise MaxinstrError(f"{run_dir}: no such {what}")
    if run_dir and not paths and _is_bare_trace(run_dir):
        # `maxinstr report TRACE` means `maxinstr report --trace TRACE`
        bare_folder = run_dir if Path(run_dir).is_dir() else None
        paths, run_dir = [run_dir], None
    trace_path = paths[0] if len(paths) == 1 else None
    if not run_dir and not paths:
        raise click.UsageError("give a RUN_DIR, a --trace FILE, or both")
    if len(paths) > 1 and not run_dir:
        raise click.UsageError("several --trace files are one per rank: give the RUN_DIR they belong to")
    analysis = None
    if run_dir and is_report_file(run_dir):
        refuse_input_as_output(output, [run_dir])
        report = read_report(run_dir)  # a regular file only, every field of its type
    else:
        # numpy: imported after batch_process()
        from maxinstr.analyze.ranks import assign_trace_ranks, part_ranks, trace_rank_from_name
        from maxinstr.analyze.report import analyze
        from maxinstr.rundir import load

        run = None
        auto_notes: list[str] = []
        with Progress(quiet) as progress:
            if run_dir:
                progress.update(f"reading {run_dir} ...")
                run = load(run_dir)
                trace_path, unprofiled, auto_notes = discover(run_dir, run.meta, trace_path, unprofiled)
            refuse_input_as_output(output, [run_dir, trace_path, unprofiled, *paths, *(p.partition("=")[2] for p in paths)])
            trace_ranks = None
            trace: TraceArg | list[TraceArg] | None
            run_ranks = sorted(set(part_ranks(run.parts).tolist()) - {-1}) if run is not None else []
            one_rank_trace = (len(paths) == 1 and len(run_ranks) > 1
                              and (trace_rank_from_name(paths[0]) is not None
                                   or paths[0].partition("=")[0].strip().isdigit()))
            if len(paths) > 1 or one_rank_trace:
                try:
                    pairs = assign_trace_ranks(paths, run_ranks)
                except ValueError as exc:
                    raise MaxinstrError(str(exc)) from None
                trace_ranks = [r for r, _ in pairs]
                trace = [open_trace_with_progress(p, quiet, progress) for _, p in pairs]
            else:
                try:
                    trace = open_trace_with_progress(trace_path, quiet, progress) if trace_path else None
                except TraceError as exc:
                    if bare_folder is None:
                        raise
                    if "no trace found" in exc.problem:
                        raise MaxinstrError(f"{bare_folder}: not a run directory (no meta.json) and no trace in it "
                                            f"({exc.problem})") from None
                    # a trace that is there but broken: the reader's own words, after what was tried
                    raise MaxinstrError(f"{bare_folder}: not a run directory (no meta.json); read as a trace: "
                                        f"{exc}") from None
            unprof = load(unprofiled) if unprofiled else None
            if unprof is not None and run is not None and given_unprofiled:
                # (the warm run `maxinstr run --warm-run` left is the same command by construction)
                auto_notes += unprofiled_problem(str(unprofiled), run, unprof)
            progress.update("attributing kernels to stages and computing the report ...")
            analysis = analyze(run=run, trace=trace, unprofiled_run=unprof, warmup=warmup, trace_ranks=trace_ranks)
        report = analysis.report
        report["sources"]["notes"] = auto_notes + report["sources"]["notes"]
    if output and fmt == "perfetto":
        from maxinstr.render import perfetto  # numpy, the timeline: only for this view

        # streamed to the file event by event: a 10M-kernel timeline is GBs of JSON, and building
        # it as one string first would hold all of it (and a copy) in memory
        write_output(output, lambda path: perfetto.write(path, report, analysis=analysis))
        return
    color = output is None and fmt == "text" and sys.stdout.isatty()
    write_output(output, view(fmt).render(report, analysis, width=text_width(color, width), color=color))
