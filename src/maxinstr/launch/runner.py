"""`maxinstr run` apart from the CLI: plan (:func:`plan_runs`), show (:func:`plan_lines`), execute
(:func:`execute`: a warm run, the profiled run supervised, the profiler's artifact merged into the run)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maxinstr import config
from maxinstr._files import LINK_REFUSED, open_write_file, parse_json, read_regular, replace_atomic
from maxinstr.errors import MaxinstrError
from maxinstr.launch import supervise as sv
from maxinstr.launch.layout import LAUNCH_FILE, LOG_FILE, PROFILE_BASE, RUN_NAMES, WARM_DIR, site_dir, unapplied_stage_specs
from maxinstr.launch.layout import clear_previous_run, default_run_dir as default_run_dir  # (cli/run.py's, from here)
from maxinstr.launch.presets import preset
from maxinstr.launch.profilers import Artifact, Profiler
from maxinstr.rundir import format as fmt
from maxinstr.rundir import metadata
from maxinstr.rundir.reader import read_launch
from maxinstr.rundir.writer import json_line
from maxinstr.sample import DEFAULT_INTERVAL_S, start_sampler

MAX_PROFILING = "MODULAR_ENABLE_PROFILING"


@dataclass
class RunSpec:
    """One process to run: the command, its run directory and extra environment."""

    command: list[str]
    run_dir: Path
    label: str = ""
    env: dict[str, str] = field(default_factory=dict)
    side: Path | None = None  # the folder of repeats it is one of (compare pools it into a side); None: no repeats
    sweep: str = ""  # its own --sweep value (BATCH=8, --batch-size=8); '' without a sweep
    program: list[str] | None = None  # the command before a --sweep flag was appended (None: command)


@dataclass
class RunOptions:
    """Settings shared by every run of one `maxinstr run` invocation."""

    profiler: Profiler = field(default_factory=Profiler)
    warm_run: bool = False
    warmup: int | None = None
    stage_specs: list[str] = field(default_factory=list)
    timeout_s: float | None = None
    fail_fast: bool = True
    extra_fatal: list[str] = field(default_factory=list)
    echo: Callable[[str], None] | None = sv.print_line
    environment: dict | None = None  # detect_environment().to_json(), stored with the run
    max_ops: str | None = None  # --max-ops: MAX's op markers on where a profiler records them; None: as MAX is
    presets: list[str] = field(default_factory=list)  # named presets of --stage specs, applied before stage_specs
    rerun_args: list[str] | None = None  # the options that make a run what it is (:func:`rerun_command`)

    def all_stage_specs(self) -> list[str]:  # the presets' specs, then --stage's: what every process applies
        return [text for name in self.presets for text in preset(name).specs] + list(self.stage_specs)


@dataclass
class RunOutcome:
    spec: RunSpec
    result: sv.ChildResult
    artifact: Artifact | None
    warm: sv.ChildResult | None = None
    files: dict[str, str] = field(default_factory=dict)
    unapplied: dict[str, str] = field(default_factory=dict)  # --stage specs no process of the run applied -> why

    @property
    def ok(self) -> bool:
        return self.result.ok and (self.artifact is None or self.artifact.ok)


def plan_runs(command: list[str], out: Path, *, repeat: int = 1, sweep: str | None = None) -> list[RunSpec]:
    """Fresh-process runs, each with its own run directory under ``out`` (``out`` itself for one);
    ``sweep`` ``NAME=a,b,c`` sets the env var NAME, or follows as the flag NAME. ``out/r1``.. (``--repeat``),
    ``out/NAME=v`` (``--sweep``), ``out/NAME=v/r1``..: a folder of repeats holds one program's runs, so
    ``maxinstr compare out/NAME=a out/NAME=b`` pools each value's repeats; labels ``NAME=v.r2``."""
    if repeat < 1:
        raise MaxinstrError("--repeat must be at least 1")
    # (label, env, flag words, this value's --sweep)
    axis: list[tuple[str, dict[str, str], list[str], str]] = [("", {}, [], "")]
    if sweep:
        name, sep, values = sweep.partition("=")
        items = [v for v in values.split(",") if v != ""]
        if not sep or not name or not items:
            raise MaxinstrError(f"--sweep {sweep!r}: expected NAME=a,b,c (an env var, or a flag such as --batch-size=1,8)")
        if not name.startswith("-") and not name.replace("_", "").isalnum():
            raise MaxinstrError(f"--sweep {sweep!r}: {name!r} is neither an environment variable name nor a flag")
        flag = name.startswith("-")
        axis = [(f"{name.lstrip('-')}={v}", {} if flag else {name: v}, [name, v] if flag else [], f"{name}={v}")
                for v in items]
    specs: list[RunSpec] = []
    for label, env, extra_args, value in axis:
        side = out / label if label else out
        for r in range(repeat):
            rep = f"r{r + 1}" if repeat > 1 else ""
            specs.append(RunSpec(command=list(command) + extra_args, run_dir=side / rep if rep else side,
                                 label=".".join(p for p in (label, rep) if p), env=dict(env),
                                 side=side if repeat > 1 else None, sweep=value, program=list(command)))
    return specs


