"""The `maxinstr` command line. Each subcommand lives in its own module and is imported
only when used, so `maxinstr --help` stays fast and a broken optional part cannot break
the others."""

from __future__ import annotations

import functools
import gc
import importlib
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

import click

from maxinstr import config
from maxinstr._version import __version__
from maxinstr.errors import MaxinstrError

SUBCOMMANDS = {name: name.replace("-", "_") for name in ("report", "compare", "run", "snapshot", "deep-dive", "server")}
"""Command name -> its module under maxinstr.cli, which holds its click ``command``."""


def batch_command(command):
    """A command that reads a big trace once and exits (``report``, ``compare``): after :func:`batch_process`,
    with the cyclic garbage collector paused: a report's millions of small dicts and lists hold no cycles, and
    its passes over them were a quarter of the time of a report of 50,000 stage names."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        batch_process()
        was_on = gc.isenabled()
        gc.disable()
        try:
            return command(*args, **kwargs)
        finally:
            if was_on:
                gc.enable()

    return run


def batch_process() -> None:
    """Settings for a process that builds one report and exits; they change no result.

    - numpy is loaded here with ``OPENBLAS_NUM_THREADS=1`` (OpenBLAS starts a spinning thread per
      core, and a report makes no BLAS call big enough to use them) and ``NUMPY_MADVISE_HUGEPAGE=0``
      (huge pages are zeroed 2 MB at a time on first touch: a third more system time), unless the
      user set them; both are taken back out of the environment at once (no child inherits them).
    - glibc malloc: the mmap threshold raised to 32 MB and automatic trimming off (each freed array
      of millions of rows came back as fresh zeroed pages: a quarter of the CPU time was page
      faults), and one arena for every thread, so the main thread reuses what the reader's threads
      free (33 MB less peak memory on a 1M-kernel trace); the readers skip ``malloc_trim`` too.
    """
    if "numpy" not in sys.modules:
        added = []
        for k, v in (("OPENBLAS_NUM_THREADS", "1"), ("NUMPY_MADVISE_HUGEPAGE", "0")):
            if k not in os.environ:
                os.environ[k] = v
                added.append(k)
        try:
            import numpy  # noqa: F401
        finally:
            for k in added:
                del os.environ[k]
    if sys.platform.startswith("linux") and not config.no_malloc_tuning():
        try:
            import ctypes  # here: not every command pays for it

            libc = ctypes.CDLL(None)
            mallopt = getattr(libc, "mallopt", None)  # glibc (musl has none)
            if mallopt is not None and hasattr(libc, "malloc_trim"):
                mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
                mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
                mallopt(-8, 1)  # M_ARENA_MAX: what the reader's threads free, numpy reuses
                from maxinstr.traces import keep_freed_memory  # (after numpy: the readers import it)

                keep_freed_memory()
        except (OSError, AttributeError, TypeError):
            pass


# -o PATH of report and compare; ``-o -`` is stdout, as for any Unix tool (``-o ./-`` for a file named -)
output_option = click.option("-o", "--output", metavar="PATH", callback=lambda _c, _p, v: None if v == "-" else v,
                             help="Write here instead of stdout ('-': stdout).")
# --width COLUMNS: 40 fits a stage and a number column; past 1000 no table needs more (names are whole at 200)
width_option = click.option("--width", type=click.IntRange(min=40, max=1000), default=None, metavar="COLUMNS",
                            help="Text width (default: COLUMNS, else the terminal's, else 120).")


def write_output(output: str | None, text: str | Callable[[str], object]) -> None:
    """What a command made, to stdout or to ``-o PATH``: ``text``, or a function that writes it
    to the path itself (a Perfetto trace is streamed); an unwritable path is one line."""
    if not output:
        click.echo(text, nl=False)
        return
    try:
        text(output) if callable(text) else Path(output).write_text(text)
    except OSError as exc:
        raise MaxinstrError(f"{output}: cannot write ({exc.strerror or exc})") from None
    click.echo(f"maxinstr: wrote {output}", err=True)


def refuse_input_as_output(output: str | None, inputs: list[str | None]) -> None:
    """``-o`` naming what the command reads is a usage error before anything is written (one slip of a
    path made a report of meta.json): a file read (a trace, a saved report), a file in a folder read as
    a trace, a run directory's own files (meta.json, parts/, profile.*...). A new file is always fine,
    and so is one of the user's in a run directory (report.md). Compared resolved: links and ``..``
    do not get round it."""
    if not output or not (out := Path(output)).exists():
        return
    from maxinstr.launch.layout import RUN_NAMES

    out = out.resolve()
    exports = [str(Path(g).with_suffix(".sqlite")) for g in inputs if g and g.endswith((".nsys-rep", ".qdrep"))]
    for given in [*inputs, *exports]:  # (a .nsys-rep is read through the SQLite export beside it)
        if not given or not (p := Path(given)).exists():
            continue
        if os.path.samefile(out, p):
            raise UserError(f"-o {output}: the input {given} itself; nothing written (give another path)")
        try:
            below = out.relative_to(p.resolve()).parts
        except ValueError:
            continue
        run_dir = (p / "meta.json").is_file()
        if not run_dir or below[0] in RUN_NAMES:
            raise UserError(f"-o {output}: a file of the {'run directory' if run_dir else 'folder'} {given}, which "
                            "this command reads; nothing written (give a new file)")


def after_dashes(words: tuple[str, ...]) -> list[str]:
    """A program's command line as click hands it over: without the ``--`` that set it apart."""
    return list(words[1:] if words[:1] == ("--",) else words)


