"""The native column module (``maxinstr._columns``: the SQLite scan, group statistics, joins) and
its functions, looked up once for the readers and the analysis alike; every caller keeps a numpy
path for when it is not built."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from maxinstr import config


def native_module() -> Any | None:
    """The native module, or None when it is not built or the system SQLite cannot be loaded."""
    if config.no_native_columns():
        return None
    try:
        from maxinstr import _columns
    except ImportError:
        return None
    try:
        if not _columns.available():
            return None
    except Exception:  # noqa: BLE001 - a broken build must not stop the Python path
        return None
    return _columns


FUNCTIONS: dict[str, Callable[..., Any] | None] = {}
"""Looked-up functions by name (None: not in this build); tests set an entry to None to run the
numpy path."""


def function(name: str) -> Callable[..., Any] | None:
    """``maxinstr._columns.<name>`` when the native module is built and has it, else None."""
    if name not in FUNCTIONS:
        FUNCTIONS[name] = getattr(native_module(), name, None)
    return FUNCTIONS[name]
