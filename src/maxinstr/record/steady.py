"""Warm-up and steady state of a run (docs/sessions.md "Warm-up and steady state").

A root session counts its completed top-level stages per name: once some name has completed
``warmup`` times, steady state begins (its next instance is the first steady one). meta.json
``steady_state`` says when; under ``maxinstr run --capture ...`` (``MAXINSTR_CAPTURE``) that is
when the profiler's capture range starts (once; :meth:`SteadyState.stop_capture` at close).

Two counters, one rule: with the Python writer the flusher's drains hand the rows here
(:meth:`SteadyState.observe_rows`); with the native writer its thread counts as it writes
(``writer_watch``) and the flusher hands its status here (:meth:`SteadyState.observe_writer`).
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

import numpy as np

from maxinstr.rundir import format as fmt

CAPTURE_FLUSH_INTERVAL_S = 0.01  # while a capture waits for steady state: start it close to the warm-up's end


class SteadyState:
    """The warm-up bookkeeping of one root session.

    ``meta`` is the session's meta.json dict (None where this process does not write one: then
    nothing is noted, and no capture starts); ``write_meta`` writes it; ``event`` notes a
    problem in the run's events; ``names`` maps name ids to names; ``core()`` returns the native core
    (``profiler_start``/``profiler_stop``); ``clock_ns`` the host clock."""

    def __init__(self, warmup: int, *, core: Callable[[], Any], clock_ns: Callable[[], int], names: Callable[[], dict[int, str]],
                 write_meta: Callable[[], None], event: Callable[..., None]) -> None:
        self.warmup = warmup
        self.deferred = False  # `maxinstr run` without --warmup: not known until the script's session says
        self.pending = False  # armed, steady state not reached yet
        self.capture: str | None = None  # MAXINSTR_CAPTURE's value when this session starts the capture
        self.capture_started = False
        self.meta: dict[str, Any] | None = None
        self._top_counts: dict[int, int] = {}
        self._core = core
        self._clock_ns = clock_ns
        self._names = names
        self._write_meta = write_meta
        self._event = event

    @property
    def wants_fast_flush(self) -> bool:
        """A capture waits for steady state: the flusher runs every CAPTURE_FLUSH_INTERVAL_S."""
        return self.pending and self.capture is not None

    def arm(self, meta: dict[str, Any] | None, *, capture: str | None, watch: Callable[[int], None]) -> None:
        """Start counting (again). ``watch(warmup)`` hands the count to the native writer, when it runs."""
        self.meta = meta
        self.capture = capture
        self.pending = True
        self._top_counts.clear()
        if self.warmup == 0 and not self.deferred:
            self.enter(None, self._clock_ns())
        elif not self.deferred:
            watch(self.warmup)

    def set_warmup(self, warmup: int, *, watch: Callable[[int], None]) -> None:
        """The script's own session said its warm-up (``maxinstr run`` without ``--warmup``)."""
        self.warmup = warmup
        self.deferred = False
        self.arm(self.meta, capture=self.capture, watch=watch)

    def _first_records_without_warmup(self) -> bool:
        """Records arrived before the script's session said its warm-up: warm-up 0 from the
        session's start (True: steady state entered)."""
        self.deferred = False
        if self.warmup == 0:
            start = (self.meta or {}).get("session", {}).get("start_ns") or self._clock_ns()
            self.enter(None, int(start))
            return True
        return False

    def observe_rows(self, rows: np.ndarray) -> None:
        """Completed records drained by the Python path."""
        if not self.pending or len(rows) == 0:
            return
        if self.deferred and self._first_records_without_warmup():
            return
        top = rows[(rows["depth"] == 0) & ((rows["flags"] & fmt.MARK) == 0)]
        if len(top) == 0:
            return
        top = top[np.argsort(top["host_end_ns"], kind="stable")]
        ids, counts = np.unique(top["name_id"], return_counts=True)
        for name_id, count in zip(ids.tolist(), counts.tolist()):
            before = self._top_counts.get(name_id, 0)
            self._top_counts[name_id] = before + count
            if before + count >= self.warmup:
                # the warmup-th instance of this name ends the warm-up
                nth = top["host_end_ns"][top["name_id"] == name_id][self.warmup - before - 1]
                self.enter(name_id, int(nth))
                return

    def observe_writer(self, status: dict[str, Any], *, watch: Callable[[int], None]) -> None:
        """The native writer's status: ``taken`` records so far, ``steady`` (name id, ns) once
        its count ended the warm-up."""
        if not self.pending:
            return
        steady = status.get("steady")
        if self.deferred and int(status.get("taken", 0) or 0) > 0:
            if not self._first_records_without_warmup():
                watch(self.warmup)
        elif steady is not None:
            self.enter(int(steady[0]), int(steady[1]))

    def enter(self, name_id: int | None, at_ns: int) -> None:
        """Steady state began at ``at_ns`` (after the warm-up's last instance of ``name_id``)."""
        self.pending = False
        if self.meta is None:
            return
        self.meta["steady_state"] = {
            "name": None if name_id is None else self._names().get(name_id),
            "start_ns": at_ns,
            "detected_ns": self._clock_ns(),
        }
        if self.capture is not None and not self.capture_started:
            ok = False
            try:
                ok = bool(self._core().profiler_start())
            except Exception as exc:  # noqa: BLE001
                self._event("warning", f"profiler_start failed: {type(exc).__name__}: {exc}")
            self.capture_started = ok
            self.meta["capture"] = {"requested": self.capture, "start_ns": self._clock_ns(), "started": ok}
        self._write_meta()

    def stop_capture(self) -> None:
        """At close: stop the capture this session started (once)."""
        if not self.capture_started:
            return
        try:
            self._core().profiler_stop()
        except Exception:  # noqa: BLE001 - the profiler is gone or refused: the run closes regardless
            pass
        if self.meta is not None:
            self.meta.setdefault("capture", {})["stop_ns"] = self._clock_ns()
