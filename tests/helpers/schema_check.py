"""A report (or a part of one) against the schema's TypedDicts at run time: the checker lives in
maxinstr/analyze/schema_check.py (``maxinstr report REPORT.json`` uses it on saved reports).
Used by tests/analyze/test_schema.py and tests/reliability/test_ranks.py."""

from __future__ import annotations

from maxinstr.analyze.schema_check import always as _always
from maxinstr.analyze.schema_check import problems


def always(td: type) -> set[str]:
    """The keys of a schema TypedDict marked ``Always[...]``."""
    return set(_always(td))


__all__ = ["always", "problems"]
