"""`maxinstr run [OPTIONS] -- CMD ...`: run a program under the vendor profiler with its
warm-up kept out of the capture, and print the per-stage report."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from maxinstr.cli import Seconds, UserError, after_dashes
from maxinstr.cli.report import command as report_command
from maxinstr.errors import MaxinstrError
from maxinstr.integrations.max_pipeline import cache_entries, compile_cache_dirs
from maxinstr.launch import runner
from maxinstr.launch.env import detect_environment
from maxinstr.launch.instrument import parse_spec
from maxinstr.launch.presets import auto_presets, preset
from maxinstr.launch.profilers import DEFAULT_WINDOW_S, Profiler, make_profiler


def choose_profiler(requested: str, env, *, window_s: float, capture: str, osrt: bool, extra: list[str]) -> tuple[Profiler, list[str]]:
    """The profiler to use and lines to tell the user about the choice (missing tools first)."""
    notes: list[str] = []
    name = requested
    if requested == "auto":
        name = env.default_profiler()
        missing = {"nvidia": "nsys", "amd": "rocprofv3"}.get(env.vendor) if name == "none" else None
        if name == "none":
            notes.append(f"{missing} not found, running without a profiler; {env.tool(missing).install_hint()}" if missing
                         else "no GPU found: running without a profiler (stages still record host times)")
    if name == "none":
        return make_profiler("none"), notes
    if not (tool := env.tool(name)).found:
        raise MaxinstrError(f"{name} is not installed: {tool.install_hint()}")
    if tool.off_path:
        notes.append(f"using {tool.path} ({name} is not on PATH)")
    if name == "nsys":
        return make_profiler("nsys", tool.path, osrt=osrt, capture=capture, window_s=window_s or None, extra=extra), notes
    return make_profiler(name, tool.path, extra=extra), notes


def print_report(run_dir: Path, trace: str | None, unprofiled: Path | None = None) -> None:
    """Print `maxinstr report` for the run (headline timings from the unprofiled warm run
    when there is one), or say how to get it when that part is absent."""
    args = [str(run_dir)] + (["--trace", trace] if trace else [])
    if unprofiled is not None and (unprofiled / "meta.json").exists():
        args += ["--unprofiled", str(unprofiled)]
    try:
        report_command.main(args=args, prog_name="maxinstr report", standalone_mode=False)
    except (click.ClickException, MaxinstrError) as exc:
        msg = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
        click.echo(f"report: {msg}", err=True)
    except Exception as exc:  # noqa: BLE001 - the run is done; never lose it over the report
        click.echo(f"report: {exc.__class__.__name__}: {exc} (the run directory is intact)", err=True)


@click.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    short_help="Run a program under the profiler and report per stage.",
)
@click.option("-o", "--out", type=click.Path(path_type=Path), default=None,
              help="Run directory (default runs/<script>-<time>). With --repeat/--sweep, one folder per run inside it.")
@click.option("--profiler", type=click.Choice(["auto", "nsys", "rocprofv3", "none"]), default="auto", show_default=True,
              help="Tracer to run under. auto: nsys on NVIDIA, rocprofv3 on AMD, none without a GPU.")
@click.option("--window", "window_s", type=Seconds(zero_ok=True), default=DEFAULT_WINDOW_S, show_default=True,
              help="Seconds of steady state to capture (nsys). 0: until the session closes.")
@click.option("--capture", type=click.Choice(["steady", "all"]), default="steady", show_default=True,
              help="steady: capture starts after the session's warm-up (cudaProfilerApi range); all: the whole run.")
@click.option("--osrt", is_flag=True, help="Also trace OS runtime calls (nsys -t osrt).")
@click.option("--warmup", type=click.IntRange(min=0), default=None, help="Warm-up instances per stage for the run's session (MAXINSTR_WARMUP; overrides the script's "
                   "warmup=, and is needed for the steady-state capture when the program opens no session).")
@click.option("--warm-run", is_flag=True, help="Run once unprofiled first (compile, load weights); its wall time is reported as startup.")
@click.option("--max-ops", type=click.Choice(["off", "on", "detailed"]), default="off", show_default=True,
              help="MAX's own op ranges inside each stage (MODULAR_ENABLE_PROFILING; a profiler records them). They "
                   "recompile MAX's graphs with markers and cost MAX host time, so they are off unless asked for.")
@click.option("--stage", "stages", multiple=True, metavar="MODULE:QUALNAME[=name]",
              help="Wrap a function/method of code you cannot edit in a stage (repeatable).")
@click.option("--preset", "presets", multiple=True, metavar="NAME",
              help="A named set of --stage wrap points for a framework's own code (max: MAX's pipelines; applied "
                   "by itself when the command is MAX's). Repeatable.")
@click.option("--no-preset", is_flag=True, help="Apply no preset by itself (those named with --preset still apply).")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True, help="Fresh-process repeats, each in its own run directory.")
@click.option("--sweep", default=None, metavar="NAME=a,b,c",
              help="One run per value: NAME is an env var, or a flag appended to the command when it starts with '-'.")
@click.option("--timeout", "timeout_s", type=Seconds(), default=None, help="Stop a run after this many seconds.")
@click.option("--no-fail-fast", is_flag=True, help="Do not stop the child when its log shows a fatal error.")
@click.option("--fatal", "fatal", multiple=True, metavar="REGEX", help="Extra log pattern that means the run failed (repeatable).")
@click.option("--profiler-arg", "profiler_args", multiple=True, metavar="ARG", help="Extra argument for the profiler (repeatable).")
@click.option("-y", "--yes", is_flag=True, help="Do not ask before running (never asked when not on a terminal).")
@click.option("--no-report", is_flag=True, help="Do not print the report at the end.")
@click.option("-q", "--quiet", is_flag=True, help="Do not echo the program's output (it is still in child.log).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def command(ctx: click.Context, out, profiler, window_s, capture, osrt, warmup, warm_run, max_ops, stages, presets, no_preset,
            repeat, sweep, timeout_s, no_fail_fast, fatal, profiler_args, yes, no_report, quiet, command) -> None:
    """Run CMD under the vendor profiler with maxinstr's session in it, then report.

    \b
    maxinstr run -- python decode.py
    maxinstr run --warm-run --repeat 3 -- python decode.py
    maxinstr run --sweep BATCH=1,8,32 -- python decode.py
    maxinstr run -- max generate --model-path DIR ...      (the max preset applies by itself)
    maxinstr run --preset max -- python my_max_pipeline.py
    """
    if not (cmd := after_dashes(command)):
        raise click.UsageError("give the command to run after --")
    for text in stages:
        parse_spec(text)  # fail before starting anything
    chosen = choose_presets(cmd, presets, no_preset)
    out_dir = out or runner.default_run_dir(cmd)
    specs = runner.plan_runs(cmd, Path(out_dir), repeat=repeat, sweep=sweep)
    for spec in specs:  # a bad -o, or a command that cannot start: one line, nothing made or cleared
        if (problem := runner.run_dir_problem(spec.run_dir)) is not None:
            raise UserError(f"{'-o ' + str(out) if out else spec.run_dir}: {problem}; nothing was started")
        if (problem := runner.command_problem(spec.command, {**os.environ, **spec.env})) is not None:
            raise UserError(f"{problem}; nothing was started")
    env = detect_environment()
    for line in env.summary_lines(install_hints=profiler != "none"):
        click.echo(f"maxinstr: {line}", err=True)
    prof, notes = choose_profiler(profiler, env, window_s=window_s, capture=capture, osrt=osrt, extra=list(profiler_args))
    for note in notes:
        click.echo(f"maxinstr: {note}", err=True)
    options = runner.RunOptions(
        profiler=prof, warm_run=warm_run, warmup=warmup, stage_specs=list(stages), presets=chosen, timeout_s=timeout_s,
        fail_fast=not no_fail_fast, extra_fatal=list(fatal), echo=None if quiet else runner.sv.print_line,
        environment=env.to_json(), rerun_args=rerun_args(ctx), max_ops=None if max_ops == "off" else max_ops,
    )
    click.echo("maxinstr: plan", err=True)
    for line in runner.plan_lines(specs, options):
        click.echo(f"  {line}", err=True)
    if not yes and sys.stdin.isatty() and sys.stdout.isatty() and not click.confirm("Start?", default=True, err=True):
        raise click.Abort()

    outcomes = []
    interrupted = False
    for spec in specs:
        cache = max_cache_before(chosen, spec)
        outcome = runner.execute(spec, options)
        outcomes.append(outcome)
        max_cache_after(cache, outcome)
        _summarize(outcome, no_report=no_report)
        if outcome.result.status == runner.sv.STATUS_INTERRUPTED:
            interrupted = True
            break  # Ctrl-C ends the whole plan; what ran so far is kept
    if (hint := runner.compare_hint(specs)) and not interrupted:
        click.echo(f"maxinstr: {hint}")
    if interrupted:
        sig = outcomes[-1].result.signal
        raise click.exceptions.Exit(128 + sig if sig else 130)  # as the shell says a death by that signal
    if not all(o.ok for o in outcomes):
        raise click.exceptions.Exit(1)


def choose_presets(cmd: list[str], named: tuple[str, ...], no_preset: bool) -> list[str]:
    """The presets of this run: those named, then (unless --no-preset) those the command gets by
    itself (``max`` for MAX's own entry points), each once. An unknown name is a usage error."""
    chosen: list[str] = []
    for name in [*named, *([] if no_preset else auto_presets(cmd))]:
        preset(name)  # an unknown name fails here, before anything starts
        if name not in chosen:
            chosen.append(name)
    return chosen


def max_cache_before(presets: list[str], spec: runner.RunSpec) -> tuple[dict[str, str], dict[str, int]] | None:
    """With the max preset: MAX's compile cache folders (as the program sees them) and their file counts."""
    if "max" not in presets:
        return None
    dirs = compile_cache_dirs({**os.environ, **spec.env})
    return dirs, cache_entries(dirs)


def max_cache_after(cache: tuple[dict[str, str], dict[str, int]] | None, outcome: runner.RunOutcome) -> None:
    """Say whether MAX compiled anew (entries added to its cache: the compile stage's time is a
    cold compile, which a later run does not pay) and keep it in launch.json's ``max_compile_cache``."""
    if cache is None:
        return
    dirs, before = cache
    after = cache_entries(dirs)
    added = sum(after.values()) - sum(before.values())
    root = os.path.dirname(dirs["max"])
    tag = f"[{outcome.spec.label}] " if outcome.spec.label else ""
    if added > 0:
        click.echo(f"maxinstr: {tag}MAX compiled cold: {added} new files in its compile cache {root} (the compile "
                   "stages hold that time; the next run reads them)", err=True)
    else:
        click.echo(f"maxinstr: {tag}MAX's compile cache {root}: nothing new (compiles, if any, were cache hits)", err=True)
    runner.add_to_launch(outcome.spec.run_dir, "max_compile_cache",
                         {"dirs": dirs, "files_before": before, "files_after": after, "cold": added > 0})


NOT_REPRODUCED = ("out", "yes", "quiet", "no_report", "repeat", "sweep")
"""Options a rerun leaves out (:func:`maxinstr.launch.runner.rerun_command`): where the run was
written, how it was shown, and the shape of the plan it was one run of (the rerun is that run)."""


def rerun_args(ctx: click.Context) -> list[str]:
    """The options this `maxinstr run` was given (not those left at their defaults), as
    command-line words, less :data:`NOT_REPRODUCED`: every other option changes what a run
    records or how it is run, so the commands a report suggests carry them."""
    words: list[str] = []
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name in NOT_REPRODUCED or param.name is None:
            continue
        if ctx.get_parameter_source(param.name) in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
            continue
        flag = max(param.opts, key=len)  # the long spelling
        value = ctx.params[param.name]
        if param.is_flag:
            words += [flag] if value else []
            continue
        for item in value if param.multiple else [value]:
            text = str(item)
            # a value that starts with '-' would read as an option: --opt=VALUE keeps it one word
            words += [f"{flag}={text}"] if text.startswith("-") else [flag, text]
    return words


def _summarize(outcome: runner.RunOutcome, *, no_report: bool) -> None:
    tag = f"[{outcome.spec.label}] " if outcome.spec.label else ""
    if outcome.warm is not None:
        click.echo(f"maxinstr: {tag}startup (unprofiled warm run): {outcome.warm.describe()}", err=True)
    res = outcome.result
    click.echo(f"maxinstr: {tag}run {res.describe()}", err=True)
    if not res.ok and res.tail:
        click.echo("maxinstr: last lines of the log:", err=True)
        for line in res.tail[-8:]:
            click.echo(f"    {line}", err=True)
    if outcome.unapplied:
        click.echo(f"maxinstr: {tag}never applied: " + "; ".join(
            f"--stage {text} ({why})" for text, why in outcome.unapplied.items()), err=True)
    if (art := outcome.artifact) is not None:
        if art.ok:
            click.echo(f"maxinstr: {tag}{art.profiler} trace: {art.kernels} kernels in {art.trace}", err=True)
        for problem in art.problems:
            click.echo(f"maxinstr: {tag}{art.profiler}: {problem}", err=True)
    if outcome.files:
        click.echo(f"maxinstr: {tag}files:", err=True)
        for role, path in outcome.files.items():
            click.echo(f"    {role}: {runner.open_hint(role, path)}", err=True)
        if asked := _requested_path(outcome.spec.run_dir):
            # the script's own session named a directory: it wrote here instead (one run, one place)
            click.echo(f"    (the script's session asked for {asked}: under maxinstr run its records are in "
                       f"{outcome.spec.run_dir}; -o {asked} writes them there)", err=True)
    usable = (outcome.spec.run_dir / "meta.json").exists() or (art is not None and art.ok)
    if not no_report and usable:
        warm = outcome.spec.run_dir / runner.WARM_DIR if outcome.warm is not None and outcome.warm.ok else None
        # a capture that holds no kernel is still read: the report says at its top what it missed
        trace = art.trace if art is not None else None
        readable = art is not None and trace is not None and (art.ok or (art.kernels == 0 and Path(trace).is_file()))
        print_report(outcome.spec.run_dir, trace if readable else None, warm)


def _requested_path(run_dir: Path) -> str | None:
    """The directory the script's own session asked for (meta.json ``requested_path``), when not the run's."""
    try:
        asked = json.loads((Path(run_dir) / "meta.json").read_text(encoding="utf-8")).get("requested_path")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(asked, str) or not asked:
        return None
    return None if Path(asked).resolve() == Path(run_dir).resolve() else asked
