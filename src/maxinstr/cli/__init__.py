"""The `maxinstr` command line. Each subcommand lives in its own module and is imported
only when used, so `maxinstr --help` stays fast and a broken optional part cannot break
the others."""

from __future__ import annotations

import importlib
import sys

import click

from maxinstr import __version__, config
from maxinstr.errors import MaxinstrError

# name -> module under maxinstr.cli exposing `command` (a click.Command)
SUBCOMMANDS: dict[str, str] = {
    "report": "report",
    "compare": "compare",
    "run": "run",
    "snapshot": "snapshot",
    "deep-dive": "deep_dive",
    "server": "server",
}


def without_gc(command):
    """Run a batch command with the cyclic garbage collector paused: a report builds millions
    of small dicts and lists that hold no cycles, and the collector's passes over them were a
    quarter of the time of a report of 50,000 stage names. Reference counting still frees
    everything; the collector is back on when the command returns."""
    import functools
    import gc

    @functools.wraps(command)
    def run(*args, **kwargs):
        was_on = gc.isenabled()
        gc.disable()
        try:
            return command(*args, **kwargs)
        finally:
            if was_on:
                gc.enable()

    return run


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
        if module is None:
            return None
        return importlib.import_module(f"maxinstr.cli.{module}").command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks on errors (or MAXINSTR_DEBUG=1).")
@click.version_option(version=__version__, prog_name="maxinstr")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """maxinstr: where does my GPU time go, stage by stage."""
    ctx.obj = {"debug": debug or config.debug()}


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning unexpected errors into one line unless --debug."""
    args = sys.argv[1:] if argv is None else argv
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
    except Exception as exc:  # the CLI's last line of defence
        if debug:
            raise
        click.echo(f"maxinstr: {exc.__class__.__name__}: {exc} (run with --debug for the traceback)", err=True)
        return 1
    return 0
