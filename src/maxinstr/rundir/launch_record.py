"""What `maxinstr run` recorded about how it made a run (launch.json, meta.json's profiler), read
once as data for the report: the analysis reads no file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maxinstr.errors import RunDirError
from maxinstr.rundir.format import run_artifact
from maxinstr.rundir.reader import read_launch


@dataclass(frozen=True)
class LaunchRecord:
    maxinstr_command: list[str] | None = None
    """launch.json ``maxinstr_command``: the `maxinstr run` command line that records the run again."""
    sweep: dict[str, str] | None = None
    """The ``maxinstr run --sweep`` value: launch.json ``sweep``, else its label (``BATCH=8.r2``)."""
    names_trace: bool = False
    """Whether the trace the run's meta.json names (``profiler.trace``) is the report's trace:
    then `maxinstr compare RUN` finds it from the run directory alone."""


def launch_record(run_dir: str | Path, meta: dict[str, Any], trace: str | None) -> LaunchRecord:
    """The record of ``run_dir`` (empty where none or damaged); ``trace``: the report's trace."""
    prof = meta.get("profiler")
    try:
        found = run_artifact(run_dir, prof.get("trace")) if trace and isinstance(prof, dict) else None
        names_trace = found is not None and os.path.realpath(found) == os.path.realpath(str(trace))
    except OSError:  # a name the file system refuses (too long): not the report's trace
        names_trace = False
    try:
        launch = read_launch(run_dir) or {}
    except RunDirError:
        launch = {}
    words = launch.get("maxinstr_command")
    sweep = launch.get("sweep")
    if isinstance(sweep, dict):
        sweep = {str(k): str(v) for k, v in sweep.items()} or None
    else:
        label = str(launch.get("label") or "")
        name, sep, value = label.rpartition(".r")[0].partition("=") if ".r" in label else label.partition("=")
        sweep = {name: value} if sep and name else None
    return LaunchRecord(words or None, sweep, names_trace)
