"""Reading a file named by a run directory or a user: regular files only (a FIFO blocks forever), the size it
had when opened (a link to ``/dev/zero`` never ends); writing in a run directory, never through a link."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

MakeError = Callable[[Path, str], Exception]

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))

MAX_JSON_DEPTH = 64  # maxinstr writes at most ~40 levels (user metadata is cut at 32)


def open_regular(path: Path, error: MakeError) -> tuple[int, int] | None:
    """``(fd, size)`` of the regular file ``path`` opened for reading (the caller closes fd); None when nothing
    is there; anything else (a FIFO, a device, a dangling link...) raises ``error(path, problem)``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if os.path.lexists(path):
            raise error(path, "cannot read: a symbolic link to nothing") from None
        return None
    except OSError as exc:
        raise error(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(path, f"not a regular file ({_kind(st.st_mode)})")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_at(fd: int, offset: int, size: int) -> bytes:  # (fewer bytes only at the end of the file)
    chunks = []
    while size > 0:
        if not (chunk := os.pread(fd, min(size, 1 << 24), offset)):
            break
        chunks.append(chunk)
        offset, size = offset + len(chunk), size - len(chunk)
    return b"".join(chunks)


def data_extents(fd: int, size: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` byte ranges of ``fd`` holding data, not holes (the whole file where unknown)."""
    extents: list[tuple[int, int]] = []
    pos = 0
    try:
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # no data past pos: a hole to the end
                    break
                raise
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
            if end <= start:
                break
            extents.append((start, end))
            pos = end
    except (OSError, AttributeError):  # no SEEK_DATA here
        return [(0, size)] if size else []
    return extents


def read_regular(path: Path, error: MakeError) -> bytes | None:
    """The bytes of the regular file ``path`` (None: nothing there), or as :func:`open_regular` raises."""
    if (opened := open_regular(path, error)) is None:
        return None
    fd, size = opened
    try:
        return read_at(fd, 0, size)
    except OSError as exc:
        raise error(path, f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _depth(obj: Any, limit: int) -> bool:  # nests no deeper than limit (iteratively: no recursion to blow)
    stack = [(obj, 0)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            if d >= limit:
                return False
            stack.extend((v, d + 1) for v in node)
    return True


def json_problem(exc: ValueError, data: bytes | bytearray) -> str:
    """What ``json.loads(data)`` refused, in a few words: its message, but for a number too long to convert
    where it is, not Python's advice (sys.set_int_max_str_digits) cut mid-word."""
    if "max_str_digits" not in str(exc):
        return str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
    limit = sys.get_int_max_str_digits()
    found = re.search(rb"(?:^|(?<=[\s\[,:]))-?\d{%d,}" % (limit + 1), data)
    line = data.count(b"\n", 0, found.start()) + 1 if found else None
    return f"a number of more than {limit} digits" + (f" at line {line}" if line else "")


def parse_json(data: bytes, path: Path, error: MakeError, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """JSON from ``data``; bad syntax or UTF-8, nesting past ``max_depth``, a number too long: ``error(...)``."""
    try:
        doc = json.loads(data)
    except RecursionError:
        raise error(path, "not valid JSON (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int digits limit
        raise error(path, f"not valid JSON ({json_problem(exc, data)})") from None
    if not _depth(doc, max_depth):
        raise error(path, f"nested deeper than {max_depth} levels: not a file maxinstr wrote")
    return doc


# A run directory may be handed to us (copied, unpacked, shared): a link planted in it (parts/p123/stages.bin
# -> ~/.bashrc) must not turn maxinstr's writes into writes to its target. Files are opened O_NOFOLLOW, and
# every folder below the run directory checked to be a real folder.

LINK_REFUSED = "a symbolic link inside a run directory (maxinstr never writes through one)"


def _refuse_link(path: str | os.PathLike[str]) -> OSError:
    return OSError(errno.ELOOP, LINK_REFUSED, os.fspath(path))


def real_dirs(root: str | os.PathLike[str], below: str | os.PathLike[str]) -> Path:
    """Make the folder ``below`` (inside ``root``) and its missing parents, each a real folder (a link or a
    file in the way: OSError naming it). Returns it."""
    root_p, target = Path(root), Path(below)
    try:
        rel = target.relative_to(root_p).parts
    except ValueError:  # not below root: only the last component is ours to check
        chain = [target]
    else:
        chain = [root_p.joinpath(*rel[: i + 1]) for i in range(len(rel))]
        root_p.mkdir(parents=True, exist_ok=True)
    for folder in chain:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o755)
        st = os.lstat(folder)
        if stat.S_ISLNK(st.st_mode):
            raise _refuse_link(folder)
        if not stat.S_ISDIR(st.st_mode):
            raise OSError(errno.ENOTDIR, "not a directory", os.fspath(folder))
    return target


def open_write(path: str | os.PathLike[str], *, append: bool = True, exclusive: bool = False, mode: int = 0o644) -> int:
    """A file descriptor to write ``path``: O_NOFOLLOW (a link there: OSError naming it), a regular file only
    (a FIFO would block), appended to or truncated; ``exclusive``: it must not exist yet."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags | (os.O_APPEND if append else 0) | (os.O_EXCL if exclusive else 0), mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK) or (exc.errno == errno.EEXIST and os.path.islink(path)):
            raise _refuse_link(path) from None
        if exc.errno == errno.ENXIO:  # a FIFO with no reader
            raise OSError(errno.ENXIO, "not a regular file (a FIFO)", os.fspath(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"not a regular file ({_kind(st.st_mode)})", os.fspath(path))
        if not append and st.st_size:
            os.ftruncate(fd, 0)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_write_file(path: str | os.PathLike[str], text: bool = False, *, append: bool = True,
                    exclusive: bool = False) -> Any:
    """:func:`open_write` as a Python file object (binary, or UTF-8 text with ``text``)."""
    fd = open_write(path, append=append, exclusive=exclusive)
    return os.fdopen(fd, "a" if append else "w", encoding="utf-8") if text else os.fdopen(fd, "ab" if append else "wb")


def replace_atomic(path: str | os.PathLike[str], data: bytes, *, fsync: bool = False) -> None:
    """Write ``data`` to ``path`` through a new temporary file beside it and a rename: a reader sees the old
    file or the new; a link at ``path`` is replaced, never followed."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = open_write(tmp, append=False, exclusive=True)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
