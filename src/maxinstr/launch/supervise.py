"""Run a child command in its own process group, watch its log, stop it fast when it fails (docs/cli.md,
"Failing fast"); a Ctrl-C leaves a partial result; only the group maxinstr started is ever signalled."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from maxinstr._files import open_write_file
from maxinstr._threads import block_terminating_signals

# Lines that mean the run is lost: a match starts a grace period, after which a child still running
# (a server that logged a traceback and hangs) is stopped
DEFAULT_FATAL_PATTERNS: tuple[tuple[str, str], ...] = (
    ("python traceback", r"^Traceback \(most recent call last\):"),
    ("out of GPU memory", r"CUDA out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|hipErrorOutOfMemory|out of memory"),
    ("model not found", r"RepositoryNotFoundError|EntryNotFoundError|GatedRepoError|(model|checkpoint|repository|weights?)\b"
                        r".*\bnot found|does not appear to have a file named|No such file or directory"),
    ("bad command-line flag", r"unrecognized arguments:|error: argument |invalid choice:|No such option:|unknown option|Unknown argument"),
    ("crash", r"Segmentation fault|core dumped|Aborted \(core dumped\)|illegal memory access|CUDA error:|HIP error:"),
)

STATUS_OK = "ok"
STATUS_FAILED = "failed"  # exited non-zero by itself
STATUS_FATAL_LOG = "fatal-log"  # stopped by maxinstr after a fatal line in the log
STATUS_TIMEOUT = "timeout"
STATUS_INTERRUPTED = "interrupted"  # Ctrl-C, or SIGTERM / SIGHUP to maxinstr


class SignalInterrupt(KeyboardInterrupt):
    """SIGTERM or SIGHUP to maxinstr while it supervises a child: handled as Ctrl-C is (their
    default action killed maxinstr alone and left the child running, with no launch.json)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """While a child runs, SIGTERM and SIGHUP raise :class:`SignalInterrupt` (main thread, default action only)."""
    saved: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is signal.SIG_DFL:
                saved[sig] = signal.signal(sig, _raise_interrupt)
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise SignalInterrupt(signum)


@dataclass
class ChildResult:  # how a supervised child ended
    command: list[str]
    status: str
    returncode: int | None
    wall_s: float
    log_path: str | None
    fatal_label: str | None = None
    fatal_line: str | None = None
    tail: list[str] = field(default_factory=list)
    stopped_by_maxinstr: bool = False
    signal: int | None = None  # SIGTERM / SIGHUP that interrupted maxinstr (None: Ctrl-C or none)

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    def describe(self) -> str:  # one line saying how the child ended
        by = f" by {signal.Signals(self.signal).name}" if self.signal else ""
        return {STATUS_OK: f"finished in {self.wall_s:.1f} s",
                STATUS_FAILED: f"exited with status {self.returncode} after {self.wall_s:.1f} s",
                STATUS_FATAL_LOG: f"stopped after {self.wall_s:.1f} s: {self.fatal_label}: {self.fatal_line}",
                STATUS_TIMEOUT: f"stopped at the {self.wall_s:.0f} s time limit",
                }.get(self.status, f"interrupted{by} after {self.wall_s:.1f} s (partial results kept)")

    def to_json(self) -> dict:
        return {"command": self.command, "status": self.status, "returncode": self.returncode,
                "wall_s": round(self.wall_s, 3), "log": self.log_path,
                "fatal": None if self.fatal_label is None else {"label": self.fatal_label, "line": self.fatal_line},
                "stopped_by_maxinstr": self.stopped_by_maxinstr,
                "signal": signal.Signals(self.signal).name if self.signal else None}


