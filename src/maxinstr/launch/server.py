"""Profiling a long-running server around benchmark windows (docs/cli.md, `maxinstr server`): under
``nsys launch``, a window is ``nsys start`` ... ``nsys stop``. State lives in ``RUN/server.json``; only
the process group recorded there is signalled, once :func:`verify` proved it is the server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maxinstr import config
from maxinstr._files import LINK_REFUSED, open_write_file, parse_json, read_regular
from maxinstr.errors import MaxinstrError
from maxinstr.launch import layout, runner
from maxinstr.launch import supervise as sv
from maxinstr.launch.env import find_tool
from maxinstr.launch.profilers import Artifact, Nsys, NsysOptions, run_tool

STATE_FILE, LOG_FILE = "server.json", "server.log"


@dataclass
class ServerState:
    """What `maxinstr server start` left for the commands that follow. ``server.json`` is data: nothing in
    it is run (nsys is the one on PATH now), nothing it names signalled before :func:`verify`."""

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
    start_ticks: int | None = None  # /proc/<pid>/stat field 22: when the process started, in clock ticks since boot
    boot_id: str | None = None  # /proc/sys/kernel/random/boot_id: start ticks are per boot
    token: str | None = None  # also in the server's environment (config.SERVER_TOKEN)

    def save(self) -> None:
        runner.write_json(self.run_dir / STATE_FILE, {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()})

    @classmethod
    def load(cls, run_dir: str | Path) -> ServerState:
        """The server started in ``run_dir`` (never the ``run_dir`` the file names: maxinstr writes there)."""
        path = Path(run_dir) / STATE_FILE
        unreadable = lambda p, why: MaxinstrError(f"{p}: unreadable server state ({why})")  # noqa: E731
        if (raw := read_regular(path, unreadable)) is None:
            raise MaxinstrError(f"{path}: no server started here (run `maxinstr server start -o {run_dir} -- CMD`)")
        data = parse_json(raw, path, unreadable)
        if not isinstance(data, dict):
            raise unreadable(path, "not a JSON object")
        for key, (ok, what) in _FIELDS.items():
            if key not in data and key not in _OPTIONAL:
                raise unreadable(path, f'no "{key}"')
            if key in data and not ok(data[key]):
                text = json.dumps(data[key], ensure_ascii=True, default=str)
                raise unreadable(path, f'"{key}" is not {what}: {text if len(text) <= 60 else text[:57] + "..."}')
        known: dict[str, Any] = {**{k: data.get(k) for k in _FIELDS}, "run_dir": Path(run_dir).resolve()}
        return cls(**known)

    def alive(self) -> bool:
        """Whether the process ``pid`` exists and is not a zombie (maybe another process: :func:`verify`)."""
        if self.pid < 2:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return (_stat_fields(self.pid) or ["?"])[0] != "Z"  # a zombie (exited, not yet reaped) is not alive

    def ours(self) -> bool:  # started by this very process (``server run``, a test): no need to ask /proc
        proc = _children.get(self.pid)
        return proc is not None and proc.poll() is None


def _is_pid(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 2 <= v < 2**31


def _opt_str(v: object) -> bool:
    return v is None or isinstance(v, str)


_SESSION_RE = re.compile(r"maxinstr-[A-Za-z0-9-]{1,120}")
_STR_LIST = (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings")
_FIELDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "run_dir": (lambda v: isinstance(v, str), "a path"), "pid": (_is_pid, "a process id"),
    "pgid": (_is_pid, "a process group id"), "command": _STR_LIST, "launch_command": _STR_LIST,
    "profiler": (lambda v: v in ("nsys", "none"), '"nsys" or "none"'),
    "session": (lambda v: v is None or (isinstance(v, str) and _SESSION_RE.fullmatch(v) is not None),
                "an nsys session name maxinstr makes (maxinstr-...)"),
    "nsys": (_opt_str, "a path or null"),
    "windows": (lambda v: isinstance(v, list) and all(isinstance(w, dict) for w in v), "a list of objects"),
    "log": (lambda v: isinstance(v, str), "a path"),
    "start_ticks": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0), "a count"),
    "boot_id": (_opt_str, "a string"), "token": (_opt_str, "a string")}
_OPTIONAL = ("start_ticks", "boot_id", "token")  # absent from a server.json of before 2026-12


def _read(path: str, limit: int = 1 << 20) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


def _stat_fields(pid: int) -> list[str] | None:  # /proc/<pid>/stat from field 3 (state) on
    raw = _read(f"/proc/{pid}/stat")
    return None if raw is None else raw.decode("utf-8", "replace").rsplit(")", 1)[-1].split()


def process_start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (/proc stat field 22; a reused pid has another)."""
    try:
        return int((_stat_fields(pid) or [])[19])
    except (IndexError, ValueError):
        return None