class Seconds(click.FloatRange):
    """A number of seconds for an option: finite, > 0 (>= 0 with ``zero_ok``), else a usage error before
    anything starts; ``FloatRange`` alone lets ``nan`` and ``inf`` through (no comparison fails them)."""

    name = "seconds"

    def __init__(self, *, zero_ok: bool = False) -> None:
        super().__init__(min=0, min_open=not zero_ok)

    def convert(self, value, param, ctx):
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds.", param, ctx)
        return seconds


class UserError(click.ClickException):
    """A problem with the user's input: printed as one line, exit status 2."""

    exit_code = 2

    def show(self, file=None) -> None:  # one line, no "Error:" banner clutter
        click.echo(f"maxinstr: {self.format_message()}", err=True)


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = SUBCOMMANDS.get(cmd_name)
        return None if module is None else importlib.import_module(f"maxinstr.cli.{module}").command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks on errors (or MAXINSTR_DEBUG=1).")
@click.version_option(version=__version__, prog_name="maxinstr")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """maxinstr: where does my GPU time go, stage by stage."""
    ctx.obj = {"debug": debug or config.debug()}


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning unexpected errors into one line unless --debug."""
    if argv is not None:
        return _main(argv)
    try:
        return _main(sys.argv[1:])
    finally:
        # The process exits next: the interpreter's shutdown would run the cyclic collector over
        # every object still alive (numpy's, click's, ours), a third of a small report's wall time
        gc.freeze()


def _main(args: list[str]) -> int:
    debug = "--debug" in args or config.debug()
    try:
        rv = cli.main(args=args, prog_name="maxinstr", standalone_mode=False)
        # Without standalone mode click returns (not raises) a command's ctx.exit(code).
        if isinstance(rv, int) and not isinstance(rv, bool) and rv != 0:
            return rv
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except MaxinstrError as exc:
        if debug:
            raise
        click.echo(f"maxinstr: {exc}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("maxinstr: aborted", err=True)
        return 130
    except MemoryError:
        if debug:
            raise
        # (its message is empty: "MemoryError: " said nothing)
        click.echo("maxinstr: out of memory: the input needs more memory than this process could get "
                   "(run with --debug for the traceback)", err=True)
        return 1
    except Exception as exc:  # the CLI's last line of defence
        if debug:
            raise
        click.echo(f"maxinstr: {exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else 'no message'} "
                   "(run with --debug for the traceback)", err=True)
        return 1
    return 0
