"""The sampler in a process of its own (``MAXINSTR_SAMPLER_GIL=process``, the default): a thread
in the user's process hands the GIL over and back every tick (docs/sampler.md, "What a sample
costs"); ``python -m maxinstr.sample.process`` has its own, and writes the same files
(CLOCK_MONOTONIC is system-wide).

Protocol: the parent waits (``ready_timeout_s``) for one JSON line on the child's original
stdout, ``{"unavailable": ..., "devices": [...]}``; the child's other output goes to
``sampler-stderr.txt`` (kept when not empty). ``stop()`` writes ``stop`` and closes the child's
stdin; the child writes its final samples.json and exits, as it does when the parent dies.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from maxinstr import config
from maxinstr._files import open_write_file, real_dirs
from maxinstr.sample.base import DeviceInfo, ErrorLog
from maxinstr.sample.writer import Sampler, clock_ns, open_backend

STDERR_FILE = "sampler-stderr.txt"


class ProcessSampler:
    """A sampler in a child process, with :class:`~maxinstr.sample.writer.Sampler`'s surface. Never raises."""

    def __init__(self, part_dir: Path, interval_s: float, *, pids: list[int], devices: Collection[int] | None,
                 flush_interval_s: float, env: dict[str, str] | None = None, ready_timeout_s: float = 20.0,
                 extra: dict[str, Any] | None = None) -> None:
        self.part_dir = Path(part_dir)
        self.interval_s = interval_s
        self.pids = pids
        self.only = None if devices is None else sorted(int(i) for i in devices)
        self.flush_interval_s = flush_interval_s
        self.env = env
        self.ready_timeout_s = ready_timeout_s
        self.extra = dict(extra or {})
        self.devices: list[SimpleNamespace] = []  # what the parent knows of the child's devices: .info
        self.unavailable = self.failure = ""
        self.notes: list[str] = []
        self._proc: subprocess.Popen | None = None
        self._stderr: Any = None
        self._stopped = False
        self._pid = os.getpid()

    def start(self) -> bool:
        """Start the child and wait until it samples (or says why not); False (``failure``: why)
        when it did not come up, nothing left running."""
        try:
            real_dirs(self.part_dir.parent, self.part_dir)
            cmd = [sys.executable, "-m", "maxinstr.sample.process", str(self.part_dir), repr(self.interval_s),
                   ",".join(str(p) for p in self.pids), "" if self.only is None else ",".join(map(str, self.only)),
                   repr(self.flush_interval_s), str(os.getpid()), json.dumps(self.extra, default=str)]
            env = dict(os.environ if self.env is None else self.env)
            env[config.SAMPLER_GIL] = "auto"  # in its own process, holding the GIL stops nobody
            src = str(Path(__file__).resolve().parents[2])  # the package the parent imported
            env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            self._stderr = open_write_file(self.part_dir / STDERR_FILE, append=False)
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                          env=env, close_fds=True, start_new_session=True)
            line = self._ready_line()
            if line is None:
                return self._give_up(self.failure or "no answer")
            doc = json.loads(line)
            self.unavailable = doc.get("unavailable") or ""
            self.devices = [SimpleNamespace(info=DeviceInfo(**d)) for d in doc.get("devices", [])]
            self.notes = list(doc.get("notes", []))
            atexit.register(self.stop)
            return True
        except Exception as exc:  # noqa: BLE001 - the caller falls back to an in-process sampler
            return self._give_up(f"{type(exc).__name__}: {exc}")

    def _ready_line(self) -> str | None:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + self.ready_timeout_s
        buf = b""
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.failure = f"no answer within {self.ready_timeout_s:g} s"
                return None
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                code = self._proc.wait()
                self.failure = f"the sampler process exited with status {code}{self._stderr_tail()}"
                return None
            buf += chunk
        return buf.split(b"\n", 1)[0].decode()

    def _stderr_tail(self) -> str:
        try:
            text = (self.part_dir / STDERR_FILE).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return f": {text[-1][:300]}" if text else ""

    def _give_up(self, why: str) -> bool:
        self.failure = why
        self._stopped = True
        if self._proc is not None:
            with contextlib.suppress(Exception):
                self._proc.kill()
                self._proc.wait(timeout=5)
        self._close_stderr()
        return False

    def _close_stderr(self) -> None:
        if self._stderr is not None:
            with contextlib.suppress(OSError):
                self._stderr.close()
                path = self.part_dir / STDERR_FILE
                if path.lstat().st_size == 0 and not path.is_symlink():
                    path.unlink()
            self._stderr = None

    @property
    def running(self) -> bool:
        return self._proc is not None and not self._stopped and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def stop(self) -> None:
        """Ask the child to stop and wait for it (killed after 10 s). Never raises; a forked copy does nothing."""
        if self._stopped or os.getpid() != self._pid:
            return
        self._stopped = True
        proc = self._proc
        try:
            atexit.unregister(self.stop)
            if proc is not None:
                with contextlib.suppress(OSError):  # the child is gone already
                    assert proc.stdin is not None
                    proc.stdin.write(b"stop\n")
                    proc.stdin.close()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
                if proc.stdout is not None:
                    proc.stdout.close()
        except Exception:  # noqa: BLE001 - never raise at stop
            pass
        finally:
            self._close_stderr()


def main(argv: list[str] | None = None) -> int:
    """The child: sample until told to stop or the parent's pipe closes."""
    args = sys.argv[1:] if argv is None else argv
    part, interval, pids, devices, flush, parent, extra_json = args
    # the parent reads one line from our stdout: keep it for that, send everything else to stderr
    ready = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    errors, pid_list = ErrorLog(clock_ns), [int(p) for p in pids.split(",") if p]
    backend, unavailable = open_backend(errors, interval_s=float(interval), pids=pid_list)
    s = Sampler(Path(part), float(interval), backend, unavailable=unavailable, errors=errors, pids=pid_list,
                extra={**json.loads(extra_json), "process": {"sampler_pid": os.getpid(), "parent_pid": int(parent)}},
                flush_interval_s=float(flush), only=[int(d) for d in devices.split(",") if d] if devices else None).start()
    ready.write(json.dumps({"unavailable": s.unavailable, "devices": [d.info.to_json() for d in s.devices],
                            "notes": s.notes}) + "\n")
    ready.flush()
    with contextlib.suppress(OSError, KeyboardInterrupt):
        sys.stdin.buffer.readline()  # "stop", or b"" when the parent is gone
    s.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
