"""A run directory as `maxinstr run` lays it out, for the launcher (runner.py) and every process's start-up
hook (bootstrap.py): its names, the default folder, replacing a previous run, the specs each applied."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import shutil
from pathlib import Path
from typing import Any

from maxinstr import config
from maxinstr._files import open_write_file
from maxinstr.errors import MaxinstrError
from maxinstr.launch.instrument import StageSpec, parse_spec
from maxinstr.rundir import format as fmt
from maxinstr.rundir import owners
from maxinstr.rundir.reader import read_jsonl

LAUNCH_FILE, LOG_FILE, WARM_DIR, PROFILE_BASE = "launch.json", "child.log", "warm-run", "profile"
STAGE_SPECS_FILE = "stage-specs.jsonl"  # one line a spec a process applied, or failed to apply
RUN_NAMES = ("meta.json", "parts", LAUNCH_FILE, LOG_FILE, STAGE_SPECS_FILE, WARM_DIR, "deep-dive",
             *(f"{PROFILE_BASE}{ext}" for ext in (".nsys-rep", ".sqlite", ".qdstrm")), PROFILE_BASE)  # what a run writes


def site_dir() -> str:  # the folder holding maxinstr's sitecustomize.py (to prepend to PYTHONPATH)
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")


def default_run_dir(command: list[str], root: str | Path = "runs", now: _dt.datetime | None = None) -> Path:
    """``runs/<script or program>-<YYYYmmdd-HHMMSS>``."""
    script = next((a for a in command if a.endswith(".py")), None)
    stem = Path(script).stem if script else Path(command[0]).name
    return Path(root) / f"{stem}-{(now or _dt.datetime.now()).strftime('%Y%m%d-%H%M%S')}"


def clear_previous_run(run_dir: Path) -> list[str]:
    """A new run replaces the old one there (two never merge): only the names a run writes (returned); a run a
    live process still writes: MaxinstrError."""
    with owners.locked(run_dir):
        if live := owners.live_writers(run_dir):
            raise MaxinstrError(f"{run_dir}: still written by a live process ({'; '.join(live[:3])}): "
                                "give another -o, or run again once it has ended")
        if not (run_dir / "meta.json").exists() and not (run_dir / LAUNCH_FILE).exists():
            return []
        names = list(RUN_NAMES[:-1])
        rocprof_dir = run_dir / PROFILE_BASE  # rocprofv3's folder, only when it holds its CSVs
        if rocprof_dir.is_dir() and any(rocprof_dir.glob("**/*_trace.csv")):
            names.append(PROFILE_BASE)
        removed = []
        for name in names:
            path = run_dir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
            else:
                continue
            removed.append(name)
        return removed


def record_spec_outcome(spec: StageSpec, problem: str | None) -> None:
    """Record in the run directory, as it happens, that this process applied a --stage spec or failed to: a
    whole line at once (a helper's part opens only at its first record, a fork child ends with ``os._exit``,
    a killed process runs no exit code, yet what they applied counts)."""
    if not (run_dir := config.run_dir()):
        return
    line = json.dumps({"stage_spec": spec.text, "applied": problem is None, "problem": problem, "pid": os.getpid()})
    with contextlib.suppress(OSError):  # the run then says the spec was never applied; the program goes on
        os.makedirs(run_dir, exist_ok=True)
        with open_write_file(os.path.join(run_dir, STAGE_SPECS_FILE)) as f:  # appended, one write
            f.write((line + "\n").encode("utf-8", "backslashreplace"))


def unapplied_stage_specs(run_dir: Path, stage_specs: list[str]) -> dict[str, str]:
    """The ``--stage`` specs no process of the run applied, each with why (its problem, or no import)."""
    if not stage_specs:
        return {}
    said: list[Any]
    try:
        said = [value for _, value in read_jsonl(run_dir / STAGE_SPECS_FILE)[0]]  # (damaged lines skipped)
    except (MaxinstrError, OSError):
        said = []  # unreadable: every spec is then "never applied", which the run's log can correct
    lines = [x for x in said if isinstance(x, dict) and isinstance(x.get("stage_spec"), str)]
    applied = {x["stage_spec"] for x in lines if x.get("applied") is True}
    failed = {x["stage_spec"]: x["problem"] for x in reversed(lines)
              if x.get("applied") is not True and isinstance(x.get("problem"), str)}  # (the first said)
    # some process started maxinstr (the start-up hook starts it only at the first import that asks)
    hooked = bool(said) or any(p.name != fmt.SAMPLER_PART for p in (run_dir / fmt.PARTS_DIR).glob("*/"))
    out: dict[str, str] = {}
    for text in stage_specs:
        try:
            spec = parse_spec(text)
        except MaxinstrError as exc:  # (`maxinstr run` refuses these before it starts)
            out[text] = str(exc).removeprefix(f"--stage {text!r}: ")
            continue
        if spec.text in applied:
            continue
        if spec.text in failed:
            out[text] = failed[spec.text].removeprefix(f"--stage {spec.target}: ")
        elif hooked:
            out[text] = f"no process of the run imported {spec.module}"
        else:
            out[text] = (f"no process of the run imported {spec.module} or recorded anything (or the program is not "
                         "Python, or cannot import maxinstr)")
    return out
