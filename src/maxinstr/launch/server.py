"""Profiling a long-running server around a benchmark window.

A server (``max serve``, a vLLM-style API, any process that warms up and then waits for
requests) is started once under ``nsys launch`` with a named session, so nothing is
collected while it loads; each benchmark window is ``nsys start`` ... ``nsys stop`` on that
session, one report per window; ``nsys shutdown`` ends it. The server's maxinstr stages go
to the run directory the whole time (the sitecustomize bootstrap opens the session), so
each window's trace joins the same run.

State lives in ``RUN/server.json`` so start, window and stop can be separate commands
(e.g. in a CI script), and only the process group recorded there is ever signalled.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maxinstr.errors import MaxinstrError
from maxinstr.launch import runner
from maxinstr.launch import supervise as sv
from maxinstr.launch.profilers import Artifact, Nsys, NsysOptions

STATE_FILE = "server.json"
LOG_FILE = "server.log"


@dataclass
class ServerState:
    """What `maxinstr server start` left for the commands that follow."""

    run_dir: Path
    pid: int
    pgid: int
    command: list[str]
    launch_command: list[str]
    profiler: str
    session: str | None
    nsys: str | None
    windows: list[dict]
    log: str

    def save(self) -> None:
        data = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}
        runner._write_json(self.run_dir / STATE_FILE, data)

    @classmethod
    def load(cls, run_dir: str | Path) -> ServerState:
        path = Path(run_dir) / STATE_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise MaxinstrError(f"{path}: no server started here (run `maxinstr server start -o {run_dir} -- CMD`)") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise MaxinstrError(f"{path}: unreadable server state ({exc})") from None
        data["run_dir"] = Path(data["run_dir"])
        return cls(**data)

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A zombie (exited, not yet reaped by its parent) is not alive for our purposes.
        try:
            with open(f"/proc/{self.pid}/stat", encoding="ascii") as fh:
                return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
        except OSError:
            return True


def session_name(run_dir: Path) -> str:
    """A unique nsys session name (letters, digits, dashes)."""
    stem = re.sub(r"[^A-Za-z0-9-]+", "-", run_dir.name).strip("-")[:40] or "run"
    return f"maxinstr-{stem}-{os.getpid()}-{int(time.time())}"


def launch_command(nsys: Nsys, session: str, command: list[str]) -> list[str]:
    """``nsys launch``: the app runs with tracing injected, nothing is collected until start.
    What to trace is set here; sampling is not: nsys 2025.3 refuses ``--sample`` and
    ``--cpuctxsw`` on ``launch`` ("can be set on the profile and start commands", seen on the H200)."""
    return [nsys.path, "launch", f"--session-new={session}", *nsys.trace_flags_launch(), *command]


def start_command(nsys: Nsys, session: str, output: Path) -> list[str]:
    """``nsys start``: where this window's report goes, and no CPU sampling or context-switch
    tracing (without them a tiny script wrote a 2 GB .qdstrm)."""
    return [nsys.path, "start", f"--session={session}", *nsys.sampling_flags(), "--force-overwrite=true",
            f"--output={output}"]


START_SETTLE_S = 0.5
"""`nsys start` returns before collection is live: wait this long before the benchmark."""


def stop_command(nsys: Nsys, session: str) -> list[str]:
    return [nsys.path, "stop", f"--session={session}"]


def shutdown_command(nsys: Nsys, session: str) -> list[str]:
    return [nsys.path, "shutdown", f"--session={session}"]


def _nsys(state_or_path: str | None) -> Nsys:
    return Nsys(state_or_path or "nsys", NsysOptions(capture="all", window_s=None))


def _wait_ready(state: ServerState, ready: str | None, timeout_s: float, patterns) -> None:
    """Return once the server's log shows ``ready`` (or at once when None); raise with the
    log's tail when it dies or logs a fatal error first."""
    rx = re.compile(ready) if ready else None
    fatal = sv.compile_patterns(patterns or ())
    log = Path(state.log)
    deadline = time.monotonic() + timeout_s
    tail: list[str] = []
    pending = ""
    with open(log, "rb") as fh:  # read what is new each time, never the whole log again
        while True:
            pending += fh.read().decode("utf-8", "replace")
            *lines, pending = pending.split("\n")
            for line in lines:
                tail = (tail + [line])[-8:]
                if rx is not None and rx.search(line):
                    return
                for label, frx in fatal:
                    if frx.search(line):
                        _kill_group(state)
                        raise MaxinstrError(f"server stopped: {label}: {line.strip()[:300]} (log {log})")
            if not state.alive():
                text = "\n".join("    " + x for x in tail + ([pending] if pending else []))
                raise MaxinstrError(f"the server exited before it was ready (log {log}):\n{text}")
            if rx is None:
                return
            if time.monotonic() > deadline:
                _kill_group(state)
                raise MaxinstrError(f"the server did not log /{ready}/ within {timeout_s:g} s (log {log}); stopped it")
            time.sleep(0.1)


