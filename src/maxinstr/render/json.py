"""The report as JSON (schema ``maxinstr-report``, version 1; see docs/report.md).

Strict JSON: NaN and infinities become ``null`` and numpy scalars become plain numbers, so
any JSON reader (jq, JavaScript) takes it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    from maxinstr.analyze.schema import Report


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return _clean(obj.tolist())
    return obj


def to_jsonable(report: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``report`` holding only JSON types (NaN -> None)."""
    return _clean(report)


def render(report: Mapping[str, Any], indent: int | None = 2) -> str:
    """The report (or compare's result) as a JSON document."""
    return json.dumps(to_jsonable(report), indent=indent, allow_nan=False) + "\n"


def load(text: str, source: str = "<report>") -> Report:
    """Parse a JSON report, checking its schema and version (MaxinstrError otherwise)."""
    from maxinstr.errors import MaxinstrError

    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise MaxinstrError(f"{source}: not JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict) or doc.get("schema") != "maxinstr-report":
        raise MaxinstrError(f"{source}: not a maxinstr report (\"schema\" is not \"maxinstr-report\")")
    if doc.get("version") != 1:
        raise MaxinstrError(f"{source}: report version {doc.get('version')!r} is not supported (this maxinstr reads 1)")
    return cast("Report", doc)  # a version-1 report: its keys are read defensively (analyze/schema.py)
