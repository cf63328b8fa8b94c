"""The sampler's vendor interface: a :class:`Backend` opens a vendor library and hands out one
:class:`Device` per visible GPU, which fills a list of metric values (:data:`COL`; ``NaN``: not
read in this row). Vendor errors are translated where they enter (``nvml.py``, ``amdsmi.py``),
never raised into the sampler, and recorded once each in :class:`ErrorLog`.
"""

from __future__ import annotations

import contextlib
import array
import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from maxinstr.rundir.samples import FLAG_SLOW, METRICS

NAN = math.nan
COL: dict[str, int] = {m[0]: i for i, m in enumerate(METRICS)}
"""Metric name -> position in the values list a device fills."""

class ErrorLog:
    """Errors and absences met while sampling, recorded once per key (thread-safe). ``on_new``
    is called (outside the lock) after a new entry, so the writer can persist it."""

    def __init__(self, clock: Callable[[], int], on_new: Callable[[], None] | None = None) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: set[tuple] = set()
        self.entries: list[dict[str, Any]] = []
        self.on_new = on_new

    def once(self, key: tuple, kind: str, message: str, device: int | None = None, metric: str | None = None) -> bool:
        """Record ``message`` unless ``key`` was seen; True when it was new. ``device``: the visible index."""
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            self.entries.append({"t_ns": self._clock(), "kind": kind, "device": device, "metric": metric, "message": message})
        if self.on_new is not None:
            with contextlib.suppress(Exception):  # persisting an error must never raise into sampling
                self.on_new()
        return True

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.entries)

@dataclass
class DeviceInfo:
    """What a device is, written into samples.json once. Units in names."""

    vendor: str  # "nvidia", "amd", "null"
    visible_index: int  # cuda:N / hip:N
    physical_index: int  # the vendor library's enumeration index (-1 for MIG / unknown)
    name: str = ""
    uuid: str = ""
    pci_bus_id: str = ""
    mig: bool = False
    sm_clock_max_mhz: float | None = None
    mem_clock_max_mhz: float | None = None
    mem_total_bytes: float | None = None
    power_limit_w: float | None = None
    gpm: bool = False
    absent: list[str] = field(default_factory=list)  # metrics it does not support (NaN in every row)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Unavailable(Exception):
    """A vendor library cannot be used here; the message says why in one line."""


class DeviceLost(Exception):
    """Raised by a vendor device's ``read`` when the GPU is gone; the sampler stops that device."""


class Device(ABC):
    """One visible GPU. ``read`` fills ``values`` (pre-filled with NaN) and returns
    ``(flags, throttle_bits, throttle_raw)``; of vendor errors it raises only :class:`DeviceLost`."""

    info: DeviceInfo

    @abstractmethod
    def read(self, values: list[float], tick: int, now_ns: int) -> tuple[int, int, int]: ...

    def close(self) -> None:  # noqa: B027 - optional hook: per-device vendor resources (GPM sample buffers)
        pass

    def probe_stats(self) -> dict[str, Any]:  # per-metric read cost, for samples.json
        return {}


class Backend(ABC):  # a vendor library opened for sampling

    name: str = "none"

    @abstractmethod
    def devices(self) -> list[Device]: ...

    def versions(self) -> dict[str, str]:  # driver / library versions, for samples.json
        return {}

    def shutdown(self) -> None:  # noqa: B027 - optional hook: close the vendor library
        pass


class NullDevice(Device):
    """A device that reads nothing: every metric absent. Used where no GPU library exists and
    to measure the sampler's own Python cost (thread wake-up, row packing, write)."""

    def __init__(self, visible_index: int = 0) -> None:
        self.info = DeviceInfo(vendor="null", visible_index=visible_index, physical_index=-1, name="null")

    def read(self, values: list[float], tick: int, now_ns: int) -> tuple[int, int, int]:
        return 0, 0, 0


class NullBackend(Backend):
    """No vendor library: no devices (or ``n`` null devices, for cost measurements); ``reason``
    says why (samples.json, ``snapshot``)."""

    name = "none"

    def __init__(self, reason: str = "", n_devices: int = 0) -> None:
        self.reason = reason
        self._n = n_devices

    def devices(self) -> list[Device]:
        return [NullDevice(i) for i in range(self._n)]


