"""`maxinstr deep-dive SOURCE [--stage S] [--kernel RX] [-- CMD ...]`: profile the dominant
kernel of a stage with Nsight Compute and print why it is as fast as it is."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import click

from maxinstr import config
from maxinstr._files import real_dirs, replace_atomic
from maxinstr._text import shown, visible
from maxinstr.cli import Seconds, UserError, after_dashes
from maxinstr.errors import MaxinstrError
from maxinstr.launch import deep_dive as dd
from maxinstr.launch.presets import auto_presets, recorded_specs
from maxinstr.launch import runner
from maxinstr.launch import supervise as sv
from maxinstr.launch.env import detect_environment, find_tool
from maxinstr.rundir.format import run_artifact
from maxinstr.rundir.reader import read_meta


def _resolve(source: Path, trace_opt: str | None, stage: str | None, kernel: str | None, warmup: int | None
             ) -> tuple[dd.KernelChoice, list[str], bool, Path | None, list[str], Any, Path | None]:
    """(choice, app command from the run, from_capture_start, run_dir or None, stage specs,
    the run's MAXINSTR_WARMUP or None, the file the app command was read from)."""
    app_from: Path | None = None
    run_dir = join_run = report = run_warmup = run_warmup_meta = None
    app: list[str] = []
    specs: list[str] = []
    from_capture = False
    trace_path = trace_opt
    if source.is_dir() and (source / "meta.json").exists():
        run_dir = join_run = source
        launch = runner.read_launch(source)
        meta = read_meta(source / "meta.json")
        if launch is not None:
            app = list(launch.get("command") or [])
            app_from = source / "launch.json"
            specs = list(launch.get("stage_specs") or [])
            run_warmup = config.warmup_instances(launch.get("env") or {})
            from_capture = (launch.get("profiler") or {}).get("capture") == "steady" and (launch.get("profiler") or {}).get("name") == "nsys"
            trace_path = trace_path or run_artifact(source, ((launch.get("artifact") or {}).get("files") or {}).get("trace"))
        else:
            app = list(meta.get("command") or [])
            app_from = source / "meta.json"
        if not (trace_path := trace_path or run_artifact(source, (meta.get("profiler") or {}).get("trace"))):
            from maxinstr.traces.inprocess import has_activity  # numpy, the readers: only here

            if has_activity(source):  # kernels=True: the run directory holds its own kernels
                trace_path = str(source)
        run_warmup_meta = meta.get("warmup")
    elif source.suffix == ".json":
        report = dd.load_report_json(source)
        trace_path = trace_path or (report.get("sources") or {}).get("trace")
        run_src = (report.get("sources") or {}).get("run")
        join_run = Path(run_src) if run_src and (Path(run_src) / "meta.json").exists() else None
        if run_src and Path(run_src).is_dir():
            if launch := runner.read_launch(run_src):
                app = list(launch.get("command") or [])
                app_from = Path(run_src) / "launch.json"
                specs = list(launch.get("stage_specs") or [])
                from_capture = (launch.get("profiler") or {}).get("capture") == "steady"
    else:
        trace_path = trace_path or str(source)
    if trace_path and Path(trace_path).exists():
        from maxinstr.traces import open_trace  # numpy, the readers: only when a kernel is chosen from a trace

        trace = open_trace(trace_path)
        analysis = None
        if stage is not None:
            # the report's attribution and steady instances: `maxinstr report RUN --trace T` (or the
            # trace alone), so the kernel, its launches and its share are the ones the report prints
            from maxinstr.analyze.report import analyze

            analysis = analyze(run=join_run, trace=trace, warmup=warmup) if join_run is not None else None
            if analysis is not None and not (analysis.report.get("sources") or {}).get("records_joined"):
                analysis = None  # the trace does not join this run: read it alone, as its report would
            if analysis is None:
                if warmup is None:
                    warmup = 0 if from_capture else int(run_warmup_meta or 0)
                analysis = analyze(trace=trace, warmup=warmup)
        choice = dd.choose_from_trace(trace, stage=stage, kernel=kernel, analysis=analysis)
    elif report is not None:
        choice = dd.choose_from_report(report, stage=stage, kernel=kernel, source=str(source))
    else:
        raise MaxinstrError(f"{source}: no trace to choose a kernel from (give --trace FILE, or a run made by `maxinstr run`)")
    return choice, app, from_capture, run_dir, specs, run_warmup, app_from if app else None


class _ProgramAfterDashes(click.Command):
    """deep-dive's command line: an option it does not know, before ``--``, is a mistake (the
    user's `--quiet`), not the start of the program to run; the program goes after ``--``, or
    starts with a word that is no option."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        before = args[: args.index("--")] if "--" in args else list(args)
        known = {o for p in self.params for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])}
        known |= set(ctx.help_option_names)
        taking = {o for p in self.params if isinstance(p, click.Option) and not p.is_flag
                  for o in p.opts + p.secondary_opts}
        skip = False
        seen_source = False
        for a in before:
            if skip:
                skip = False
                continue
            name = a.split("=", 1)[0]
            if a.startswith("-") and a != "-":
                if name not in known:
                    raise click.UsageError(f"no such option: {name} (the program to profile goes after --)", ctx)
                skip = name in taking and "=" not in a
            elif not seen_source:
                seen_source = True
            else:
                break  # the program's first word: what follows is its own
        return super().parse_args(ctx, args)


@click.command(
    "deep-dive",
    cls=_ProgramAfterDashes,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": True},
    short_help="Profile the dominant kernel of a stage with Nsight Compute.",
)
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--trace", "trace_opt", default=None, help="Trace to choose from (default: the run's own).")
@click.option("--stage", default=None, help="Stage whose dominant kernel to take (default: the whole trace).")
@click.option("--kernel", default=None, metavar="REGEX", help="Take the top kernel whose name matches REGEX instead.")
@click.option("--warmup", type=click.IntRange(min=0), default=None, help="Warm-up instances per stage, as `maxinstr report --warmup` (default: the run's own; 0 for a trace alone).")
@click.option("--launch-skip", type=click.IntRange(min=0), default=None, help="Override the computed launch skip.")
@click.option("--section", "sections", multiple=True, help=f"ncu sections (default: {', '.join(dd.DEFAULT_SECTIONS)}).")
@click.option("-o", "--out", type=click.Path(path_type=Path), default=None, help="Output folder (default RUN/deep-dive).")
@click.option("--ncu", "ncu_path", default=None, help="ncu executable (default: found on PATH).")
@click.option("--csv", "csv_file", type=click.Path(exists=True, path_type=Path), default=None,
              help="Read an existing `ncu --csv --page details` output instead of running ncu.")
@click.option("--dry-run", is_flag=True, help="Print the ncu command, do not run it.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@click.option("--timeout", "timeout_s", type=Seconds(), default=None, help="Stop ncu after this many seconds.")
@click.option("-y", "--yes", is_flag=True, help="Run the program the run directory records without asking "
              "(a command read from a file is otherwise shown and confirmed on a terminal, refused elsewhere).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def command(source: Path, trace_opt: str | None, stage: str | None, kernel: str | None, warmup: int | None,
            launch_skip: int | None, sections: tuple[str, ...], out: Path | None, ncu_path: str | None,
            csv_file: Path | None, dry_run: bool, as_json: bool, timeout_s: float | None, yes: bool,
            command: tuple[str, ...]) -> None:
    """Pick the dominant kernel of a stage from SOURCE (a run directory made by `maxinstr
    run`, a trace, or a report JSON), profile one steady-state launch of it with ncu, and
    print a verdict: compute-, memory- or latency-bound, occupancy and its limiter,
    registers and spills. The program is re-run: the one recorded in the run, or CMD.

    \b
    maxinstr deep-dive runs/decode --stage decode
    maxinstr deep-dive profile.sqlite --kernel gemv -- python decode.py
    """
    if csv_file is not None:
        _print_verdicts(dd.parse_ncu_csv(csv_file.read_text(encoding="utf-8", errors="replace"), str(csv_file)), as_json)
        return
    choice, app, from_capture, run_dir, specs, run_warmup, app_from = _resolve(source, trace_opt, stage, kernel, warmup)
    if cmd_args := after_dashes(command):
        app, app_from = cmd_args, None  # typed by the user
    if launch_skip is not None:
        choice.launch_skip = launch_skip
    what = "the stage's" if choice.stage else "all"
    share = f", {choice.share:.0%} of {what} GPU time (as the report counts it)" if choice.share is not None else ""
    click.echo(f"maxinstr: kernel: {shown(choice.name)}", err=True)
    click.echo(f"maxinstr:   {choice.count} launches, {choice.total_ns / 1e6:.3f} ms{share}; "
               f"steady-state instance = launch {choice.launch_skip} of its function name"
               + (" counted from the capture start" if from_capture else ""), err=True)
    for note in choice.notes:
        click.echo(f"maxinstr:   note: {shown(note)}", err=True)

    env_info = detect_environment(tools=("ncu",), probe_versions=False)
    if env_info.vendor == "amd":
        click.echo(f"maxinstr: {dd.amd_equivalent(choice, app)}")
        return
    out_dir = out or ((run_dir / "deep-dive") if run_dir else Path("deep-dive"))
    if (problem := runner.run_dir_problem(out_dir)) is not None:
        raise UserError(f"{'-o ' if out else ''}{out_dir}: {problem}")
    rep = (out_dir / "kernel.ncu-rep").resolve()
    ncu = ncu_path or env_info.tool("ncu").path or "ncu"
    ncu_cmd = dd.ncu_command(choice, app, output=rep, ncu=ncu, sections=tuple(sections) or dd.DEFAULT_SECTIONS,
                             from_capture_start=from_capture)
    click.echo(f"maxinstr: ncu command: {visible(shlex.join(ncu_cmd))}", err=True)
    if dry_run:
        return
    if not app:
        raise MaxinstrError("no program to profile: give it after -- (the run records none)")
    if (problem := runner.command_problem(app)) is not None:
        raise UserError(f"{problem}; ncu was not started")
    if app_from is not None:
        _confirm_recorded(app, specs, app_from, yes)
    tool = find_tool("ncu", probe_version=False) if ncu_path is None else None
    if ncu_path is None and (tool is None or not tool.found):
        raise MaxinstrError(f"ncu is not installed: {env_info.tool('ncu').install_hint()}")
    if out is None and run_dir is not None:
        try:
            real_dirs(run_dir, out_dir / "ncu-run")  # RUN/deep-dive: never a link planted there
        except OSError as exc:
            raise UserError(f"{exc.filename}: {exc.strerror}; ncu was not started") from None
    sv.ensure_dir(out_dir)
    for stale in (out_dir / "ncu.log", out_dir / "details.csv", rep):
        stale.unlink(missing_ok=True)
    spec = runner.RunSpec(command=app, run_dir=out_dir / "ncu-run")
    # Same session settings as the profiled run, so the capture starts at the same point.
    # a MAX command gets its preset again (its environment too); the run's specs hold the preset's
    specs, presets = recorded_specs({"stage_specs": specs, "presets": auto_presets(app)})
    opts = runner.RunOptions(stage_specs=specs, presets=presets, echo=None, warmup=run_warmup)
    env = runner.child_env(spec, opts, sv.ensure_dir(spec.run_dir))
    if from_capture:
        env[config.CAPTURE] = "1"  # the session issues cuProfilerStart at steady state
    log = out_dir / "ncu.log"
    click.echo(f"maxinstr: running ncu (kernel replay is slow; log {log}) ...", err=True)
    result = sv.supervise(ncu_cmd, env=env, log_path=log, timeout_s=timeout_s, echo=None)
    if not result.ok or any("ERR_NVGPUCTRPERM" in line for line in result.tail):
        tail = "\n".join("    " + line for line in result.tail[-8:])
        hint = ""
        if any("ERR_NVGPUCTRPERM" in line for line in result.tail):
            hint = ("\n  GPU performance counters are restricted to admin users: run as root, or load the driver "
                    "with NVreg_RestrictProfilingToAdminUsers=0 (in a container: --cap-add SYS_ADMIN)")
        raise MaxinstrError(f"ncu {result.describe()}; log {log}:\n{tail}{hint}")
    if not rep.exists():
        raise MaxinstrError(f"{rep}: ncu wrote no report (the kernel filter matched no launch?); log {log}")
    imported = sv.supervise(dd.ncu_import_command(rep, ncu), log_path=out_dir / "details.csv", echo=None,
                            fatal_patterns=None, timeout_s=timeout_s)
    if not imported.ok:
        raise MaxinstrError(f"`ncu --import {rep}` {imported.describe()}")
    launches = dd.parse_ncu_csv((out_dir / "details.csv").read_text(encoding="utf-8", errors="replace"),
                                str(out_dir / "details.csv"))
    verdicts = _print_verdicts(launches, as_json)
    replace_atomic(out_dir / "verdict.json", (json.dumps({
        "choice": choice.to_json(), "ncu_command": ncu_cmd, "verdicts": verdicts,
    }, indent=2) + "\n").encode("utf-8", "backslashreplace"))
    click.echo(f"maxinstr: files: report {rep} (open with `ncu-ui {rep}`), details {out_dir / 'details.csv'}, "
               f"verdict {out_dir / 'verdict.json'}, log {log}", err=True)


def _confirm_recorded(app: list[str], specs: list[str], where: Path, yes: bool) -> None:
    """A command read from a file (a run directory may come from anyone) runs only when the user
    says so: shown, then confirmed on a terminal (default no), or ``--yes``; refused otherwise."""
    text = shlex.join(app)
    click.echo(f"maxinstr: the program to re-run under ncu comes from {shown(str(where))}:", err=True)
    click.echo(f"    {shown(text)}", err=True)
    for spec in specs:
        click.echo(f"    with --stage {shown(spec)} (imports its module in the program)", err=True)
    if yes:
        return
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise UserError(f"{where}: a command read from a file is run only when you confirm it: "
                        "give --yes to run it, or the command to run after --; ncu was not started")
    if shown(text) != visible(text) or any(shown(s) != visible(s) for s in specs):
        # what is asked about must be seen whole: a payload past the cut would pass unseen
        raise UserError(f"{where}: the recorded command is too long to show ({len(text):,} characters): "
                        "give --yes to run it, or the command to run after --; ncu was not started")
    if not click.confirm("Run it?", default=False, err=True):
        raise click.Abort()


def _print_verdicts(launches: list[dd.NcuLaunch], as_json: bool) -> list[dict[str, Any]]:
    verdicts = [dd.make_verdict(launch) for launch in launches]
    if as_json:
        click.echo(json.dumps([v.to_json() for v in verdicts], indent=2))
    else:
        for launch, verdict in zip(launches, verdicts):
            for line in dd.verdict_lines(verdict, launch.rules):
                click.echo(shown(line))  # names from a CSV are data: cut, control characters escaped
    return [v.to_json() for v in verdicts]