def sweep_label(label: str) -> str:
    """The --sweep value part of a run's label: ``BATCH=8`` of ``BATCH=8.r2``, '' of ``r2``."""
    head, _, tail = label.rpartition(".")
    if tail[:1] == "r" and tail[1:].isdigit():
        return head
    return "" if label[:1] == "r" and label[1:].isdigit() else label


def compare_hint(specs: list[RunSpec]) -> str | None:
    """What to compare after several runs, as a line: the --sweep values, or repeats alone as one side."""
    sides = list(dict.fromkeys(spec.side or spec.run_dir for spec in specs))
    if len(specs) < 2:
        return None
    if len(sides) == 1:
        return (f"compare these {len(specs)} runs, pooled, with another set of repeats (a change, another "
                f"setting): maxinstr compare {shlex.quote(str(sides[0]))} RUNS_AFTER")
    how = (" (each value's repeats pooled into one side)" if specs[0].side is not None
           else " (one run a value: with --repeat 3 compare can tell a change from run-to-run noise)")
    return f"compare the values{how}: maxinstr compare {' '.join(shlex.quote(str(s)) for s in sides)}"


def rerun_command(spec: RunSpec, options: RunOptions) -> list[str] | None:
    """The `maxinstr run` command that makes this run again (its own ``--sweep`` value; no ``-o``, no
    ``--repeat``); None when not planned from a command line."""
    if options.rerun_args is None:
        return None
    sweep = [f"--sweep={spec.sweep}"] if spec.sweep else []
    return ["maxinstr", "run", *options.rerun_args, *sweep, "--", *(spec.program or spec.command)]


def _missing(path: str | Path) -> tuple[Path, list[Path]]:
    """(the nearest of ``path`` and its parents that exists, the folders missing below it, deepest first)."""
    probe, missing = Path(path), []
    while not os.path.lexists(probe) and probe.parent != probe:
        missing.append(probe)
        probe = probe.parent
    return probe, missing


