"""NVIDIA: kernels, copies and sets per stage through CUPTI's activity API, in-process
(docs/kernels.md): the collector's lifecycle (:mod:`.convert` makes the rows).

cupti-python (``maxinstr[cupti]``) is imported only for ``kernels=True``. A launch's stage comes
from the core's launch tags (CUPTI's callback API, the default) or from API records beside the
external-correlation records of the stage ids the core pushes (``MAXINSTR_CUPTI_TAGS=0``). When
another tool holds CUPTI's one subscriber slot, stages are recorded with events only. CUPTI fills
buffers the core hands out (nothing on CUPTI's thread touches Python), or cupti-python's callback
copies them; the session's flusher, at most every ``FLUSH_EVERY_S``, makes CUPTI deliver and
converts. Records dropped (by CUPTI, or by our bounded queues) are counted in activity.json.
"""

from __future__ import annotations

import contextlib
import ctypes
import operator
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from maxinstr import config
from maxinstr.kernels.base import KernelsUnavailable
from maxinstr.kernels.convert import (TAG_DTYPE, Converter, check_cupti_python, installed, rows_from_records,
                                      rows_from_tags)
from maxinstr.rundir.activity import ACTIVITY_DTYPE, ActivityWriter

BUFFER_BYTES = 16 << 20
FLUSH_EVERY_S = 0.25
# Driver API records: needed only for work launched through the driver API (CuPy, Triton, MAX), yet
# every call pays for them (~6 % of a launch-bound H200 step, benchmarks/cupti_configs.py): off after
# this many GPU ops without one, back on at an op whose launch left no API record (docs/kernels.md).
DRIVER_PROBE_OPS = 5000
RECENT_RUNTIME_IDS = 1 << 16
MAX_QUEUED_ROWS = 8 << 20  # ~640 MB of rows waiting for the flusher: beyond, rows are dropped
MAX_PENDING_BYTES = 512 << 20  # completed CUPTI buffers not yet taken: beyond, buffers are dropped (counted)
CLOCK_PAIRS_MAX = 512
_PTR = operator.attrgetter("ptr")

# API records only for the functions that launch GPU work (each op joins its launch call): the
# others (cuEventRecord, cuKernelGetAttribute...) would only add records and CUPTI's cost. An op
# whose launching function were missed shows as "no launch-call record" in the report.
_LAUNCH_WORDS = ("Launch", "Memcpy", "Memset")
_NOT_FUNCTIONS = ("INVALID", "SIZE", "FORCE_INT")


def _functions(c: Any, enum_name: str) -> list[tuple[Any, bool]]:
    """The API functions of one of cupti-python's cbid enums, and whether each launches GPU work."""
    named = ((m, str(getattr(m, "name", ""))) for m in getattr(c, enum_name, None) or [])
    return [(m, any(w in name for w in _LAUNCH_WORDS)) for m, name in named if name and name not in _NOT_FUNCTIONS]


def _held(text: str) -> str:
    return ("another tool (nsys, Nsight, torch.profiler/Kineto...) already holds CUPTI in this process "
            f"({text}): stages are recorded with events only; take the kernels from that tool's trace")


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    with contextlib.suppress(Exception):  # teardown: undo what can be undone
        fn(*args)


def _noop_callback(*args: Any) -> None:  # the subscriber enables no domain: never called
    return None


