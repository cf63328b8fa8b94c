"""Reading a file named by a run directory or a user: only regular files, only their size.

A FIFO blocks ``open()``/``read()`` forever and a link to ``/dev/zero`` never ends, so a
reader that opens whatever it finds can hang or grow without bound. :func:`read_regular` opens
without blocking, refuses anything that is not a regular file, and reads at most the size the
file had when opened (a file still being appended to reads as a consistent prefix).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

MakeError = Callable[[Path, str], Exception]

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))

MAX_JSON_DEPTH = 64  # maxinstr writes at most ~40 levels (user metadata is cut at 32)


def read_regular(path: Path, error: MakeError) -> bytes | None:
    """The bytes of the regular file ``path``; None when nothing is there. Anything else (a
    FIFO, a device, a directory, a dangling or looping link, an unreadable file) raises
    ``error(path, problem)``."""
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
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
            raise error(path, f"not a regular file ({kind})")
        chunks = []
        left = st.st_size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise error(path, f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _depth(obj: Any, limit: int) -> bool:
    """Whether ``obj`` nests no deeper than ``limit`` (iteratively: no recursion to blow)."""
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


def parse_json(data: bytes, path: Path, error: MakeError, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """JSON from ``data``; any way it is not (bad syntax, bad UTF-8, nested past ``max_depth``
    or past the interpreter's recursion limit, a number too long to convert) raises
    ``error(path, problem)``."""
    try:
        doc = json.loads(data)
    except RecursionError:
        raise error(path, "not valid JSON (nested too deeply)") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, int digits limit
        text = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise error(path, f"not valid JSON ({text})") from None
    if not _depth(doc, max_depth):
        raise error(path, f"nested deeper than {max_depth} levels: not a file maxinstr wrote")
    return doc