def nan_values() -> list[float]:
    return [NAN] * len(METRICS)


def try_call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, None when the vendor call fails (static facts are optional)."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - vendor boundary: a fact this device does not give
        return None


ABSENT, LOST, RETRY = "absent", "lost", "retry"
MAX_FAILS_IN_A_ROW = 100

SLOW_CALL_NS = 50_000
"""A per-row vendor call slower than this (the median of :data:`CALIBRATION_CALLS` at start, or
:data:`OVER_IN_A_ROW` GIL-held calls in a row) is "moved": read every ``moved_every``-th row with
the GIL released. A GIL-held call stops the user's Python: on the H200 (run 1) the per-row NVML
calls took ~2.8 ms per row (docs/sampler.md)."""
CALIBRATION_CALLS = 5
OVER_IN_A_ROW = 5
_RING = 1024  # recent per-call times kept per probe, for percentiles (a power of two)
perf_ns = time.perf_counter_ns


class Probe:
    """One metric read: ``fn(values)`` fills ``columns`` (marked absent when it is dropped).
    ``released_fn``: the same read with the GIL released, used once the probe is moved off the
    per-row cadence. Every call is timed (~0.1 us) into ``samples.json`` ``cost.probes``."""

    __slots__ = ("name", "fn", "columns", "fails", "released_fn", "calls", "ns_sum", "ns_max", "ring", "over",
                 "cadence", "moved", "calibration_ns", "cpu_ns_sum", "cpu_calls")

    def __init__(self, name: str, fn: Callable[[list], None], columns: tuple[str, ...] | None = None,
                 released_fn: Callable[[list], None] | None = None) -> None:
        self.name = name
        self.fn = fn
        self.columns = (name,) if columns is None else columns
        self.released_fn = released_fn
        self.fails = self.calls = self.ns_sum = self.ns_max = self.over = self.cpu_ns_sum = self.cpu_calls = 0
        self.ring = array.array("q", bytes(8 * _RING))
        self.cadence = "fast"
        self.moved = ""
        self.calibration_ns: list[int] = []

    def record(self, dt_ns: int) -> None:
        n = self.calls
        self.ring[n & (_RING - 1)] = dt_ns
        self.calls = n + 1
        self.ns_sum += dt_ns
        if dt_ns > self.ns_max:
            self.ns_max = dt_ns

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cadence": self.cadence, "calls": self.calls}
        if self.moved:
            out["moved"] = self.moved
        if self.calibration_ns:
            out["calibration_ns"] = list(self.calibration_ns)
        if self.calls:
            recent = sorted(self.ring[: min(self.calls, _RING)])
            out["mean_ns"] = self.ns_sum / self.calls
            out["p50_ns"] = recent[len(recent) // 2]
            out["p99_ns"] = recent[min(len(recent) - 1, int(len(recent) * 0.99))]
            out["max_ns"] = self.ns_max
        if self.cpu_calls:
            out["thread_cpu_mean_ns"] = self.cpu_ns_sum / self.cpu_calls
        return out


class ProbeDevice(Device):
    """A device read by tuples of probes (fast: every row; slow: every ``slow_every``-th row;
    moved: fast probes measured slow, every ``moved_every``-th row). ``classify`` translates the
    vendor's errors: ABSENT drops the probe, LOST raises :class:`DeviceLost`, RETRY records once
    per error and drops the probe after ``MAX_FAILS_IN_A_ROW`` in a row. With ``slow_call_ns``,
    :meth:`calibrate` moves slow fast probes, and with ``held`` (GIL held) so does one slower than
    it ``OVER_IN_A_ROW`` times in a row. ``profile`` records each call's thread CPU (a syscall)."""

    _fast: tuple[Probe, ...] = ()
    _slow: tuple[Probe, ...] = ()
    _moved: tuple[Probe, ...] = ()
    _slow_every: int = 1
    _moved_every: int = 1
    slow_call_ns: int | None = None
    held: bool = False
    profile: bool = False
    errors: ErrorLog

    def classify(self, exc: Exception) -> tuple[str, str, object]:
        """(ABSENT|LOST|RETRY, one-line description, error key) for a failed vendor call."""
        return RETRY, f"{type(exc).__name__}: {exc}", type(exc).__name__

    def fail(self, probe: Probe, exc: Exception) -> None:
        idx = self.info.visible_index
        kind, what, key = self.classify(exc)
        if kind == LOST:
            self.errors.once((idx, "lost"), "lost", f"gpu{idx}: device lost ({what}); sampling of it stopped", idx, probe.name)
            raise DeviceLost(what)
        probe.fails += 1
        if kind == ABSENT or probe.fails >= MAX_FAILS_IN_A_ROW:
            for name in ("_fast", "_slow", "_moved"):
                setattr(self, name, tuple(p for p in getattr(self, name) if p is not probe))
            for col in probe.columns:
                if col not in self.info.absent:
                    self.info.absent.append(col)
            self.errors.once((idx, probe.name, "absent"), "absent" if kind == ABSENT else "metric",
                             f"gpu{idx}: {probe.name} absent ({what})", idx, probe.name)
        else:
            self.errors.once((idx, probe.name, key), "metric", f"gpu{idx}: {probe.name}: {what} (retrying)", idx, probe.name)

    def move(self, probe: Probe, why: str) -> None:
        if probe not in self._fast:
            return
        self._fast = tuple(p for p in self._fast if p is not probe)
        self._moved = self._moved + (probe,)
        if probe.released_fn is not None:
            probe.fn = probe.released_fn
        probe.cadence = "moved"
        probe.moved = why
        idx = self.info.visible_index
        every = getattr(self, "moved_interval_s", None)
        when = f"every {every:g} s" if every else f"every {self._moved_every} rows"
        self.errors.once((idx, probe.name, "cadence"), "cadence",
                         f"gpu{idx}: {probe.name} read {when}, GIL released: {why}", idx, probe.name)

    def calibrate(self) -> None:
        """Before sampling: move the fast probes whose median of ``CALIBRATION_CALLS`` calls
        exceeds ``slow_call_ns``."""
        limit = self.slow_call_ns
        if limit is None:
            return
        scratch = [NAN] * len(METRICS)
        for probe in self._fast:
            times = []
            for _ in range(CALIBRATION_CALLS):
                t0 = perf_ns()
                try:
                    # the per-row function itself: GIL held, the time is the call's, not a wait for the GIL
                    probe.fn(scratch)
                except Exception:  # noqa: BLE001 - errors are handled when sampling; this only times
                    break
                times.append(perf_ns() - t0)
            probe.calibration_ns = times
            med = sorted(times)[len(times) // 2] if times else 0
            if med > limit:
                self.move(probe, f"a call takes {med / 1e3:.0f} us (median of {len(times)}) > {limit / 1e3:.0f} us")

    def probe_stats(self) -> dict[str, Any]:
        for p in self._slow:
            p.cadence = "slow"
        return {p.name: p.stats() for p in self._fast + self._moved + self._slow}

    def _run(self, probes: tuple[Probe, ...], values: list[float], limit: int | None) -> None:
        timer = perf_ns
        profile = self.profile
        for probe in probes:
            if profile:
                c0 = time.thread_time_ns()
            t0 = timer()
            try:
                probe.fn(values)
                probe.fails = 0
            except Exception as exc:  # noqa: BLE001 - translated in fail()
                self.fail(probe, exc)
            dt = timer() - t0
            if profile:
                probe.cpu_ns_sum += time.thread_time_ns() - c0
                probe.cpu_calls += 1
            probe.record(dt)
            if limit is not None:
                if dt > limit:
                    probe.over += 1
                    if probe.over >= OVER_IN_A_ROW:
                        self.move(probe, f"{OVER_IN_A_ROW} calls in a row took > {limit / 1e3:.0f} us "
                                            f"(last {dt / 1e3:.0f} us) with the GIL held")
                else:
                    probe.over = 0

    def read_probes(self, values: list[float], tick: int) -> int:
        """Run the fast probes, the moved and slow ones on their ticks; FLAG_SLOW or 0."""
        self._run(self._fast, values, self.slow_call_ns if self.held else None)
        if self._moved and not tick % self._moved_every:
            self._run(self._moved, values, None)
        if tick % self._slow_every:
            return 0
        self._run(self._slow, values, None)
        return FLAG_SLOW