def _error_text(cupti: Any, exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status is None and getattr(exc, "args", None) and isinstance(exc.args[0], int):
        status = exc.args[0]
    name = None
    with contextlib.suppress(Exception):  # a status this cupti-python cannot name: the text alone
        name = cupti.Result(int(status)).name if status is not None else None
    text = str(exc) or (name or type(exc).__name__)
    return f"CUPTI_{name}" if name and name not in text else text


def _loaded_cupti_paths() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            return list(dict.fromkeys(line.split(None, 5)[-1].strip() for line in f if "libcupti.so" in line))
    except OSError:
        return []


def _same_instance_path(c: Any, kind: int) -> str | None:
    """The mapped libcupti cupti-python talks to (of two copies, each keeps its own stack): an id
    pushed through a candidate's own symbol comes back from cupti-python's pop. None: no answer."""
    for path in _loaded_cupti_paths():
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
            push, pop = lib.cuptiActivityPushExternalCorrelationId, lib.cuptiActivityPopExternalCorrelationId
        except (OSError, AttributeError):
            continue
        push.argtypes, push.restype = [ctypes.c_int, ctypes.c_uint64], ctypes.c_int
        pop.argtypes, pop.restype = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)], ctypes.c_int
        probe = (0x6D78 << 32) | (os.getpid() & 0xFFFFFFFF)
        if push(kind, probe) != 0:
            continue
        try:
            got = int(c.activity_pop_external_correlation_id(kind))
        except Exception:  # noqa: BLE001 - another instance: its stack is empty
            got = None
        if got == probe:
            return path
        pop(kind, ctypes.byref(ctypes.c_uint64(0)))  # take the probe back off the other copy
    return None


