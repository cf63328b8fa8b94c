"""Trace readers: vendor profiler output into the columnar model of :mod:`maxinstr.traces.model`."""
