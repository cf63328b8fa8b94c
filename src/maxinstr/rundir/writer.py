"""Append-only writer of one part of a run directory (docs/formats.md).

Crash safety comes from the order and shape of the writes, not fsync: each batch is whole lines
and whole rows, one ``write`` per ``O_APPEND`` file (then only a machine crash can lose it);
names and attrs go before the rows that use them; a short write (disk full) is cut back to the
last whole record. Disk errors never reach the program: the writer warns once
(:class:`RunDirWarning`), stops writing, and counts what it had to drop.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import socket
import stat
import threading
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from maxinstr._attrs import plain
from maxinstr._files import open_write, real_dirs
from maxinstr._threads import start_thread
from maxinstr.rundir import format as fmt


class RunDirWarning(RuntimeWarning):
    """Recording to the run directory failed; the program keeps running without it."""


def json_line(obj: Any) -> bytes:
    """One compact JSON line (non-JSON values become their ``str``; a lone surrogate, from
    ``os.fsdecode``, its JSON escape ``\\udcff``, which reads back as the same string)."""
    return (json.dumps(obj, separators=(",", ":"), default=str, ensure_ascii=False) + "\n").encode(
        "utf-8", "backslashreplace")


def attrs_line(record_id: int, attrs: dict[str, Any]) -> bytes:
    """The attrs.jsonl line of one record, whatever its attrs hold (:func:`maxinstr._attrs.plain`
    when JSON refuses a value, such as an int of more than 4300 digits)."""
    try:
        return json_line({"id": record_id, "attrs": attrs})
    except Exception:  # noqa: BLE001 - the record's row must not be lost to one value
        return json_line({"id": record_id, "attrs": plain(attrs)})


def attrs_lines(pairs: list[tuple[int, dict[str, Any]]]) -> bytes:
    """The attrs.jsonl lines of ``pairs`` (record id, attrs): the core's C++ encoder for attrs of
    JSON scalars (the same bytes, ten times faster), :func:`attrs_line` for the others."""
    rest: Any = pairs
    head = b""
    with contextlib.suppress(ImportError, AttributeError):
        # looked up at each call: the session tests run against a stand-in core without it
        import maxinstr._native as _native

        head, rest = _native.attrs_lines(pairs)
    return head + b"".join(attrs_line(rid, a) for rid, a in rest) if rest else head


ATTRS_CHUNK = 65536  # attrs written per chunk, the close deadline checked between chunks

_RESERVE_BYTES = 4096
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def write_json_atomic(path: Path, obj: Any, *, exclusive: bool = False) -> bool:
    """Write ``obj`` as pretty JSON to ``path`` through a temporary file and a rename (a reader sees
    the old file or the new one). ``exclusive``: an existing file is left alone (False then). The
    file is padded past the next 4 KiB: on a full disk the last version is overwritten in place, so
    a run cut by a full disk reads as closed with its losses counted, not as killed."""
    _remove_stale_tmp(path)
    tmp = path.with_name(f".{path.name}.{_HOST}.{os.getpid()}.{threading.get_ident()}.{secrets.token_hex(4)}.tmp")
    try:
        text = json.dumps(obj, indent=2, default=str, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):  # a user value JSON refuses (a cycle, a huge int)
        text = json.dumps(plain(obj), indent=2, default=str, ensure_ascii=False)
    data = (text + "\n").encode("utf-8", "backslashreplace")  # a lone surrogate as its JSON escape
    data += b" " * (-(len(data) + _RESERVE_BYTES // 4) % _RESERVE_BYTES + _RESERVE_BYTES // 4)
    try:
        fd = open_write(tmp, append=False, exclusive=True)  # nothing planted at tmp is written through
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno in _FULL and not exclusive and _overwrite_in_place(path, data.rstrip(b" ")):
            return True
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)  # a signal mid-write (KeyboardInterrupt): no .tmp left behind
        raise
    try:
        (os.link if exclusive else os.replace)(tmp, path)  # a link fails when path exists: no clobbering
        return True
    except FileExistsError:
        if not exclusive:
            raise
        return False
    finally:
        tmp.unlink(missing_ok=True)


_HOST = hashlib.sha1(socket.gethostname().encode("utf-8", "surrogateescape")).hexdigest()[:8]


def _remove_stale_tmp(path: Path) -> None:
    """Remove the temporary files a dead process of this host left beside ``path`` when killed
    mid-write (only this host's: other hosts' pids on a shared NFS run mean nothing here)."""
    prefix = f".{path.name}.{_HOST}."
    try:
        names = [n for n in os.listdir(path.parent) if n.startswith(prefix) and n.endswith(".tmp")]
    except OSError:
        return
    for name in names:
        pid_text = name[len(prefix):].split(".", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            os.kill(int(pid_text), 0)
            continue  # alive: its write is under way
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue
        with contextlib.suppress(OSError):
            os.unlink(path.parent / name)


def _overwrite_in_place(path: Path, text: bytes) -> bool:  # padded to the file's size: no new block
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        size = st.st_size
        if not stat.S_ISREG(st.st_mode) or len(text) > size:
            return False
        os.pwrite(fd, text + b" " * (size - len(text)), 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class _AppendFile:  # one O_APPEND file that writes whole records or is cut back to the last whole one
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = open_write(path)  # O_NOFOLLOW: a planted link is refused, never written through
        self.size = os.fstat(self.fd).st_size

    def append(self, data: bytes) -> None:
        if not data:
            return
        try:
            write_all(self.fd, data)
        except OSError as exc:
            # Keep the file aligned on whole records: drop what part of this batch got out.
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.size)
            if exc.filename is None:  # the warning names the file that failed (attrs.jsonl, not the part)
                raise OSError(exc.errno, exc.strerror, str(self.path)) from None
            raise
        self.size += len(data)

    def fsync(self) -> None:
        try:
            os.fsync(self.fd)
        except OSError as exc:  # /dev/full, pipes and some FUSE mounts cannot fsync
            if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):
                raise

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


class PartWriter:
    """Writes the files of ``RUN/parts/<part>/`` for one process (the session serialises calls)."""

    def __init__(self, part_dir: Path, part_info: dict[str, Any], *, fsync_interval_s: float = 1.0) -> None:
        self.part_dir = Path(part_dir)
        self.info = dict(part_info)
        self.fsync_interval_s = fsync_interval_s
        self.failed: str | None = None  # first disk error, when writing stopped
        self.rows_written = self.rows_dropped = 0  # rows dropped: lost to a disk error
        self.attrs_dropped_disk = 0  # records whose attrs a disk error (or a refused file) lost
        self.attrs_dropped_close = 0  # records whose attrs were still unwritten at the close deadline
        # time.monotonic() past which unwritten attrs are counted, not written (Sink.begin_close)
        self.deadline: float | None = None
        # rows appended by the core's native writer thread to this part (the session polls it)
        self.native_rows_written = self.native_rows_dropped = 0
        self._files: dict[str, _AppendFile] = {}
        self._names_written: set[int] = set()
        self._names_bitmap = np.zeros(64, dtype=bool)
        self._last_fsync = time.monotonic()
        self._syncer: threading.Thread | None = None  # a background fsync (its files stay open until it ends)
        self._opened = False

    @property
    def is_open(self) -> bool:
        return self._opened

    def open(self) -> None:  # raises OSError when it cannot
        if self._opened:
            return
        # RUN/parts/<part>: real folders, never a planted link (the run directory itself is the user's)
        real_dirs(self.part_dir.parent.parent, self.part_dir)
        for name in (fmt.STRINGS_FILE, fmt.ATTRS_FILE, fmt.STAGES_FILE, fmt.EVENTS_FILE):
            self._files[name] = _AppendFile(self.part_dir / name)
        self._opened = True
        self.write_part_json(status="running")

    def open_or_warn(self) -> bool:
        if self.failed:
            return False
        try:
            self.open()
            return True
        except OSError as exc:
            self.fail(exc, "cannot create")
            return False

    def write(self, rows: np.ndarray, names: dict[int, str], attrs: Iterable[tuple[int, dict[str, Any]]] = ()) -> None:
        """Append stage ``rows``, the names they use this part lacks (``names``: every id the
        process knows), and their attrs."""
        attrs = attrs if isinstance(attrs, list) else list(attrs)
        if len(rows) == 0 and not attrs:
            return
        if self.failed or not self.open_or_warn():
            self.rows_dropped += len(rows)
            self.attrs_dropped_disk += len(attrs)
            return
        attrs_started = False
        try:
            if len(rows):
                new = self._new_name_ids(rows["name_id"])
                if new:
                    self._files[fmt.STRINGS_FILE].append(
                        b"".join(json_line({"id": i, "s": names.get(i, f"<name {i}>")}) for i in new)
                    )
                    self.mark_names_written(new)
            if attrs:
                attrs_started = True  # from here _write_attrs counts what it could not write
                self._write_attrs(attrs)
            if len(rows):
                # the drained buffer itself when it is one (no copy of a large batch)
                base = rows.base if isinstance(rows.base, bytes) and len(rows.base) == rows.nbytes else None
                self._files[fmt.STAGES_FILE].append(base if base is not None else np.ascontiguousarray(rows, dtype=fmt.STAGE_DTYPE).tobytes())
                self.rows_written += len(rows)
            if self.fsync_interval_s >= 0 and time.monotonic() - self._last_fsync >= self.fsync_interval_s:
                self._fsync_in_background()
        except OSError as exc:
            self.rows_dropped += len(rows)
            if not attrs_started:
                self.attrs_dropped_disk += len(attrs)
            self.fail(exc, "cannot write to")

    def _write_attrs(self, attrs: list[tuple[int, dict[str, Any]]]) -> None:
        """Append the attrs a chunk at a time; past :attr:`deadline` or at a disk error (raised)
        the rest are counted."""
        out = self._files[fmt.ATTRS_FILE]
        for start in range(0, len(attrs), ATTRS_CHUNK):
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self.attrs_dropped_close += len(attrs) - start
                return
            try:
                out.append(attrs_lines(attrs[start:start + ATTRS_CHUNK]))
            except OSError:
                self.attrs_dropped_disk += len(attrs) - start
                raise

    def _new_name_ids(self, ids: np.ndarray) -> list[int]:
        """Name ids in ``ids`` not yet written to this part (a bitmap test when all are known)."""
        seen = self._names_bitmap
        if len(ids) == 0:
            return []
        top = int(ids.max())
        if top < len(seen) and int(ids.min()) >= 0 and seen[ids].all():
            return []
        return [i for i in np.unique(ids).tolist() if i not in self._names_written]

    def mark_names_written(self, new: list[int]) -> None:  # here, or by the core's writer thread
        self._names_written.update(new)
        top = max(self._names_written) + 1
        if top > len(self._names_bitmap):
            grown = np.zeros(max(top, 2 * len(self._names_bitmap)), dtype=bool)
            grown[: len(self._names_bitmap)] = self._names_bitmap
            self._names_bitmap = grown
        self._names_bitmap[[i for i in new if i >= 0]] = True

    def event(self, kind: str, message: str, **fields: Any) -> None:  # one events.jsonl line, best effort
        if self.failed or not self._opened:
            return
        try:
            self._files[fmt.EVENTS_FILE].append(
                json_line({"time_ns": time.monotonic_ns(), "kind": kind, "message": message, **fields})
            )
        except OSError as exc:
            self.fail(exc, "cannot write to")

    def fsync(self) -> None:
        self._last_fsync = time.monotonic()
        for f in self._files.values():
            f.fsync()

    def _fsync_in_background(self) -> None:
        """fsync on a thread of its own, one at a time: it only narrows what a machine crash can
        lose, and the flusher must not wait for the disk (an fsync of a large file took 270 ms)."""
        if self._syncer is not None and self._syncer.is_alive():
            return
        self._last_fsync = time.monotonic()
        fds = [f.fd for f in self._files.values()]

        def run() -> None:
            for fd in fds:
                with contextlib.suppress(OSError):  # a failing disk shows in the next write, which warns
                    os.fsync(fd)

        self._syncer = start_thread(run, "maxinstr-fsync")

    def write_part_json(self, **updates: Any) -> None:
        self.info.update(updates)
        self.info["rows_written"] = self.rows_written + self.native_rows_written
        self.info["rows_dropped_disk"] = self.rows_dropped + self.native_rows_dropped
        self.info["attrs_dropped_disk"] = self.attrs_dropped_disk
        self.info["attrs_dropped_close"] = self.attrs_dropped_close
        write_json_atomic(self.part_dir / fmt.PART_FILE, self.info)

    def close(self, **updates: Any) -> None:  # the final part.json, fsync, close (best effort)
        if self._syncer is not None:
            self._syncer.join()  # it uses the descriptors closed below
            self._syncer = None
        if self._opened:
            try:
                if not self.failed:
                    self.fsync()
                # after a write error too: part.json says the part closed and what the disk took
                self.write_part_json(**updates)
            except OSError as exc:
                self.fail(exc, "cannot write to")
        self._close_files()

    def abandon(self) -> None:
        """Close the files for good, writing nothing: a fork child's copy of its parent's writer."""
        self._close_files()
        self.failed = self.failed or "abandoned in a fork child"

    def _close_files(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        self._opened = False

    def fail(self, exc: OSError, what: str) -> None:
        """Stop writing after a disk error, said once (:class:`RunDirWarning`)."""
        if self.failed:
            return
        self.failed = f"{exc.strerror or exc}"
        where = exc.filename or self.part_dir
        # not "stages are no longer saved": the native writer may still append the rows (`ulimit -f`)
        warnings.warn(
            f"maxinstr: {what} run directory {where}: {self.failed}; the program continues, and what "
            "is not written from now on is counted in part.json and said in the report",
            RunDirWarning,
            stacklevel=2,
        )