def boot_id() -> str | None:
    raw = _read("/proc/sys/kernel/random/boot_id")
    return raw.decode("utf-8", "replace").strip() if raw else None


def _environ(pid: int) -> dict[str, str] | None:
    if (raw := _read(f"/proc/{pid}/environ", 1 << 22)) is None:
        return None
    pairs = (item.partition(b"=") for item in raw.split(b"\0"))
    return {k.decode("utf-8", "surrogateescape"): v.decode("utf-8", "surrogateescape") for k, sep, v in pairs if sep}


def verify(state: ServerState) -> str | None:
    """Why the process ``state`` names is not the server `maxinstr server start` made for ``state.run_dir``,
    or None: alive, its group's leader, started at the recorded time of this boot, holding in its
    environment the token and run directory of server.json. Only then is it signalled or driven."""
    if state.ours():
        return None
    if state.pgid != state.pid:
        return f"process group {state.pgid} is not the server's own (pid {state.pid}); maxinstr starts a server as its group's leader"
    if not state.alive():
        return f"pid {state.pid} is not running"
    if state.token is None or state.start_ticks is None:
        return "server.json has no start time or token to check the process against (written before 2026-12?)"
    if (started := process_start_ticks(state.pid)) is None:
        return f"the start time of pid {state.pid} cannot be read (/proc/{state.pid}/stat)"
    if started != state.start_ticks or (state.boot_id and boot_id() not in (None, state.boot_id)):
        return f"pid {state.pid} started at another time than the server: the pid was reused by another process"
    try:
        group = os.getpgid(state.pid)
    except OSError:
        return f"pid {state.pid} is not running"
    if group != state.pgid:
        return f"pid {state.pid} is in process group {group}, not the server's {state.pgid}"
    if (env := _environ(state.pid)) is None:
        return f"the environment of pid {state.pid} cannot be read to check it is the server"
    if env.get(config.SERVER_TOKEN) != state.token:
        return f"pid {state.pid} does not hold this server's token: not the process `maxinstr server start` made"
    if env.get(config.RUN_DIR) != str(state.run_dir):
        return f"pid {state.pid} was started for another run directory ({env.get(config.RUN_DIR)!r})"
    if state.session is not None:
        argv = (_read(f"/proc/{state.pid}/cmdline") or b"").decode("utf-8", "replace").split("\0")
        if f"--session-new={state.session}" not in argv:
            return f"pid {state.pid} did not launch the nsys session server.json names ({state.session})"
    return None


START_SETTLE_S = 0.5  # `nsys start` returns before collection is live: wait this long before the benchmark


def _nsys(path: str | None) -> Nsys:
    return Nsys(path or "nsys", NsysOptions(capture="all", window_s=None))


def _nsys_now(state: ServerState, echo: Callable[[str], None] | None = None) -> Nsys:
    """The nsys on PATH now, never the one server.json names (a planted ``/tmp/x.sh`` would run)."""
    tool = find_tool("nsys", probe_version=False)
    if not tool.found or tool.path is None:
        raise MaxinstrError(f"nsys is not installed: {tool.install_hint()}")
    recorded = state.nsys
    if recorded and echo is not None and os.path.realpath(recorded) != os.path.realpath(tool.path):
        echo(f"maxinstr: server.json names nsys {recorded!r}; running {tool.path} (found now) instead: "
             "a program named in a file is never run")
    return _nsys(tool.path)


