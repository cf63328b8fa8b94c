"""Trace readers: vendor profiler output into the columnar model of :mod:`maxinstr.traces.model`."""

from maxinstr.traces._sqlite_columns import keep_freed_memory
from maxinstr.traces.open import open_trace

__all__ = ["keep_freed_memory", "open_trace"]
