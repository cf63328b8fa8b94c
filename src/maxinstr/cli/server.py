"""`maxinstr server start|window|stop|run`: profile a long-running server around benchmark windows."""

from __future__ import annotations

import functools
import shlex
from pathlib import Path

import click

from maxinstr.cli import Seconds, UserError, after_dashes
from maxinstr.cli.run import choose_presets
from maxinstr.errors import MaxinstrError
from maxinstr.launch import runner
from maxinstr.launch import server as srv
from maxinstr.launch.env import find_tool
from maxinstr.launch.instrument import parse_spec
from maxinstr.render.serving import serving_text
from maxinstr.rundir import load


def _nsys_path(profiler: str) -> str | None:
    if profiler != "nsys":
        return None
    if not (tool := find_tool("nsys", probe_version=False)).found:
        raise MaxinstrError(f"nsys is not installed: {tool.install_hint()}")
    return tool.path


_say = functools.partial(click.echo, err=True)


@click.group("server", short_help="Profile a long-running server around benchmark windows.")
def command() -> None:
    """Start a server under `nsys launch` (nothing is collected while it loads), capture one
    window per benchmark with `nsys start`/`nsys stop`, and shut it down.

    \b
    maxinstr server start -o runs/serve --ready 'Server ready' -- max serve --model ...
    maxinstr server window runs/serve -- python bench.py --requests 200
    maxinstr server stop runs/serve
    (or all three at once: maxinstr server run -o runs/serve --ready ... --bench 'python bench.py' -- max serve ...)
    """


_start_options = [
    click.option("-o", "--out", type=click.Path(path_type=Path), required=True, help="Run directory for the server."),
    click.option("--profiler", type=click.Choice(["nsys", "none"]), default="nsys", show_default=True),
    click.option("--ready", default=None, metavar="REGEX", help="Log line that says the server is ready (default: do not wait)."),
    click.option("--ready-timeout", type=Seconds(), default=600.0, show_default=True, help="Seconds to wait for --ready."),
    click.option("--stage", "stages", multiple=True, metavar="MODULE:QUALNAME[=name]", help="Wrap server code in stages."),
    click.option("--preset", "presets", multiple=True, metavar="NAME",
                 help="Named --stage wrap points (max: MAX's pipelines; by itself for `max serve`)."),
    click.option("--no-preset", is_flag=True, help="Apply no preset by itself."),
    click.option("--no-fail-fast", is_flag=True, help="Do not stop the server when its log shows a fatal error while starting."),
]


def _apply(options):
    return lambda f: functools.reduce(lambda g, opt: opt(g), reversed(options), f)


def _start(out, profiler, ready, ready_timeout, stages, presets, no_preset, no_fail_fast, cmd) -> srv.ServerState:
    for text in stages:
        parse_spec(text)
    if not cmd:
        raise click.UsageError("give the server command after --")
    chosen = choose_presets(cmd, presets, no_preset)
    # as `maxinstr run`: a bad -o or a command that cannot start is one line, and nothing is made
    if (problem := runner.run_dir_problem(out)) is not None:
        raise UserError(f"-o {out}: {problem}; nothing was started")
    if (problem := runner.command_problem(cmd)) is not None:
        raise UserError(f"{problem}; nothing was started")
    state = srv.start_server(cmd, out, profiler=profiler, nsys_path=_nsys_path(profiler), ready=ready,
                             ready_timeout_s=ready_timeout, stage_specs=list(stages), presets=chosen,
                             fail_fast=not no_fail_fast)
    click.echo(f"maxinstr: server running (pid {state.pid}, process group {state.pgid}); log {state.log}", err=True)
    if state.session:
        click.echo(f"maxinstr: nsys session {state.session}: nothing is collected until `maxinstr server window {out}`", err=True)
    return state