def run_dir_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be made a run directory (asked before anything starts), or None."""
    probe = _missing(path)[0]
    if probe.is_symlink() and not probe.exists():
        return f"{probe} is a broken symbolic link"
    if not probe.is_dir():
        return f"{probe} is a file, not a directory" if probe.is_file() else f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"cannot create folders in {probe} (permission denied)"
    return None


def command_problem(command: list[str], env: dict[str, str] | None = None) -> str | None:
    """Why ``command`` cannot be started (a program not on the child's PATH, a path not an executable
    file: asked before a run directory is made or cleared), or None."""
    program = command[0] if command else ""
    if not program:
        return "no command to run"
    if os.sep in program or (os.altsep and os.altsep in program):
        if not os.path.exists(program):
            return f"{program}: no such file"
        if os.path.isdir(program) or not os.access(program, os.X_OK):
            return f"{program}: not an executable file"
        return None
    path = os.pathsep.join(os.get_exec_path(dict(os.environ) if env is None else env))
    return f"{program}: command not found" if shutil.which(program, path=path) is None else None


class NotStarted(MaxinstrError):
    """The command could not start (the run directory holds nothing of it)."""


def child_env(spec: RunSpec, options: RunOptions, run_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The user's environment plus what maxinstr needs (and nothing else)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site_dir(), env.get("PYTHONPATH", "")) if p)
    env[config.RUN_DIR] = str(run_dir.resolve())
    # MAX's markers cost it recompiles and host time (docs/max.md): only with --max-ops and a profiler that records
    # them; a user's own choice stands, ours is marked so the start-up hook may turn it off where it would abort MAX
    env.pop(config.MAX_PROFILING_BY_RUN, None)
    if options.max_ops and options.profiler.records_markers and MAX_PROFILING not in env and MAX_PROFILING not in spec.env:
        env[MAX_PROFILING] = options.max_ops
        env[config.MAX_PROFILING_BY_RUN] = "1"
    if options.warmup is not None:
        env[config.WARMUP] = str(options.warmup)
    if specs := options.all_stage_specs():
        env[config.STAGES] = "\n".join(specs)
    env.update(spec.env)
    for name in options.presets:  # what a preset needs set (MAX's telemetry off), unless the user set it
        for key, value in preset(name).env.items():
            env.setdefault(key, value)
    return env


_KEPT_VARIABLES = (MAX_PROFILING, "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",  # in launch.json
                   "MAX_SERVE_DISABLE_TELEMETRY", "MODULAR_DERIVED_PATH")  # with every MAXINSTR_*, never the whole env


def plan_lines(specs: list[RunSpec], options: RunOptions) -> list[str]:  # shown before running
    prof = options.profiler
    lines = [f"profiler: {prof.name}" + (f"  flags: {prof.flags_text()}" if prof.name != "none" else "")]
    if prof.name == "nsys" and prof.uses_capture_range:
        lines.append("capture: steady state only (starts after the session's warm-up instances)"
                     + (f", window {prof.window_s:g} s" if prof.window_s else ", until the session closes"))
    elif prof.name == "nsys":
        lines.append("capture: the whole run")
    elif prof.name == "rocprofv3":
        lines.append("capture: the whole run (warm-up is separated by the session's warmup count)")
    if options.max_ops:  # what child_env does with it, said: an option left unused is never silent
        own, swept = os.environ.get(MAX_PROFILING), any(MAX_PROFILING in spec.env for spec in specs)
        if not prof.records_markers:
            lines.append(f"--max-ops {options.max_ops}: left off, no profiler records MAX's markers (--profiler {prof.name})")
        elif own is not None or swept:
            lines.append(f"--max-ops {options.max_ops}: not used, MODULAR_ENABLE_PROFILING"
                         + (" as the --sweep sets it" if swept else f"={own} as you set it"))
        else:
            lines.append(f"MAX's op markers: MODULAR_ENABLE_PROFILING={options.max_ops} (MAX compiles its graphs again "
                         "with them and they cost it host time: docs/max.md)")
    if options.warm_run:
        lines.append("warm run: one unprofiled run first (its wall time is reported as startup)")
    lines += [preset(name).plan_line() for name in options.presets]
    if options.stage_specs:
        lines.append("stages injected: " + ", ".join(options.stage_specs))
    if (options.stage_specs or options.presets) and prof.uses_capture_range and options.warmup is None:
        lines.append("note: if the program opens no maxinstr session itself, give --warmup N: the capture "
                     "starts after N instances of a stage")
    if options.timeout_s:
        lines.append(f"time limit: {options.timeout_s:g} s per run")
    skip = next((f for f in (python_flag_skipping_hook(spec.command) for spec in specs) if f), None)
    if skip is not None:
        lines.append(f"note: python {skip} skips maxinstr's start-up hook (it ignores PYTHONPATH, or site): no --stage "
                     "spec is applied and only a session the program opens itself records; python "
                     f"{skip} -m maxinstr.launch.bootstrap [--stage SPEC]... SCRIPT applies them (docs/cli.md)")
    for spec in specs:
        tag = f"[{spec.label}] " if spec.label else ""
        env = "".join(f"{k}={shlex.quote(v)} " for k, v in spec.env.items())
        lines.append(f"{tag}{env}{shlex.join(spec.command)}")
        lines.append(f"    -> {spec.run_dir}/  (log {spec.run_dir / LOG_FILE}"
                     + (f", trace {spec.run_dir / PROFILE_BASE}.*" if prof.name != "none" else "") + ")")
    return lines


def python_flag_skipping_hook(command: list[str]) -> str | None:
    """The interpreter option of a ``python ...`` command that keeps the start-up hook from running (``-I``,
    ``-E``: PYTHONPATH ignored; ``-S``: no site), as given; None when none or not a Python interpreter."""
    if not command or not re.fullmatch(r"python[0-9.]*", os.path.basename(command[0])):
        return None
    args = iter(command[1:])
    for arg in args:
        if not arg.startswith("-") or arg in ("-", "--") or arg.startswith("--"):
            return None  # the script (or stdin): interpreter options end here
        for i, letter in enumerate(arg[1:]):
            if letter in "IES":
                return arg
            if letter in "cm":
                return None
            if letter in "WX":  # takes a value: the rest of this word, or the next one
                if i == len(arg) - 2:
                    next(args, None)
                break
    return None


def write_json(path: Path, data: dict) -> None:  # atomically, never through a link planted there
    replace_atomic(path, (json.dumps(data, indent=2, default=str) + "\n").encode("utf-8", "backslashreplace"))


def _read_json(path: Path) -> Any:  # of a regular file (a FIFO never blocks); None: absent or unreadable
    try:
        data = read_regular(path, MaxinstrError)
        return parse_json(data, path, MaxinstrError) if data is not None else None
    except MaxinstrError:
        return None


def execute(spec: RunSpec, options: RunOptions) -> RunOutcome:
    """Run one planned process end to end; MaxinstrError when it cannot start, leaving nothing behind."""
    if (problem := command_problem(spec.command, {**os.environ, **spec.env})) is not None:
        raise NotStarted(f"{problem}; nothing was started")
    made = _missing(spec.run_dir)[1]  # the folders this run makes
    try:
        Path(spec.run_dir).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MaxinstrError(f"{spec.run_dir}: cannot make the run directory ({exc.strerror or exc})") from None
    try:
        return _execute(spec, options)
    except NotStarted as exc:
        left = _undo_start(spec.run_dir, made)
        raise NotStarted(f"{exc}; nothing was started" + (f" (left in place: {', '.join(left)})" if left else "")) from None


def _undo_start(run_dir: Path, made: list[Path]) -> list[str]:  # the empty logs and folders go; what is left
    for log in (run_dir / WARM_DIR / LOG_FILE, run_dir / LOG_FILE):
        with contextlib.suppress(OSError):
            if log.is_file() and not log.is_symlink() and log.stat().st_size == 0:
                log.unlink()
    left = []
    for folder in [run_dir / WARM_DIR, *made]:
        try:
            folder.rmdir()  # only an empty folder goes
        except OSError as exc:
            if folder in made and not isinstance(exc, FileNotFoundError):
                left.append(str(folder))
    return left


def _execute(spec: RunSpec, options: RunOptions) -> RunOutcome:
    run_dir = spec.run_dir
    clear_previous_run(run_dir)
    for name in RUN_NAMES:  # a link where the run writes (its log, the profiler's report) would write its target
        if (run_dir / name).is_symlink():
            raise NotStarted(f"{run_dir / name}: {LINK_REFUSED}: remove it, or give another -o")
    warm: sv.ChildResult | None = None
    patterns = None if not options.fail_fast else (
        list(sv.DEFAULT_FATAL_PATTERNS) + [("user pattern", rx) for rx in options.extra_fatal])
    if options.warm_run:
        warm_dir = sv.ensure_dir(run_dir / WARM_DIR)
        warm = _supervise(spec.command, child_env(spec, options, warm_dir), warm_dir / LOG_FILE, options, patterns)
    profiler, output_base = options.profiler, (run_dir / PROFILE_BASE).resolve()
    env = {**child_env(spec, options, run_dir), **profiler.child_env()}
    wrapped = profiler.wrap(spec.command, output_base)
    if warm is not None and not warm.ok:  # the profiled run would fail the same way: said, stopped
        outcome = RunOutcome(spec, warm, None, warm=warm)
        _write_launch(run_dir, spec, options, wrapped, env, outcome)
        return outcome
    env[config.RUN_SAMPLED] = "1"
    # the GPUs sampled from this process, not the program's (left without a sampler of ours): one that
    # never opens a session still gets its utilization (no sampler: samples.json says why when it can)
    part = run_dir / fmt.PARTS_DIR / fmt.SAMPLER_PART
    try:
        part.mkdir(parents=True, exist_ok=True)
        sampler = start_sampler(part, DEFAULT_INTERVAL_S, pids=[], mode="auto")
    except Exception:  # noqa: BLE001 - the run goes on without samples
        sampler = None
    try:
        result = _supervise(wrapped, env, run_dir / LOG_FILE, options, patterns)
    except NotStarted:
        _stop(sampler)
        shutil.rmtree(part, ignore_errors=True)
        with contextlib.suppress(OSError):
            part.parent.rmdir()
        raise
    _stop(sampler)
    meta_if_none(run_dir, spec.command)
    artifact = profiler.collect(output_base) if profiler.name != "none" else None
    outcome = RunOutcome(spec, result, artifact, warm=warm)
    if isinstance(meta := _read_json(run_dir / "meta.json"), dict):  # the profiler, the rerun (the child closed it)
        meta["profiler"] = None if profiler.name == "none" else {
            "name": profiler.name, "command": wrapped, "capture": profiler.capture,
            "window_s": profiler.window_s if profiler.uses_capture_range else None,
            "trace": artifact.trace if artifact else None}
        if (rerun := rerun_command(spec, options)) is not None:
            meta["maxinstr_command"] = rerun
        write_json(run_dir / "meta.json", meta)
    outcome.unapplied = unapplied_stage_specs(run_dir, options.all_stage_specs())
    _note_unapplied(run_dir, outcome.unapplied)
    outcome.files = {"run directory": str(run_dir), "child log": str(run_dir / LOG_FILE),
                     "launch record": str(run_dir / LAUNCH_FILE)}
    if (run_dir / "meta.json").exists():
        outcome.files["run metadata"] = str(run_dir / "meta.json")
    if artifact is not None:
        outcome.files.update({f"{artifact.profiler} {role}": path for role, path in artifact.files.items() if role != "trace"})
    _write_launch(run_dir, spec, options, wrapped, env, outcome)
    return outcome


def _stop(sampler: Any) -> None:
    with contextlib.suppress(Exception):
        if sampler is not None:
            sampler.stop()


def meta_if_none(run_dir: Path, command: list[str]) -> None:
    """A meta.json for a program that opened no session: its samples and trace still make a report."""
    if (run_dir / "meta.json").exists():
        return
    try:
        meta = metadata.collect()
    except Exception:  # noqa: BLE001 - no report of this run, as before the run sampled
        return
    meta.update(status="closed", command=list(command), argv=list(command), pid=None,
                opened_by="maxinstr run: the program opened no session (no stage recorded)")
    write_json(run_dir / "meta.json", meta)


def _supervise(cmd: list[str], env: dict[str, str], log: Path, options: RunOptions, patterns) -> sv.ChildResult:
    try:
        return sv.supervise(cmd, env=env, log_path=log, timeout_s=options.timeout_s, fatal_patterns=patterns,
                            echo=options.echo)
    except FileNotFoundError:
        raise NotStarted(f"{cmd[0]}: command not found") from None
    except PermissionError:
        raise NotStarted(f"{cmd[0]}: not executable") from None


def _write_launch(run_dir: Path, spec: RunSpec, options: RunOptions, wrapped: list[str], env: dict[str, str],
                  outcome: RunOutcome) -> None:
    prof = options.profiler
    write_json(run_dir / LAUNCH_FILE, {  # "sweep": this run's --sweep variable and value (compare lists it)
        "format": "maxinstr-launch", "version": 1, "written_unix_s": time.time(), "label": spec.label,
        "sweep": dict(spec.env), "command": spec.command, "profiled_command": wrapped,
        "env": {k: v for k, v in env.items() if k.startswith("MAXINSTR_") or k in _KEPT_VARIABLES},
        "profiler": {"name": prof.name, "flags": prof.flags_text() if prof.name != "none" else "",
                     "capture": prof.capture, "window_s": prof.window_s},
        "presets": options.presets, "stage_specs": options.all_stage_specs(), "stage_specs_unapplied": outcome.unapplied,
        "maxinstr_command": rerun_command(spec, options),
        "startup": None if outcome.warm is None else {"warm_run_wall_s": round(outcome.warm.wall_s, 3), **outcome.warm.to_json()},
        "run": outcome.result.to_json(), "artifact": None if outcome.artifact is None else outcome.artifact.to_json(),
        "environment": options.environment})


def add_to_launch(run_dir: Path, key: str, value: Any) -> None:  # after the run; nothing without launch.json
    if (record := read_launch(run_dir)) is not None:
        record[key] = value
        write_json(run_dir / LAUNCH_FILE, record)


def _note_unapplied(run_dir: Path, unapplied: dict[str, str]) -> None:
    """Each spec never applied as a warning in the owner part's events.jsonl (the program has ended)."""
    parts = sorted(p for p in (run_dir / fmt.PARTS_DIR).glob("*/") if p.is_dir() and not p.is_symlink())
    if not unapplied or not parts:
        return
    roles = [d.get("role") if isinstance(d := _read_json(p / fmt.PART_FILE), dict) else None for p in parts]
    owner = parts[roles.index("owner")] if "owner" in roles else parts[0]
    lines = b"".join(json_line({"time_ns": time.monotonic_ns(), "kind": "warning",
                                "message": f"--stage {text} was never applied: {why}", "by": "maxinstr run"})
                     for text, why in unapplied.items())
    with contextlib.suppress(OSError):  # launch.json and the line on stderr still say it
        with open_write_file(owner / fmt.EVENTS_FILE) as f:
            f.write(lines)


_OPEN_HINTS = ((".nsys-rep", "nsys-ui {0}   (or `nsys stats {0}`)"), (".sqlite", "maxinstr report RUN --trace {0}   (or sqlite3 {0})"),
               (".ncu-rep", "ncu-ui {0}   (or `ncu --import {0} --page details`)"))


def open_hint(role: str, path: str) -> str:  # how to open a file we produced
    hint = next((h for ext, h in _OPEN_HINTS if path.endswith(ext)), "less {0}" if role.endswith("log") else "{0}")
    return hint.format(path)