def compile_patterns(patterns: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> list[tuple[str, re.Pattern[str]]]:
    return [(label, re.compile(rx)) for label, rx in patterns]


class _LogPump(threading.Thread):  # the child's output to the log (and terminal); notes the first fatal line

    def __init__(self, stream: IO[bytes], log: IO[bytes] | None, echo: Callable[[str], None] | None,
                 patterns: list[tuple[str, re.Pattern[str]]]) -> None:
        super().__init__(daemon=True, name="maxinstr-log-pump")
        self.stream, self.log, self.echo, self.patterns = stream, log, echo, patterns
        self.tail: deque[str] = deque(maxlen=40)
        self.fatal: tuple[str, str, float] | None = None

    def run(self) -> None:
        block_terminating_signals()
        for raw in iter(self.stream.readline, b""):
            if self.log is not None:
                self.log.write(raw)
                self.log.flush()
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.tail.append(line)
            if self.echo is not None:
                self.echo(line)
            hit = next((label for label, rx in self.patterns if rx.search(line)), None) if self.fatal is None else None
            if hit is not None:
                self.fatal = (hit, line.strip()[:300], time.monotonic())


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(proc: subprocess.Popen, pgid: int, *, grace_s: float = 20.0, first: int = signal.SIGINT) -> None:
    """SIGINT (nsys writes its report), SIGTERM, SIGKILL to the group we started, each after a grace."""
    for sig, wait_s in ((first, grace_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        _signal_group(pgid, sig)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        except KeyboardInterrupt:  # a second Ctrl-C: stop waiting politely
            _signal_group(pgid, signal.SIGKILL)
            proc.wait()
            break
    # Stragglers left in our group after the leader exited (e.g. the app under nsys).
    _signal_group(pgid, signal.SIGTERM)


def supervise(command: list[str], *, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
              log_path: str | os.PathLike | None = None, timeout_s: float | None = None,
              fatal_patterns: tuple[tuple[str, str], ...] | list[tuple[str, str]] | None = DEFAULT_FATAL_PATTERNS,
              fatal_grace_s: float = 3.0, stop_grace_s: float = 20.0, echo: Callable[[str], None] | None = None,
              poll_s: float = 0.05) -> ChildResult:
    """Run ``command`` in a new process group and wait, stopping it early at a fatal log line (after
    ``fatal_grace_s``), ``timeout_s`` or Ctrl-C. Output to ``log_path`` (and ``echo``); FileNotFoundError."""
    patterns = compile_patterns(fatal_patterns or ())
    log = open_write_file(log_path) if log_path else None  # O_NOFOLLOW: never through a planted link
    start = time.monotonic()
    try:
        proc = subprocess.Popen(command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)  # own group: we signal only it
    except BaseException:
        if log:
            log.close()
        raise
    pgid = proc.pid  # (the group's leader: its pid is the group id)
    pump = _LogPump(proc.stdout, log, echo, patterns)  # type: ignore[arg-type]
    pump.start()
    status, stopped = STATUS_OK, False
    by_signal: int | None = None
    with _signals_interrupt():
        try:
            while proc.poll() is None:
                now = time.monotonic()
                if timeout_s is not None and now - start > timeout_s:
                    status, stopped = STATUS_TIMEOUT, True
                    stop_group(proc, pgid, grace_s=stop_grace_s)
                    break
                if pump.fatal is not None and now - pump.fatal[2] > fatal_grace_s:
                    status, stopped = STATUS_FATAL_LOG, True
                    stop_group(proc, pgid, grace_s=min(stop_grace_s, 10.0))
                    break
                time.sleep(poll_s)
        except KeyboardInterrupt as exc:
            status, stopped = STATUS_INTERRUPTED, True
            by_signal = exc.signum if isinstance(exc, SignalInterrupt) else None
            # a terminating signal asks for an end soon: the child gets less time than after Ctrl-C
            stop_group(proc, pgid, grace_s=stop_grace_s if by_signal is None else min(stop_grace_s, 5.0))
    wall_s, returncode = time.monotonic() - start, proc.wait()
    pump.join(timeout=2.0)  # a grandchild may hold the pipe open: do not wait for it
    if log:
        log.close()
    if status == STATUS_OK and returncode != 0:
        status = STATUS_FAILED
    fatal_label, fatal_line = pump.fatal[:2] if pump.fatal is not None and status != STATUS_OK else (None, None)
    return ChildResult(command=list(command), status=status, returncode=returncode, wall_s=wall_s,
                       log_path=str(log_path) if log_path else None, fatal_label=fatal_label, fatal_line=fatal_line,
                       tail=list(pump.tail), stopped_by_maxinstr=stopped, signal=by_signal)


def print_line(line: str) -> None:  # a child's line echoed to our stdout as it arrives
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def ensure_dir(path: str | os.PathLike) -> Path:
    Path(path).mkdir(parents=True, exist_ok=True)
    return Path(path)