def _refuse(state: ServerState, problem: str, what: str) -> MaxinstrError:
    return MaxinstrError(f"{state.run_dir / STATE_FILE}: {problem}; {what}")


def _wait_ready(state: ServerState, ready: str | None, timeout_s: float, patterns) -> None:
    """Return once the log shows ``ready``; raise with its tail when the server dies or logs a fatal error."""
    rx, fatal = re.compile(ready) if ready else None, sv.compile_patterns(patterns or ())
    log, deadline = Path(state.log), time.monotonic() + timeout_s
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
    """SIGTERM then SIGKILL to the process group we started, each once :func:`verify` proves it the server."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if (problem := verify(state)) is not None:
            if state.alive():
                raise _refuse(state, problem, "it was not signalled")
            return
        try:
            os.killpg(state.pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not state.alive():
                return
            time.sleep(0.1)


def start_server(command: list[str], run_dir: Path, *, profiler: str = "nsys", nsys_path: str | None = None,
                 ready: str | None = None, ready_timeout_s: float = 600.0, stage_specs: list[str] | None = None,
                 presets: list[str] | None = None, fail_fast: bool = True) -> ServerState:
    """Start ``command`` in its own group (under ``nsys launch`` when profiling); wait for ``ready``."""
    run_dir = sv.ensure_dir(run_dir).resolve()
    if os.path.lexists(run_dir / STATE_FILE):
        try:
            old: ServerState | None = ServerState.load(run_dir)
        except MaxinstrError:
            old = None  # damaged: nothing in it is trusted, and it is replaced
        if old is not None and verify(old) is None:
            raise MaxinstrError(f"{run_dir}: a server started here is still running (pid {old.pid}); `maxinstr server stop {run_dir}` first")
        if old is not None and old.alive() and (_environ(old.pid) or {}).get(config.RUN_DIR) == str(run_dir):
            # started for this directory, but by a maxinstr that recorded nothing to verify it by
            raise MaxinstrError(f"{run_dir}: a server started here (pid {old.pid}) may still be running and cannot be "
                                "verified (server.json from an older maxinstr): stop it yourself first")
    spec = runner.RunSpec(command=command, run_dir=run_dir)
    clear_previous_server(run_dir)
    env = runner.child_env(spec, runner.RunOptions(stage_specs=list(stage_specs or []), presets=list(presets or [])), run_dir)
    env[config.SERVER_TOKEN] = token = secrets.token_hex(16)
    session, cmd = None, list(command)
    if profiler == "nsys":
        # `nsys launch`: nothing collected until start; what to trace is set here, sampling not (nsys
        # 2025.3 refuses --sample and --cpuctxsw on launch, seen on the H200); a unique session name
        stem = re.sub(r"[^A-Za-z0-9-]+", "-", run_dir.name).strip("-")[:40] or "run"
        nsys, session = _nsys(nsys_path), f"maxinstr-{stem}-{os.getpid()}-{int(time.time())}"
        cmd = [nsys.path, "launch", f"--session-new={session}", *nsys.trace_flags_launch(), *command]
    elif profiler != "none":
        raise MaxinstrError(f"server profiling supports nsys or none, not {profiler!r} (on AMD: `maxinstr run --profiler rocprofv3` around the whole server)")
    log_path = run_dir / LOG_FILE
    try:
        log = open_write_file(log_path)
    except OSError as exc:
        raise MaxinstrError(f"{log_path}: cannot write the server log ({exc.strerror or exc})") from None
    try:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    except FileNotFoundError:
        raise MaxinstrError(f"{cmd[0]}: command not found") from None
    finally:
        log.close()
    state = ServerState(run_dir=run_dir, pid=proc.pid, pgid=proc.pid, command=list(command), launch_command=cmd,
                        profiler=profiler, session=session, nsys=nsys_path if profiler == "nsys" else None,
                        windows=[], log=str(log_path), start_ticks=process_start_ticks(proc.pid), boot_id=boot_id(),
                        token=token)
    state.save()
    _children[proc.pid] = proc  # so the child is reaped if this process lives on (tests, `server run`)
    _wait_ready(state, ready, ready_timeout_s, sv.DEFAULT_FATAL_PATTERNS if fail_fast else None)
    return state


_children: dict[int, subprocess.Popen] = {}


def clear_previous_server(run_dir: Path) -> list[str]:
    """An earlier (ended) server's run here is replaced, as `maxinstr run` does (its log would answer
    --ready first): only the names a server run writes."""
    removed = layout.clear_previous_run(run_dir)
    if not (run_dir / STATE_FILE).exists():
        return removed  # no server ran here: its files are not ours to remove
    for name in [STATE_FILE, LOG_FILE, *(p.name for p in run_dir.glob("window-*"))]:
        path = run_dir / name
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed.append(name)
    return removed


def profile_window(run_dir: Path, *, duration_s: float | None = None, bench: list[str] | None = None,
                   echo: Callable[[str], None] | None = sv.print_line, timeout_s: float | None = None,
                   say: Callable[[str], None] | None = None) -> tuple[dict, Artifact | None, sv.ChildResult | None]:
    """``nsys start``, the benchmark command (or ``duration_s`` seconds), ``nsys stop``; the report exported."""
    state = ServerState.load(run_dir)
    if not state.alive():
        raise MaxinstrError(f"{run_dir}: the server (pid {state.pid}) is not running; see {state.run_dir / LOG_FILE}")
    if (problem := verify(state)) is not None:
        raise _refuse(state, problem, "no window was captured")
    k = len(state.windows) + 1
    output = state.run_dir / f"window-{k}"
    for ext in (".nsys-rep", ".sqlite", ".qdstrm", ".bench.log"):
        planted = state.run_dir / f"window-{k}{ext}"
        if planted.is_symlink():  # nsys and the benchmark's log would write through it
            raise MaxinstrError(f"{planted}: {LINK_REFUSED}: remove it; no window was captured")
    nsys = _nsys_now(state, say) if state.profiler == "nsys" else _nsys(None)
    if state.profiler == "nsys":
        # this window's report, no CPU sampling or context switches (without them a tiny script wrote
        # a 2 GB .qdstrm); the session may not be registered yet right after launch: retried briefly
        for attempt in range(5):
            try:
                _check([nsys.path, "start", f"--session={state.session}", *nsys.sampling_flags(),
                        "--force-overwrite=true", f"--output={output}"])
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
            _check([nsys.path, "stop", f"--session={state.session}"])
    window: dict[str, Any] = {"index": k, "started_unix_s": started, "wall_s": round(time.time() - started, 3),
                              "host_start_ns": started_ns, "host_end_ns": time.monotonic_ns(), "bench": bench,
                              "bench_status": bench_result.status if bench_result else None}
    artifact = nsys.collect(output) if state.profiler == "nsys" else None
    if artifact is not None:
        window["artifact"] = artifact.to_json()
    state.windows.append(window)
    state.save()
    return window, artifact, bench_result


def stop_server(run_dir: Path, grace_s: float = 20.0, say: Callable[[str], None] | None = None) -> ServerState:
    """End the server: ``nsys shutdown`` on its session, then the recorded process group."""
    state = ServerState.load(run_dir)
    if not state.alive():
        _reap(state.pid)
        return state  # nothing left to stop
    if (problem := verify(state)) is not None:
        raise _refuse(state, problem, "nothing was signalled")
    nsys = None
    if state.profiler == "nsys":
        try:
            nsys = _nsys_now(state, say)
        except MaxinstrError as exc:
            if say is not None:
                say(f"maxinstr: {exc}; stopping the server's process group instead")
    if nsys is not None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run([nsys.path, "shutdown", f"--session={state.session}"], capture_output=True, timeout=60,
                           stdin=subprocess.DEVNULL)
    else:
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
    if (proc := _children.get(pid)) is not None and proc.poll() is not None:
        _children.pop(pid, None)


def _check(cmd: list[str]) -> None:
    if (problem := run_tool(cmd, 120, words=3)) is not None:
        raise MaxinstrError(problem)
