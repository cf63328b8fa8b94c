"""Steady state of a run, as it runs (docs/sessions.md "Warm-up and steady state").

Warm-up is decided by the rule of :mod:`maxinstr.warmup`, which the report applies afterwards. A
root session needs one instant of it while the program runs: where steady state can begin
(:func:`~maxinstr.warmup.steady_can_begin`), to start the profiler's capture there under
``maxinstr run --capture steady``. The native core fires it in the stage's own enter
(``steady_watch``), before its marker range or GPU event, so the capture holds every instance the
report can call steady (a flusher that polled for it started a capture tens of ms late, after 12
decode steps of 0.4 ms had all run). meta.json ``steady_state`` records when it fired.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any


class SteadyState:
    """The steady-state trigger of one root session. ``meta``: the session's meta.json dict (None where
    this process writes none: nothing noted, no capture started); ``core()``: the native core."""

    def __init__(self, warmup: int, *, core: Callable[[], Any], clock_ns: Callable[[], int], names: Callable[[], dict[int, str]],
                 write_meta: Callable[[], None], event: Callable[..., None]) -> None:
        self.warmup = warmup
        self.deferred = False  # `maxinstr run` without --warmup: not known until the script's session says
        self.pending = False  # armed, steady state not reached yet
        self.capture: str | None = None  # MAXINSTR_CAPTURE's value when this session starts the capture
        self.capture_started = False
        self.meta: dict[str, Any] | None = None
        self._core = core
        self._clock_ns = clock_ns
        self._names = names
        self._write_meta = write_meta
        self._event = event

    def arm(self, meta: dict[str, Any] | None, *, capture: str | None) -> None:
        """Start watching for steady state (again). A deferred warm-up (the script's session
        has not said its own yet) watches for the first top-level stage: a program that opens no
        session has warm-up 0, and a capture started early holds more, never less."""
        self.meta = meta
        self.capture = capture
        self.pending = True
        if self.warmup == 0 and not self.deferred:
            self.enter(None, self._clock_ns())
        else:
            self._watch(0 if self.deferred else self.warmup)

    def set_warmup(self, warmup: int) -> None:
        """The script's own session said its warm-up (``maxinstr run`` without ``--warmup``)."""
        self.warmup = warmup
        self.deferred = False
        if self.pending:
            self.arm(self.meta, capture=self.capture)

    def disarm(self) -> None:
        """At close: the core stops watching (the trigger holds a reference to this session)."""
        if self.pending:
            with contextlib.suppress(Exception):  # no core: nothing was watching
                self._core().steady_watch(-1, None)
        self.pending = False

    def _watch(self, n: int) -> None:
        try:
            self._core().steady_watch(int(n), self._fired)
        except Exception as exc:  # noqa: BLE001 - a core without the trigger: no steady-state capture
            self._event("warning", f"steady-state trigger unavailable: {type(exc).__name__}: {exc}")

    def _fired(self, name_id: int, at_ns: int) -> None:
        """The core's trigger: called on the program's thread as the stage enters."""
        self.enter(int(name_id), int(at_ns))

    def enter(self, name_id: int | None, at_ns: int) -> None:
        """Steady state can begin at ``at_ns`` (the start of a stage named ``name_id``)."""
        if not self.pending:
            return
        self.pending = False
        if self.meta is None:
            return
        self.meta["steady_state"] = {"name": None if name_id is None else self._name(name_id), "start_ns": at_ns,
                                     "detected_ns": self._clock_ns()}
        if self.capture is not None and not self.capture_started:
            ok = False
            try:
                ok = bool(self._core().profiler_start())
            except Exception as exc:  # noqa: BLE001
                self._event("warning", f"profiler_start failed: {type(exc).__name__}: {exc}")
            self.capture_started = ok
            self.meta["capture"] = {"requested": self.capture, "start_ns": self._clock_ns(), "started": ok}
        self._write_meta()

    def _name(self, name_id: int) -> str | None:
        name = self._names().get(name_id)
        if name is None:  # interned since the last drain: the core has it
            try:
                name = dict(self._core().names()).get(name_id)
            except Exception:  # noqa: BLE001
                name = None
        return name

    def stop_capture(self) -> None:
        """At close: stop the capture this session started (once)."""
        self.disarm()
        if not self.capture_started:
            return
        with contextlib.suppress(Exception):  # the profiler is gone or refused: the run closes regardless
            self._core().profiler_stop()
        if self.meta is not None:
            self.meta.setdefault("capture", {})["stop_ns"] = self._clock_ns()
