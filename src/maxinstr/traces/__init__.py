"""Trace readers: vendor profiler output into the columnar model of :mod:`maxinstr.traces.model`."""

from maxinstr.traces.open import open_trace

__all__ = ["open_trace"]
