"""What the benchmarks share: rotation of configurations over rounds, timing, ratios against a
baseline measured in the same run, child processes (wall time, peak RSS, a time limit, one
RESULT line), and tables.

A benchmark script imports it as ``from harness import ...`` (``python benchmarks/X.py`` puts
this folder first on the path). Our rule: a speed or memory target is read off ratios against
peers measured in the same run, interleaved round by round, so that a noisy stretch of a shared
machine falls on every configuration alike.

Not for the innermost loops: a loop timing a ~50 ns operation stays in the script, written out,
and the harness times the call that runs the whole loop (``block_ns``), not each iteration.
"""

from __future__ import annotations

import gc
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

RESULT_PREFIX = "RESULT "


# ------------------------------------------------------------------------- rounds
def rotated(names: Sequence[K], round_index: int) -> list[K]:
    """``names`` started at position ``round_index`` (mod their count): over len(names) rounds
    each name runs once in every position, so neither drift nor what ran just before favours
    one of them."""
    if not names:
        return []
    k = round_index % len(names)
    return [*names[k:], *names[:k]]


def interleave(names: Sequence[K], rounds: int, measure: Callable[[K, int], T], *,
               order: Callable[[Sequence[K], int], Sequence[K]] = rotated) -> dict[K, list[T]]:
    """``measure(name, round)`` for every name in each of ``rounds`` rounds, the names of round
    r in ``order(names, r)`` (rotated by default); each name's samples in round order."""
    samples: dict[K, list[T]] = {name: [] for name in names}
    for r in range(rounds):
        for name in order(names, r):
            samples[name].append(measure(name, r))
    return samples