def _kill_group(state: ServerState, grace_s: float = 10.0) -> None:
    """SIGTERM then SIGKILL to the process group we started (and only that group)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(state.pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not state.alive():
                return
            time.sleep(0.1)


def start_server(
    command: list[str],
    run_dir: Path,
    *,
    profiler: str = "nsys",
    nsys_path: str | None = None,
    ready: str | None = None,
    ready_timeout_s: float = 600.0,
    stage_specs: list[str] | None = None,
    presets: list[str] | None = None,
    fail_fast: bool = True,
) -> ServerState:
    """Start ``command`` in its own process group (under ``nsys launch`` when profiling),
    output to ``RUN/server.log``, and wait until its log matches ``ready``."""
    run_dir = sv.ensure_dir(run_dir).resolve()
    if (run_dir / STATE_FILE).exists():
        old = ServerState.load(run_dir)
        if old.alive():
            raise MaxinstrError(f"{run_dir}: a server started here is still running (pid {old.pid}); `maxinstr server stop {run_dir}` first")
    clear_previous_server(run_dir)
    spec = runner.RunSpec(command=command, run_dir=run_dir)
    env = runner.child_env(spec, runner.RunOptions(stage_specs=list(stage_specs or []), presets=list(presets or [])), run_dir)
    session = None
    cmd = list(command)
    if profiler == "nsys":
        nsys = _nsys(nsys_path)
        session = session_name(run_dir)
        cmd = launch_command(nsys, session, command)
    elif profiler != "none":
        raise MaxinstrError(f"server profiling supports nsys or none, not {profiler!r} (on AMD: `maxinstr run --profiler rocprofv3` around the whole server)")
    log_path = run_dir / LOG_FILE
    log = open(log_path, "ab")
    try:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    except FileNotFoundError:
        raise MaxinstrError(f"{cmd[0]}: command not found") from None
    finally:
        log.close()
    state = ServerState(run_dir=run_dir, pid=proc.pid, pgid=proc.pid, command=list(command), launch_command=cmd,
                        profiler=profiler, session=session, nsys=nsys_path if profiler == "nsys" else None,
                        windows=[], log=str(log_path))
    state.save()
    # Keep a reference so the child is reaped if this process lives on (tests, `server run`).
    _children[proc.pid] = proc
    _wait_ready(state, ready, ready_timeout_s, sv.DEFAULT_FATAL_PATTERNS if fail_fast else None)
    return state


_children: dict[int, subprocess.Popen] = {}


def clear_previous_server(run_dir: Path) -> list[str]:
    """A server started on a run directory that holds an earlier (ended) server's run replaces
    it, as `maxinstr run` does: its parts would merge with the new server's records, and its log
    would answer --ready before the new server is. Only the names a server run writes go;
    a run a live process still writes is never removed (MaxinstrError names it)."""
    removed = runner.clear_previous_run(run_dir)
    if not (run_dir / STATE_FILE).exists():
        return removed  # no server ran here: its files are not ours to remove
    names = [STATE_FILE, LOG_FILE, *(p.name for p in run_dir.glob("window-*"))]
    for name in names:
        path = run_dir / name
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed.append(name)
    return removed


def profile_window(
    run_dir: Path,
    *,
    duration_s: float | None = None,
    bench: list[str] | None = None,
    echo: Callable[[str], None] | None = sv.print_line,
    timeout_s: float | None = None,
) -> tuple[dict, Artifact | None, sv.ChildResult | None]:
    """One capture window: ``nsys start``, then the benchmark command (or ``duration_s``
    seconds), then ``nsys stop``; verify and export that window's report."""
    state = ServerState.load(run_dir)
    if not state.alive():
        raise MaxinstrError(f"{run_dir}: the server (pid {state.pid}) is not running; see {state.log}")
    k = len(state.windows) + 1
    output = state.run_dir / f"window-{k}"
    nsys = _nsys(state.nsys)
    if state.profiler == "nsys":
        # The session may not be registered yet right after launch: retry briefly.
        for attempt in range(5):
            try:
                _check(start_command(nsys, state.session, output))  # type: ignore[arg-type]
                break
            except MaxinstrError:
                if attempt == 4:
                    raise
                time.sleep(0.5 * (attempt + 1))
        time.sleep(START_SETTLE_S)
    started = time.time()
    started_ns = time.monotonic_ns()  # the records' clock (CLOCK_MONOTONIC): the window's span in the run
    bench_result = None
    try:
        if bench:
            bench_result = sv.supervise(bench, log_path=state.run_dir / f"window-{k}.bench.log", echo=echo,
                                        timeout_s=timeout_s, fatal_patterns=sv.DEFAULT_FATAL_PATTERNS)
        else:
            time.sleep(duration_s if duration_s is not None else 10.0)
    except FileNotFoundError:
        raise MaxinstrError(f"{bench[0] if bench else '?'}: command not found") from None
    except KeyboardInterrupt:
        pass  # end the window early; the report of what was collected is still written
    finally:
        if state.profiler == "nsys":
            _check(stop_command(nsys, state.session))  # type: ignore[arg-type]
    window: dict[str, Any] = {"index": k, "started_unix_s": started, "wall_s": round(time.time() - started, 3),
              "host_start_ns": started_ns, "host_end_ns": time.monotonic_ns(),
              "bench": bench, "bench_status": bench_result.status if bench_result else None}
    artifact = nsys.collect(output) if state.profiler == "nsys" else None
    if artifact is not None:
        window["artifact"] = artifact.to_json()
    state.windows.append(window)
    state.save()
    return window, artifact, bench_result