class CuptiCollector:
    """kernels=True on NVIDIA: start, flush, stop, CUPTI's errors in one line."""

    name = "cupti"

    def __init__(self, writer: ActivityWriter) -> None:
        self.writer = writer
        self._c: Any = None
        self._subscriber: Any = None
        self._enabled: list[Any] = []
        self._lock = threading.Lock()
        self._queue: list[np.ndarray] = []
        self._conv: Converter  # at start, once cupti-python is checked
        self._queued = self._dropped_queue = self._convert_errors = self._buffers = 0
        self._callback_s = self._last_flush = self._take_s = 0.0
        self._pairs: list[list[int]] = []
        self._driver = "probing"  # "probing" (on), "needed" (on for good), "off"
        self._ops_seen = self._driver_rows = 0
        self._runtime_ids = np.empty(0, np.int64)  # recent runtime correlation ids, sorted
        self._ops_without_api = 0  # GPU ops launched while driver records were off: no stage
        self._driver_note = ""
        self._native: Any = None
        self._linked = self._stopped = False
        self._quiet = self._kept_api = self._api_filter_errors = 0
        self._mode = "none"  # "native": buffers handled by the stage core; "python": cupti-python's callbacks
        self._raw: list[tuple[bytes, np.ndarray]] = []  # (buffer bytes, record offsets) waiting for conversion
        self._raw_bytes = 0
        # stages from the core's launch tags (csrc/core/launch_tags.cpp): on the H200 they cost a
        # launch-bound step less than API + external-correlation records (docs/kernels.md)
        self._tags = config.cupti_tags()
        self._tag_kind = 0
        self._tags_at_start: dict[str, int] = {}  # the core's tag counters (process-wide) when this session began

    def start(self) -> None:
        try:
            from cupti import cupti  # the optional extra maxinstr[cupti]
        except ImportError as exc:
            raise KernelsUnavailable(f"cupti-python is not installed ({exc}); install the extra: "
                                     "pip install 'maxinstr[cupti]'") from None
        except Exception as exc:  # noqa: BLE001 - a broken install: say so, record stages anyway
            raise KernelsUnavailable(f"cupti-python failed to import: {type(exc).__name__}: {exc}") from None
        self._c = c = cupti
        self._conv = Converter(c, check_cupti_python(c))  # before CUPTI is touched: nothing to undo
        # the core in sys.modules when the session starts (tests may put a stand-in there), not bound at import
        import maxinstr._native as native

        self._native = native
        try:
            # tags mode: the core's callback takes CUPTI's one subscriber slot (below)
            self._subscriber = None if self._tags else c.subscribe(_noop_callback, None)
        except Exception as exc:  # noqa: BLE001 - cuptiError, or no driver / no libcupti
            text = _error_text(c, exc)
            raise KernelsUnavailable(_held(text) if "MULTIPLE_SUBSCRIBERS" in text else f"CUPTI could not start: {text}") from None
        try:
            kind_value = int(c.ExternalCorrelationKind.CUSTOM2)
            # cupti-python maps libcupti at its first call: in tags mode, without torch, none is mapped yet
            c.get_timestamp()
            path = _same_instance_path(c, kind_value)
            if not path:
                raise KernelsUnavailable("could not tell which loaded libcupti cupti-python uses "
                                         f"({_loaded_cupti_paths() or 'none mapped'})")
            # buffers before any activity kind is on: no record is ever written to a buffer we cannot read
            if native.cupti_buffers(path, BUFFER_BYTES, MAX_PENDING_BYTES):
                self._mode = "native"
            else:
                c.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
                self._mode = "python"
            K = c.ActivityKind
            if self._tags:
                self._start_tags(path, kind_value)
            records = () if self._tags else (K.RUNTIME, K.DRIVER, K.EXTERNAL_CORRELATION)  # tags: no API records
            for kind in (K.CONCURRENT_KERNEL, K.MEMCPY, K.MEMSET, *records):
                c.activity_enable(kind)
                self._enabled.append(kind)
            if not self._tags:
                self._trace_launches_only()
                if not native.cupti_link(path, kind_value):
                    raise KernelsUnavailable(f"the stage core could not use {path} for external correlation")
                self._linked = True
        except KernelsUnavailable:
            self._teardown()
            raise
        except Exception as exc:  # noqa: BLE001
            text = _error_text(c, exc)
            self._teardown()
            if "MULTIPLE_SUBSCRIBERS" in text:
                raise KernelsUnavailable(f"another tool already holds CUPTI in this process ({text}): stages are "
                                         "recorded with events only") from None
            raise KernelsUnavailable(f"CUPTI activity could not be enabled: {text}") from None
        self._clock_pair()
        self.writer.write_meta(status="collecting", collector="cupti", buffers_by=self._mode, cupti_library=path,
                               cupti_python=installed("cupti-python"),
                               record_layouts={r.family: r.name for r in self._conv.kinds.records.values()},
                               external_kind=kind_value, clock_pairs=self._pairs, buffer_bytes=BUFFER_BYTES,
                               api_functions_kept=self._kept_api, quiet_api_functions=self._quiet,
                               api_filter_errors=self._api_filter_errors,
                               stage_correlation="launch tags (CUPTI callback API)" if self._tags else "external correlation records")

    def _launch_cbids(self) -> tuple[list[int], list[int]]:  # the runtime and driver launch functions (benchmarks too)
        runtime, driver = ([int(m) for m, launches in _functions(self._c, e) if launches]
                           for e in ("runtime_api_trace_cbid", "driver_api_trace_cbid"))
        return runtime, driver

    def _start_tags(self, path: str, kind_value: int) -> None:
        """The core's launch tags: its callback on the launch functions holds CUPTI's subscriber."""
        runtime_ids, driver_ids = self._launch_cbids()
        rc = self._native.cupti_tags(path, runtime_ids, driver_ids)
        if rc is not True:
            if rc == 39:  # CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
                raise KernelsUnavailable(_held("ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"))
            raise KernelsUnavailable(f"CUPTI launch tags could not start ({rc!r}: {self._native.stats()['errors'][-1:]})")
        self._kept_api = len(runtime_ids) + len(driver_ids)
        self._tag_kind = kind_value
        self._tags_at_start = dict(self._native.cupti_tags_stats())
        # driver callbacks go off as driver records do: 3 points of a launch-bound step (H100, decoder_ab)
        self._tag_driver_ids = driver_ids
        self._driver = "probing"

    def _trace_launches_only(self) -> None:
        """API records only for the functions that launch GPU work; a function CUPTI refuses to
        switch off keeps its records (``api_filter_errors``), as all do without per-function control."""
        self._quiet = self._kept_api = self._api_filter_errors = 0
        for enum_name, fn_name in (("driver_api_trace_cbid", "activity_enable_driver_api"),
                                   ("runtime_api_trace_cbid", "activity_enable_runtime_api")):  # fmt: skip
            fn = getattr(self._c, fn_name, None)
            if getattr(self._c, enum_name, None) is None or fn is None:
                continue
            for member, launches in _functions(self._c, enum_name):
                if launches:
                    self._kept_api += 1
                    continue
                try:
                    fn(int(member), 0)
                    self._quiet += 1
                except Exception:  # noqa: BLE001 - an id this CUPTI refuses: that function keeps its records
                    self._api_filter_errors += 1

    def _teardown(self) -> None:
        c = self._c
        if self._tags and self._native is not None:
            _quietly(self._native.cupti_tags, None)
        if self._linked and self._native is not None:
            _quietly(self._native.cupti_link, None)
            self._linked = False
        for kind in self._enabled:
            _quietly(c.activity_disable, kind)
        self._enabled = []
        if self._subscriber is not None:
            _quietly(c.unsubscribe, self._subscriber)
            self._subscriber = None

    def flush(self, final: bool = False) -> None:
        if self._c is None or self._stopped:
            return
        now = time.monotonic()
        if not final and now - self._last_flush < FLUSH_EVERY_S:
            return
        self._last_flush = now
        flag = 1 if final else 0  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED at close
        try:
            if self._mode == "native":
                rc = int(self._native.cupti_flush(flag))  # the GIL is released while CUPTI flushes
                if rc != 0:
                    raise RuntimeError(f"cuptiActivityFlushAll returned {rc}")
            else:
                self._c.activity_flush_all(flag)
        except Exception as exc:  # noqa: BLE001
            self._error(f"flush: {_error_text(self._c, exc)}")
        self._clock_pair()
        self._take()
        self._write_queued()

    def _error(self, text: str) -> None:
        errors = self.writer.meta.setdefault("errors", [])
        if len(errors) < 10:  # the first few say what went wrong; the rest would only repeat it
            errors.append(text)

    def stop(self) -> dict[str, Any]:
        if self._stopped or self._c is None:
            return {}
        if self._linked:
            self._native.cupti_link(None)
            self._linked = False
        self.flush(final=False)
        self.flush(final=True)
        dropped_cupti = self._cupti_dropped()
        self._teardown()
        self._stopped = True
        self._take()
        self._write_queued()
        native_buffers = dict(self._native.cupti_buffer_stats()) if self._mode == "native" else None
        if native_buffers:  # buffers the stage core dropped (its queue over MAX_PENDING_BYTES): counted as ours
            self._dropped_queue += int(native_buffers.get("dropped_records", 0))
        launch_tags = None
        if self._tags_at_start:  # tags the core dropped (over its bound between two takes): their ops lose the stage
            now = dict(self._native.cupti_tags_stats())
            launch_tags = {k: int(now[k]) - int(self._tags_at_start.get(k, 0)) for k in ("calls", "dropped")}
            self._dropped_queue += launch_tags["dropped"]
        stats: dict[str, Any] = {
            "status": "closed", "clock_pairs": self._pairs, "dropped_cupti": dropped_cupti,
            "dropped_queue": self._dropped_queue, "convert_errors": self._convert_errors, "buffers": self._buffers,
            "fast_path": self._conv.fast_note, "record_free_errors": self._conv.record_free_errors[0],
            "callback_s": round(self._callback_s, 6), "convert_s": round(self._take_s, 6),
            "stage_pushes": int(self._native.cupti_stats().get("pushes", 0)),
            "driver_api_records": self._driver, "driver_api_note": self._driver_note,
            "ops_without_api": self._ops_without_api, "push_errors": int(self._native.cupti_stats().get("errors", 0)),
        }
        if native_buffers is not None:
            stats["native_buffers"] = native_buffers
        if launch_tags is not None:
            stats["launch_tags"] = launch_tags
        self.writer.write_meta(**stats)
        return stats

    # CUPTI callbacks (python mode only; any thread)
    def _buffer_requested(self) -> tuple[int, int]:
        return BUFFER_BYTES, 0

    def _buffer_completed(self, activities: Any) -> None:
        """cupti-python's completed-buffer callback (CUPTI's thread, GIL held): queue the bytes
        and record offsets for the flusher; records without bytes (no ``ptr``) convert here."""
        t0 = time.perf_counter()
        try:
            n = len(activities)
            if n == 0:
                return
            try:
                ptrs = np.fromiter(map(_PTR, activities), np.int64, n)
            except Exception as exc:  # noqa: BLE001 - records without bytes: the attribute path
                if self._conv.fast is not False:
                    self._conv.fast = False
                    self._conv.fast_note = f"fast path off: {type(exc).__name__}: {exc}"
                rows = rows_from_records(activities, self._conv.kinds, self._conv.names)
                with self._lock:
                    self._buffers += 1
                    self._queue_rows(rows)
                return
            base, last = int(ptrs.min()), int(ptrs.max())
            kind = int.from_bytes(ctypes.string_at(last, 4), "little")
            data = ctypes.string_at(base, last - base + self._conv.kinds.read_bytes.get(kind, 4))
            with self._lock:
                self._buffers += 1
                if self._raw_bytes + len(data) > MAX_PENDING_BYTES:
                    self._dropped_queue += n
                else:
                    self._raw.append((data, ptrs - base))
                    self._raw_bytes += len(data)
        except Exception:  # noqa: BLE001 - never raise into CUPTI's thread
            self._convert_errors += 1
            self._dropped_queue += len(activities) if hasattr(activities, "__len__") else 0
        finally:
            self._callback_s += time.perf_counter() - t0

    def _queue_rows(self, rows: np.ndarray) -> None:  # under self._lock
        if self._queued + len(rows) > MAX_QUEUED_ROWS:
            self._dropped_queue += len(rows)
        elif len(rows):
            self._queue.append(rows)
            self._queued += len(rows)

    def _take(self) -> None:
        """Turn the buffers delivered so far into queued rows (flusher thread)."""
        t0 = time.perf_counter()
        raw: list[tuple[bytes, np.ndarray]] = []
        if self._mode == "native":
            try:
                for data, offs in self._native.cupti_take():
                    raw.append((data, np.frombuffer(offs, np.int64)))
            except Exception as exc:  # noqa: BLE001
                self._error(f"take: {type(exc).__name__}: {exc}")
            self._buffers += len(raw)
        with self._lock:
            raw, self._raw, self._raw_bytes = self._raw + raw, [], 0
        if self._tags:
            try:
                tags = np.frombuffer(self._native.cupti_tags_take(), dtype=TAG_DTYPE)
                rows = rows_from_tags(tags, self._conv.kinds, self._conv.names, self._pairs, self._tag_kind)
                self._adapt_driver(rows)  # the runtime calls' ids, before the ops they launched
                with self._lock:
                    self._queue_rows(rows)
            except Exception as exc:  # noqa: BLE001
                self._error(f"launch tags: {type(exc).__name__}: {exc}")
        for data, offs in raw:
            try:
                rows = self._conv.convert(data, offs)
            except Exception as exc:  # noqa: BLE001 - a buffer we cannot read: counted, never silent
                self._convert_errors += 1
                self._dropped_queue += len(offs)
                self._error(f"convert: {type(exc).__name__}: {exc}")
                continue
            self._adapt_driver(rows)
            with self._lock:
                self._queue_rows(rows)
        self._take_s += time.perf_counter() - t0

    def _adapt_driver(self, rows: np.ndarray) -> None:
        """Driver API records off while nothing needs them, back on as soon as something does
        (flusher thread; see DRIVER_PROBE_OPS)."""
        if self._driver == "needed" or not len(rows):
            return
        kinds = rows["kind"]
        ops = kinds <= 2
        rt = rows["correlation_id"][kinds == 3]
        if len(rt):  # kept from the start: an op may come long after its runtime call
            self._runtime_ids = np.union1d(self._runtime_ids, rt)[-RECENT_RUNTIME_IDS:]
        if self._driver == "probing":
            self._driver_rows += int((kinds == 4).sum())
            self._ops_seen += int(ops.sum())
            if self._driver_rows:
                self._driver = "needed"
                self._driver_note = f"{self._driver_what} kept: driver-API launches seen in the first {self._ops_seen} GPU ops"
            elif self._ops_seen >= DRIVER_PROBE_OPS:
                self._set_driver(False)
                if self._driver == "off":
                    self._driver_note = (f"{self._driver_what} off after {self._ops_seen} GPU ops all launched through the "
                                         "runtime API")
            return
        # off: an op whose correlation id no runtime call had was launched through the driver API
        corr = rows["correlation_id"][ops]
        if not len(corr) or not len(self._runtime_ids):
            return
        lo, hi = self._runtime_ids[0], self._runtime_ids[-1]
        check = corr[(corr >= lo) & (corr <= hi)]  # later ones: their runtime record may come later
        missing = check[~np.isin(check, self._runtime_ids)]
        if len(missing):
            self._ops_without_api += int(len(missing))
            self._set_driver(True)
            self._driver = "needed"
            self._driver_note = (f"{self._driver_what} back on: {self._ops_without_api} GPU ops launched through the "
                                 "driver API while they were off have no stage")

    @property
    def _driver_what(self) -> str:
        return "driver API launch callbacks" if self._tags else "driver API records"

    def _set_driver(self, on: bool) -> None:
        c = self._c
        K = c.ActivityKind
        try:
            if self._tags:
                if self._native.cupti_tags_enable(1, self._tag_driver_ids, int(on)) is not True:
                    raise RuntimeError("cuptiEnableCallback failed on the driver launch functions")
                self._driver = "needed" if on else "off"
                return
            if on:
                c.activity_enable(K.DRIVER)
                self._enabled.append(K.DRIVER)
                self._trace_launches_only()  # enabling a kind resets CUPTI's per-function choice
            else:
                c.activity_disable(K.DRIVER)
                self._enabled = [k for k in self._enabled if k != K.DRIVER]
                self._driver = "off"
        except Exception as exc:  # noqa: BLE001 - keep what works; say what did not
            self._driver = "needed"
            self._error(f"driver API records {'on' if on else 'off'}: {_error_text(c, exc)}")

    def _write_queued(self) -> None:
        with self._lock:
            chunks, self._queue, self._queued = self._queue, [], 0
        names = self._conv.names.snapshot()  # after the rows: every name they use is in it
        self.writer.write(np.concatenate(chunks) if chunks else np.empty(0, ACTIVITY_DTYPE), names)

    def _clock_pair(self) -> None:
        """One (host clock, CUPTI clock) pair: the midpoint of two host reads around the CUPTI read,
        of three tries the one whose host reads were closest (a preempted thread widens the gap)."""
        if len(self._pairs) >= CLOCK_PAIRS_MAX:
            self._pairs = self._pairs[::2]
        best: tuple[int, int, int] | None = None
        with contextlib.suppress(Exception):  # CUPTI's clock unreadable now: the tries that worked, if any
            for _ in range(3):
                h0 = int(self._native.clock_ns())
                t = int(self._c.get_timestamp())
                h1 = int(self._native.clock_ns())
                if best is None or h1 - h0 < best[0]:
                    best = (h1 - h0, (h0 + h1) // 2, t)
        if best is not None:
            self._pairs.append([best[1], best[2]])

    def _cupti_dropped(self) -> int | None:
        try:
            value = ctypes.c_size_t(0)
            self._c.activity_get_num_dropped_records(0, 0, ctypes.addressof(value))
            return int(value.value)
        except Exception:  # noqa: BLE001 - a CUPTI without the count: unknown
            return None

