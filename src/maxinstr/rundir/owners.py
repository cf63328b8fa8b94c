"""Who still writes a run directory: a session replaces the run there only when every process of
it is gone, else it joins with a part of its own (docs/sessions.md). A process is alive when its
part (or meta.json) says ``running`` and it ran on another host (unknowable from here) or its pid
exists here and did not start after the part did (a reused pid).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from maxinstr.rundir import format as fmt

_START_SLACK_NS = 2_000_000_000  # /proc gives a process's start to a clock tick, boot time to a second


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive flock on the directory itself (no lock file) while a session decides whether to
    replace the run there: two sessions opened at once decide in turn. Best effort."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _started_unix_ns(pid: int) -> int | None:
    """When process ``pid`` started (Unix ns, to a clock tick), from /proc; None when unknown."""
    try:
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, after the parenthesised name
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot * 1_000_000_000 + ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def pid_alive(pid: int, started_unix_ns: int | None = None) -> bool:
    """Whether ``pid`` names a live process on this host that could have started a part at
    ``started_unix_ns`` (Unix ns): not one that started after it (a reused pid)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    except OSError:
        return False
    if isinstance(started_unix_ns, int) and not isinstance(started_unix_ns, bool):
        began = _started_unix_ns(pid)
        if began is not None and began > started_unix_ns + _START_SLACK_NS:
            return False
    return True


def _load(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _writer(doc: dict[str, Any], pid: Any, started_unix_ns: Any, where: str) -> str | None:
    """A line naming the writer of ``doc`` when it may still be alive, else None."""
    if doc.get("status") != "running" or pid == os.getpid():
        return None
    host = doc.get("host")
    here = socket.gethostname()
    if isinstance(host, str) and host != here:
        return f"pid {pid} on host {host} ({where}; cannot tell from {here} whether it is alive)"
    if not pid_alive(pid, started_unix_ns if isinstance(started_unix_ns, int) else None):
        return None
    return f"pid {pid} ({where})"


def live_writers(run_dir: Path) -> list[str]:
    """One line per process that may still write the run in ``run_dir`` (empty: it may be replaced)."""
    found: dict[str, str] = {}  # repr(pid) -> line: the owner shows in meta.json and its part
    meta = _load(run_dir / fmt.META_FILE)
    if meta is not None and meta.get("format") == fmt.FORMAT_NAME:
        got = meta.get("clock")
        clock: dict[str, Any] = got if isinstance(got, dict) else {}
        line = _writer(meta, meta.get("pid"), clock.get("realtime_ns"), fmt.META_FILE)
        if line:
            found[repr(meta.get("pid"))] = line
    parts = run_dir / fmt.PARTS_DIR
    try:
        entries = sorted(p for p in parts.iterdir() if p.is_dir()) if parts.is_dir() else []
    except OSError:
        entries = []
    for part in entries:
        doc = _load(part / fmt.PART_FILE)
        if doc is None:
            continue
        line = _writer(doc, doc.get("pid"), doc.get("started_unix_ns"), f"part {part.name}")
        if line:
            found.setdefault(repr(doc.get("pid")), line)
    return list(found.values())
