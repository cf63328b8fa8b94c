"""Stage attrs are data, not references (docs/sessions.md, "Attrs"): the native core hands attrs holding
anything but ``str``/``int``/``float``/``bool``/``None`` to :func:`plain`, which returns the JSON data they
are written as (no object kept alive); it never raises. A base module: in ``maxinstr.rundir`` it would
make ``import maxinstr.record`` load the run reader and numpy as well.
"""

from __future__ import annotations

import numbers
from typing import Any

MAX_DEPTH = 32  # deeper containers (and cycles) are recorded as their str()
MAX_STR = 1000  # characters kept of the str() of an object JSON cannot hold
_MAX_INT_BITS = 13_000  # json.dumps refuses ints of more than 4300 digits (sys.int_info)


def _as_str(value: Any) -> str:
    try:
        text = str(value)
    except Exception as exc:  # noqa: BLE001 - a user's __str__ may raise anything
        return f"<{type(value).__name__}: str() raised {type(exc).__name__}>"
    if not isinstance(text, str):  # a str subclass is fine; anything else is not text
        return f"<{type(value).__name__}>"
    return text if len(text) <= MAX_STR else text[: MAX_STR - 1] + "…"


def _key(key: Any) -> str:
    # json.dumps's own spelling of None/bool/number keys, and str() (not its TypeError) for the rest
    if type(key) is str:
        return key
    if key is None or isinstance(key, bool):
        return {None: "null", True: "true", False: "false"}[key]
    value = _plain(key, 0)
    return value if isinstance(value, str) else repr(value)


def _plain(value: Any, depth: int) -> Any:
    # exact built-in types first: the ABC checks below cost ~0.3 us each, per element of a list
    t = type(value)
    if t is str or t is float or t is bool or value is None:
        return value
    if t is int:
        return value if value.bit_length() <= _MAX_INT_BITS else f"<int of {value.bit_length()} bits>"
    if t.__module__ == "numpy" and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        try:
            value = value.item()  # a numpy scalar as the Python number (or bool, str) it holds
        except Exception:  # noqa: BLE001 - an odd subclass: the general path below
            pass
        else:
            return _plain(value, depth)
    if isinstance(value, str):
        return value if type(value) is str else str.__str__(value)  # a subclass's __str__ is not called
    if isinstance(value, numbers.Integral):
        try:
            number = int(value)
        except Exception:  # noqa: BLE001
            return _as_str(value)
        return number if number.bit_length() <= _MAX_INT_BITS else f"<int of {number.bit_length()} bits>"
    if isinstance(value, numbers.Real):
        try:
            return float(value)
        except Exception:  # noqa: BLE001
            return _as_str(value)
    if depth <= 0:
        return _as_str(value)
    if isinstance(value, dict):
        try:
            items = list(value.items())
        except Exception:  # noqa: BLE001
            return _as_str(value)
        return {_key(k): _plain(v, depth - 1) for k, v in items}
    return [_plain(v, depth - 1) for v in list(value)] if isinstance(value, (list, tuple)) else _as_str(value)


def plain(attrs: dict[str, Any]) -> dict[str, Any]:
    """``attrs`` as the JSON data they are written as (a new dict; keyword names are str)."""
    out: dict[str, Any] = {}
    for key, value in list(attrs.items()):
        try:
            out[_key(key)] = _plain(value, MAX_DEPTH)
        except RecursionError:
            out[_key(key)] = _as_str(value)
    return out
