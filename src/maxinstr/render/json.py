"""The report (or a comparison) as strict JSON (schema ``maxinstr-report`` version 1, docs/report.md):
NaN and infinities become ``null`` and numpy scalars plain numbers, so any JSON reader takes it."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from maxinstr.analyze.schema_check import load_report

if TYPE_CHECKING:
    from maxinstr.analyze.compare import CompareResult
    from maxinstr.analyze.report import Analysis
    from maxinstr.analyze.schema import Report


def _clean(obj: Any) -> Any:
    # dispatch on the exact type first: a report of 50,000 stages has millions of values, and
    # the chain of isinstance tests below was most of the time of writing its JSON
    t = type(obj)
    if t is dict:
        return {k if type(k) is str else str(k): _clean(v) for k, v in obj.items()}
    if t is list or t is tuple:
        return [_clean(v) for v in obj]
    if t is str or t is int or t is bool or obj is None:
        return obj
    if t is float:
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        return float(obj) if math.isfinite(float(obj)) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return _clean(obj.tolist())
    return obj


PRETTY_LEVELS = 2
"""Levels laid out one member a line (the report's sections, then each stage, finding, ...);
deeper values are written compactly on their member's line: Python's json module writes an
indented document in pure Python, ten times slower than its C encoder writes a compact one (a
report of 50,000 stages took 20 s and 1.2 GB as one indented document)."""

_COMPACT = json.JSONEncoder(allow_nan=False).encode  # built once: json.dumps with options builds one a call


def render(report: Mapping[str, Any], analysis: Analysis | None = None, *, width: int = 120, color: bool = False
           ) -> str:
    """The report (or compare's result) as a JSON document: its top levels indented two spaces,
    one stage (one finding, one rank, ...) a line below them."""
    out: list[str] = []
    _layout(_clean(report), 0, out)  # a copy holding only JSON types
    out.append("\n")
    return "".join(out)


def render_compare(result: CompareResult, *, width: int = 120, color: bool = False) -> str:
    return render(result)


def _layout(obj: Any, level: int, out: list[str]) -> None:
    if level >= PRETTY_LEVELS or not isinstance(obj, (dict, list)) or not obj:
        out.append(_COMPACT(obj))
        return
    inner = "\n" + "  " * (level + 1)
    out.append("{" if isinstance(obj, dict) else "[")
    items = obj.items() if isinstance(obj, dict) else ((None, v) for v in obj)
    for i, (key, value) in enumerate(items):
        out.append(("," if i else "") + inner)
        if key is not None:
            out.append(_COMPACT(key) + ": ")
        _layout(value, level + 1, out)
    out.append("\n" + "  " * level + ("}" if isinstance(obj, dict) else "]"))


def load(text: str, source: str = "<report>") -> Report:
    """Parse a JSON report, checking its schema, version and field types (MaxinstrError
    otherwise): :func:`maxinstr.analyze.schema_check.load_report`."""
    return load_report(text, source)