@command.command("start", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@_apply(_start_options)
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def start_cmd(out, profiler, ready, ready_timeout, stages, presets, no_preset, no_fail_fast, cmd) -> None:
    """Start CMD as a server and return once it is ready.

    \b
      maxinstr server start -o runs/serve --ready 'Server ready' -- max serve --model ...
    """
    _start(out, profiler, ready, ready_timeout, stages, presets, no_preset, no_fail_fast, after_dashes(cmd))


def serving_lines(run_dir: str | Path, start_ns: int | None = None, end_ns: int | None = None) -> list[str]:
    """The run's serving loop over [start_ns, end_ns] (host clock) as text lines: batched steps, queueing."""
    from maxinstr.analyze.serving import serving_summary  # the analysis stack: only after a window

    try:
        run = load(run_dir)
    except (MaxinstrError, OSError) as exc:
        return [f"serving loop: {exc}"]
    return serving_text(serving_summary(run, start_ns, end_ns))


def _window(run_dir: Path, duration: float | None, bench: list[str] | None, timeout: float | None, quiet: bool) -> bool:
    window, artifact, bench_result = srv.profile_window(run_dir, duration_s=duration, bench=bench, timeout_s=timeout,
                                                        echo=None if quiet else srv.sv.print_line, say=_say)
    click.echo(f"maxinstr: window {window['index']}: {window['wall_s']:.1f} s"
               + (f", benchmark {bench_result.describe()}" if bench_result else ""), err=True)
    for line in serving_lines(run_dir, window["host_start_ns"], window["host_end_ns"]):
        click.echo(f"maxinstr: {line}", err=True)
    ok = bench_result is None or bench_result.ok
    if artifact is not None:
        if artifact.ok:
            click.echo(f"maxinstr: window {window['index']} trace: {artifact.kernels} kernels in {artifact.trace}", err=True)
            for role, path in artifact.files.items():
                if role != "trace":
                    click.echo(f"    {role}: {path}", err=True)
            click.echo(f"maxinstr: report: maxinstr report {shlex.quote(str(run_dir))} --trace {shlex.quote(artifact.trace or '')}",
                       err=True)
        for problem in artifact.problems:
            click.echo(f"maxinstr: nsys: {problem}", err=True)
        ok = ok and artifact.ok
    return ok


@command.command("window", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": True})
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--duration", type=Seconds(), default=None, help="Seconds to capture when no benchmark command is given (default 10).")
@click.option("--timeout", type=Seconds(), default=None, help="Stop the benchmark command after this many seconds.")
@click.option("-q", "--quiet", is_flag=True, help="Do not echo the benchmark's output.")
@click.argument("bench", nargs=-1, type=click.UNPROCESSED)
def window_cmd(run_dir, duration, timeout, quiet, bench) -> None:
    """Capture one window: while BENCH runs (after --), or for --duration seconds.

    \b
      maxinstr server window runs/serve -- python bench.py --requests 200
      maxinstr server window runs/serve --duration 30
    """
    if not _window(run_dir, duration, after_dashes(bench) or None, timeout, quiet):
        raise click.exceptions.Exit(1)


@command.command("stop")
@click.argument("run_dir", type=click.Path(path_type=Path))
def stop_cmd(run_dir) -> None:
    """Shut the server down (nsys shutdown, then its process group).

    \b
      maxinstr server stop runs/serve
    """
    state = srv.stop_server(run_dir, say=_say)
    click.echo(f"maxinstr: server stopped; {len(state.windows)} window(s) in {state.run_dir}", err=True)


@command.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@_apply(_start_options)
@click.option("--bench", default=None, metavar="'CMD ARGS'", help="Benchmark command run inside the window (shell-quoted).")
@click.option("--duration", type=Seconds(), default=None, help="Window length when no --bench is given (default 10 s).")
@click.option("--timeout", type=Seconds(), default=None, help="Stop the benchmark after this many seconds.")
@click.option("-q", "--quiet", is_flag=True)
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def run_cmd(out, profiler, ready, ready_timeout, stages, presets, no_preset, no_fail_fast, bench, duration, timeout, quiet,
            cmd) -> None:
    """Start CMD, capture one window around --bench (or --duration), then stop it.

    \b
      maxinstr server run -o runs/serve --ready 'Server ready' --bench 'python bench.py' -- max serve --model ...
    """
    _start(out, profiler, ready, ready_timeout, stages, presets, no_preset, no_fail_fast, after_dashes(cmd))
    try:
        ok = _window(out, duration, shlex.split(bench) if bench else None, timeout, quiet)
    finally:
        srv.stop_server(out, say=_say)
        click.echo("maxinstr: server stopped", err=True)
    if not ok:
        raise click.exceptions.Exit(1)
