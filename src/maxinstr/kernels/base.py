"""The collector interface: what a session attaches to its part (the kernel collectors, which write
through an :class:`~maxinstr.rundir.activity.ActivityWriter`, and :class:`maxinstr.sample.SessionSampler`)."""

from __future__ import annotations

from typing import Any, Protocol


class KernelsUnavailable(Exception):
    """In-process kernel collection cannot run here; ``str(exc)`` says why in one line."""


class Collector(Protocol):
    """Started when the part opens (raises the reason when it cannot), flushed at each round of the
    session's flusher (``final``: at close), stopped at close (returns its counters)."""

    name: str

    def start(self) -> None: ...

    def flush(self, final: bool = False) -> None: ...

    def stop(self) -> dict[str, Any]: ...


class NullCollector:
    """Collects nothing; keeps the reason so the session and the report can say it."""

    name = "none"

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def start(self) -> None:
        pass

    def flush(self, final: bool = False) -> None:
        pass

    def stop(self) -> dict[str, Any]:
        return {"rows": 0}
