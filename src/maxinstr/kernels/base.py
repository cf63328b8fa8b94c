"""The kernel-collector interface: what ``session(..., kernels=True)`` talks to.

A collector gathers GPU activity (kernels, copies, sets, the API calls that launched them, and
which stage each call was made in) inside the process and hands rows to an
:class:`~maxinstr.rundir.activity.ActivityWriter`. Vendors live behind it: :mod:`.cupti` on
NVIDIA; :class:`NullCollector` everywhere else (it records nothing and says why).
"""

from __future__ import annotations

from typing import Any, Protocol


class KernelsUnavailable(Exception):
    """In-process kernel collection cannot run here; ``str(exc)`` says why in one line."""


class Collector(Protocol):
    """What a session attaches to its part: started when the part opens, flushed at each round
    of its flusher, stopped at close. The kernel collectors implement it, and so does the GPU
    sampler (:class:`maxinstr.sample.SessionSampler`)."""

    name: str

    def start(self) -> None:
        """Begin collecting (raise with the reason when it cannot)."""

    def flush(self, final: bool = False) -> None:
        """Write what was delivered so far (called by the session's flusher thread; ``final``:
        force out everything, at session close)."""

    def stop(self) -> dict[str, Any]:
        """Stop collecting, write the rest; returns counters (activity.json for kernels)."""


class KernelCollector(Collector, Protocol):
    """A vendor's in-process kernel collector: :meth:`start` raises :class:`KernelsUnavailable`
    with the reason when it cannot run."""


class NullCollector:
    """Collects nothing; keeps the reason so the session and the report can say it."""

    name = "none"

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def start(self) -> None:
        return None

    def flush(self, final: bool = False) -> None:
        return None

    def stop(self) -> dict[str, Any]:
        return {"rows": 0}