# ------------------------------------------------------------------------- timing
def time_calls_ns(fn: Callable[[], object], n: int, *, warmup: int = 0) -> list[int]:
    """Wall ns of each of ``n`` calls of ``fn``, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    clock = time.perf_counter_ns
    out: list[int] = []
    for _ in range(n):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def block_ns(fn: Callable[[int], object], n: int, *, gc_off: bool = False) -> float:
    """Wall ns per iteration of one call ``fn(n)`` that runs its own loop of ``n`` iterations
    (the loop is the caller's, so a ~50 ns body is not timed through a call per iteration).
    gc_off: the collector is off while it runs (a collection would land on one case only)."""
    if gc_off:
        gc.disable()
    try:
        t0 = time.perf_counter_ns()
        fn(n)
        t1 = time.perf_counter_ns()
    finally:
        if gc_off:
            gc.enable()
    return (t1 - t0) / n


@dataclass(frozen=True)
class Stats:
    """Summary of samples: ``p10``/``p90`` are statistics.quantiles' (exclusive method) first and
    last deciles, the sample itself when there is one."""

    n: int
    median: float
    p10: float
    p90: float
    min: float
    max: float
    mean: float

    @classmethod
    def of(cls, samples: Iterable[float]) -> Stats:
        xs = [float(x) for x in samples]
        if not xs:
            raise ValueError("Stats.of: no samples")
        deciles = statistics.quantiles(xs, n=10) if len(xs) > 1 else [xs[0]] * 9
        return cls(n=len(xs), median=statistics.median(xs), p10=deciles[0], p90=deciles[-1], min=min(xs),
                   max=max(xs), mean=statistics.fmean(xs))


def p10(samples: Iterable[float]) -> float:
    """The 10th percentile (the sample least disturbed by the rest of the machine)."""
    return Stats.of(samples).p10


# ------------------------------------------------------------------------- ratios
@dataclass(frozen=True)
class Ratio:
    """A configuration against the baseline measured in the same run. ``per_round``: value /
    baseline of the same round (rounds where either is missing, None, or the baseline is 0 are
    left out); ``median``: their median (drift between rounds cancels); ``of_medians``: the
    configuration's median over the baseline's. NaN where there is nothing to divide."""

    per_round: list[float]
    median: float
    of_medians: float


def ratio(values: Sequence[float | None], baseline: Sequence[float | None]) -> Ratio:
    """``values`` against ``baseline``, both indexed by round."""
    per_round = [v / b for v, b in zip(values, baseline) if v is not None and b is not None and b != 0]
    vs = [v for v in values if v is not None]
    bs = [b for b in baseline if b is not None]
    base = statistics.median(bs) if bs else math.nan
    return Ratio(per_round=per_round, median=statistics.median(per_round) if per_round else math.nan,
                 of_medians=statistics.median(vs) / base if vs and base else math.nan)


def ratios(samples: Mapping[K, Sequence[float | None]], baseline: K) -> dict[K, Ratio]:
    """Every configuration of ``samples`` (the baseline's own included) against ``baseline``."""
    return {name: ratio(values, samples[baseline]) for name, values in samples.items()}


def bootstrap_ci(per_round: Sequence[float], *, level: float = 0.90, resamples: int = 4000,
                 seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap confidence interval of the median of ``per_round`` (the rounds
    resampled with replacement, ``resamples`` times): what a ratio read off these rounds could
    be. ``(nan, nan)`` for fewer than 2 rounds. Seeded, so the same rounds give the same interval."""
    import random

    xs = [float(x) for x in per_round if x is not None and math.isfinite(x)]
    if len(xs) < 2:
        return math.nan, math.nan
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(resamples))
    lo_i = int(round((1 - level) / 2 * (resamples - 1)))
    return medians[lo_i], medians[resamples - 1 - lo_i]


@dataclass(frozen=True)
class Verdict:
    """A target read off an interval: ``met`` when the whole interval is within it, ``missed``
    when none of it is, ``undecided`` when the interval straddles it (more rounds, or a quieter
    machine, decide). ``line()`` is what a benchmark prints."""

    what: str
    value: float
    lo: float
    hi: float
    target: float
    status: str

    at_least: bool = False

    def line(self, fmt: str = ".3f") -> str:
        return (f"{self.status.upper():>9}  {self.what}: {self.value:{fmt}} "
                f"(90% CI {self.lo:{fmt}}..{self.hi:{fmt}}), target {'>=' if self.at_least else '<='} {self.target:{fmt}}")


def verdict(what: str, per_round: Sequence[float], target: float, *, at_least: bool = False, **ci: Any) -> Verdict:
    """``what`` (the median of ``per_round``) against ``target``: an upper bound, or a lower
    bound with ``at_least``."""
    xs = [float(x) for x in per_round if x is not None and math.isfinite(x)]
    value = statistics.median(xs) if xs else math.nan
    lo, hi = bootstrap_ci(xs, **ci)
    sign = -1.0 if at_least else 1.0  # a lower bound is an upper bound on the negated values
    v, worst, best = sign * value, max(sign * lo, sign * hi), min(sign * lo, sign * hi)
    if not xs:
        status = "no data"
    elif math.isnan(lo):
        status = "met" if v <= sign * target else "missed"
    else:
        status = "met" if worst <= sign * target else "missed" if best > sign * target else "undecided"
    return Verdict(what, value, lo, hi, target, status, at_least)


# ------------------------------------------------------------------------- child processes
def emit_result(result: Mapping[str, Any]) -> None:
    """The child's side of the protocol: one ``RESULT {json}`` line on stdout."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The parent's side: the last ``RESULT {json}`` line of a child's stdout as a dict (None
    when there is none; ValueError when it is not a JSON object)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            value = json.loads(line[len(RESULT_PREFIX):])
            if not isinstance(value, dict):
                raise ValueError(f"RESULT line is not a JSON object: {line[:200]}")
            return value
    return None


@dataclass
class ChildRun:
    """One child process, spawn to exit. ``rc`` is None when the time limit killed it
    (``timed_out``); ``peak_rss_mb`` and ``cpu_s`` are the child's own (os.wait4), its reaped
    children included; ``error`` is one line saying why it failed (None when rc is 0 and any
    RESULT line parsed)."""

    cmd: list[str]
    rc: int | None
    timed_out: bool
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    stdout: str
    stderr: str
    result: dict[str, Any] | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


def run_child(cmd: Sequence[str], *, limit_s: float | None = None, env: Mapping[str, str] | None = None,
              cwd: str | os.PathLike[str] | None = None, preexec_fn: Callable[[], object] | None = None,
              capture: bool = True) -> ChildRun:
    """Run ``cmd`` to its exit, or until ``limit_s`` seconds have passed: then its whole process
    group is killed and the run comes back with ``timed_out`` (a child past its limit is a
    result to report, not a crash). stdout and stderr go to temporary files, read after the exit
    (a pipe would stall a child, or a grandchild holding it open, that writes more than the pipe
    holds); capture=False sends them to /dev/null. The wall time is spawn to exit (a blocking
    wait4, no polling)."""
    cmd = [str(c) for c in cmd]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sink: IO[bytes] | int = out if capture else subprocess.DEVNULL
        sink_err: IO[bytes] | int = err if capture else subprocess.DEVNULL
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink_err,
                                env=None if env is None else dict(env), cwd=cwd, preexec_fn=preexec_fn,
                                start_new_session=limit_s is not None)
        killed = threading.Event()
        reaped = threading.Lock()
        done = False

        def kill() -> None:
            with reaped:
                if not done:
                    killed.set()
                    os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(limit_s, kill) if limit_s is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:  # Ctrl-C: the child (in a session of its own) must not outlive us
            if limit_s is not None:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            proc.wait()
            raise
        finally:
            with reaped:
                done = True
            if timer is not None:
                timer.cancel()
        wall_s = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    timed_out = killed.is_set()
    rc = None if timed_out else proc.returncode
    result: dict[str, Any] | None = None
    error: str | None = None
    if timed_out:
        error = f"no result within {limit_s:g} s (killed)"
    else:
        try:
            result = parse_result(stdout)
        except ValueError as exc:
            error = f"bad RESULT line: {exc}"
        if rc != 0:
            last = (stderr.strip().splitlines() or stdout.strip().splitlines() or ["no output"])[-1]
            error = f"exit {rc}: {last[:300]}"
    return ChildRun(cmd=cmd, rc=rc, timed_out=timed_out, wall_s=wall_s, cpu_s=usage.ru_utime + usage.ru_stime,
                    peak_rss_mb=usage.ru_maxrss / 1024, stdout=stdout, stderr=stderr, result=result, error=error)


# ------------------------------------------------------------------------- tables
def format_table(header: Sequence[str], rows: Iterable[Sequence[object]], formats: Sequence[str | None] = (),
                 indent: str = "") -> str:
    """``rows`` under ``header``, each column as wide as its widest cell: the first column
    left-aligned, the others right-aligned. A number in column i is formatted with
    ``formats[i]`` (e.g. ".1f"; none given: str()); None and NaN print as "-"."""

    def cell(value: object, i: int) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        spec = formats[i] if i < len(formats) else None
        if spec and isinstance(value, (int, float)) and not isinstance(value, bool):
            return format(value, spec)
        return str(value)

    cells = [list(header)] + [[cell(v, i) for i, v in enumerate(row)] for row in rows]
    widths = [max(len(r[i]) for r in cells if i < len(r)) for i in range(len(header))]
    lines = []
    for r in cells:
        parts = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append(indent + "  ".join(parts).rstrip())
    return "\n".join(lines)


def print_table(header: Sequence[str], rows: Iterable[Sequence[object]], formats: Sequence[str | None] = (),
                indent: str = "") -> None:
    """format_table, printed (flushed: benchmarks run under tee)."""
    print(format_table(header, rows, formats, indent), flush=True)


def load_average() -> str:
    """The 1-minute load average and the core count, printed with the numbers: what else the
    machine was doing while they were measured."""
    return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


if __name__ == "__main__":
    sys.exit("benchmarks/harness.py is imported by the benchmark scripts, not run")
