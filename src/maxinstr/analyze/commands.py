"""Every command line a report shows, spelt in one place from the report's inputs and what
`maxinstr run` recorded: a finding's next step and validation, and ``reproduce``."""

from __future__ import annotations

import shlex
from typing import Any, cast

from maxinstr.analyze.schema import Report, ReproduceStep
from maxinstr.rundir import Run
from maxinstr.rundir.launch_record import LaunchRecord
from maxinstr.traces.inprocess import FORMAT as INPROCESS_FORMAT
from maxinstr.traces.model import Trace

NVIDIA_SMI_CLOCKS = "nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE"


class Commands:
    """The commands the findings of one report suggest, for its inputs (``report["sources"]``)."""

    def __init__(self, report: Report, launch: LaunchRecord | None = None) -> None:
        src = report.get("sources", {})
        self.run, self.trace = src.get("run"), src.get("trace")
        self.inprocess = src.get("trace_format") == INPROCESS_FORMAT
        self.program = report.get("environment", {}).get("command")
        self.launch = launch or LaunchRecord()

    def _inputs(self) -> str:
        """The run directory, with ``--trace`` when a trace came with it; a trace alone as ``--trace``."""
        q = shlex.quote
        if self.run and self.trace:
            return f"{q(str(self.run))} --trace {q(str(self.trace))}"
        if self.run:
            return q(str(self.run))
        return f"--trace {q(str(self.trace))}" if self.trace else "REPORT.json"

    def report(self, options: str) -> str:
        return f"maxinstr report {self._inputs()} {options}"

    def deep_dive(self, kernel_regex: str, stage: str | None = None) -> str:
        """deep-dive's SOURCE is a run directory or a trace; ``stage`` is the stage key."""
        source = shlex.quote(str(self.trace)) if self.trace and not self.run else self._inputs()
        at = f" --stage {shlex.quote(stage)}" if stage is not None else ""
        return f"maxinstr deep-dive {source}{at} --kernel {shlex.quote(kernel_regex)}"

    def compare(self) -> str:
        """compare before/after with this report's inputs, each side best a folder of repeats (one
        run a side "cannot tell"); only a trace given beside the run goes on the command line
        (compare finds a run's own trace as report does)."""
        q = shlex.quote
        if not self.run:
            return f"maxinstr compare {q(str(self.trace))} TRACE_AFTER" if self.trace else "maxinstr compare RUNS_BEFORE RUNS_AFTER"
        if self.trace and not (self.inprocess or self.trace == self.run or self.launch.names_trace):
            return f"maxinstr compare {q(str(self.run))} RUN_AFTER --trace {q(str(self.trace))} --trace TRACE_AFTER"
        return f"maxinstr compare {q(str(self.run))} RUNS_AFTER"

    def check(self, what: str) -> str:
        """A validation: the compare command and what its output must show."""
        return f"{self.compare()}  # {what}"

    def rerun(self, *, with_profiler: bool = False) -> str:
        """The `maxinstr run` that records this program again: the one the run recorded, else
        ``maxinstr run -- PROGRAM``; ``with_profiler``: without ``--profiler none``."""
        words = self.launch.maxinstr_command
        if words is None:
            cmd = self.program
            return "maxinstr run -- " + (shlex.join(str(c) for c in cmd) if isinstance(cmd, list) else "python YOUR_SCRIPT.py")
        if with_profiler:
            cut = words.index("--") if "--" in words else len(words)
            opts = words[:cut]
            for i in range(len(opts) - 1, -1, -1):
                if opts[i] == "--profiler=none":
                    del opts[i]
                elif opts[i] == "--profiler" and i + 1 < len(opts) and opts[i + 1] == "none":
                    del opts[i:i + 2]
            words = opts + words[cut:]
        return shlex.join(words)


def reproduce(run: Run | None, trace: Trace | None, unprofiled: Run | None) -> list[ReproduceStep]:
    """``report["reproduce"]``: the program as run, `maxinstr run`'s command, the profiler's, this report's."""
    meta = (run.meta or {}) if run is not None else {}

    def words(value: Any) -> str | None:  # a command as recorded: a list of words (data: checked)
        if isinstance(value, list) and value and all(isinstance(w, str) for w in value):
            return shlex.join(value)
        return value if isinstance(value, str) and value else None

    out: list[ReproduceStep] = []
    prof = meta.get("profiler")
    rerun = meta.get("maxinstr_command")
    for what, text in (("the program, as run", words(meta.get("command"))),
                       ("the run, as maxinstr run made it", words(rerun) if isinstance(rerun, list) else None),
                       ("the profiler capture", words(prof.get("command")) if isinstance(prof, dict) else None)):
        if text:
            out.append({"what": what, "command": text})
    parts = ["maxinstr", "report"]
    if run is not None and run.path:
        parts.append(str(run.path))
    if trace is not None and (trace.meta or {}).get("rank_sources"):
        for r, src in zip(cast("list[int]", trace.meta["ranks"]), cast("list[str]", trace.meta["rank_sources"])):
            parts += ["--trace", f"{r}={src}"]
    elif trace is not None and trace.format != INPROCESS_FORMAT:  # in-process kernels are read from the run itself
        parts += ["--trace", str(trace.source)]
    if unprofiled is not None and unprofiled.path:
        parts += ["--unprofiled", str(unprofiled.path)]
    out.append({"what": "this report", "command": shlex.join(parts)})
    return out