def stop_server(run_dir: Path, grace_s: float = 20.0) -> ServerState:
    """End the server: ``nsys shutdown`` on its session, then the recorded process group."""
    state = ServerState.load(run_dir)
    if state.profiler == "nsys" and state.alive():
        try:
            subprocess.run(shutdown_command(_nsys(state.nsys), state.session), capture_output=True,  # type: ignore[arg-type]
                           timeout=60, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            pass
    elif state.alive():
        _kill_group(state, grace_s)  # no profiler session: SIGTERM to the group we started
    deadline = time.monotonic() + grace_s
    while state.alive() and time.monotonic() < deadline:
        _reap(state.pid)
        time.sleep(0.1)
    if state.alive():
        _kill_group(state)
    _reap(state.pid)
    runner.meta_if_none(state.run_dir, state.command)  # a server that never started maxinstr
    return state


def _reap(pid: int) -> None:
    proc = _children.get(pid)
    if proc is not None and proc.poll() is not None:
        _children.pop(pid, None)


def _check(cmd: list[str]) -> None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MaxinstrError(f"{' '.join(cmd[:2])}: {exc}") from None
    if out.returncode != 0:
        msg = (out.stderr or out.stdout).strip().splitlines()
        raise MaxinstrError(f"{' '.join(cmd[:3])} exited {out.returncode}: {msg[-1] if msg else ''}")
