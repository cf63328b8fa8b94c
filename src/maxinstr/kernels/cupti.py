"""NVIDIA: kernels, copies and sets per stage through CUPTI's activity API, in-process.

Uses NVIDIA's ``cupti-python`` (the optional extra ``maxinstr[cupti]``), imported only here
and only when a session asks for ``kernels=True``. What it turns on:

* activity kinds CONCURRENT_KERNEL, MEMCPY, MEMSET (the GPU ops), RUNTIME and DRIVER (the API
  calls: CUPTI writes external-correlation records only next to API records), and
  EXTERNAL_CORRELATION;
* the native stage core pushes each stage's record id with
  ``cuptiActivityPushExternalCorrelationId`` at enter and pops it at exit (``_native.cupti_link``
  dlsyms the two functions from the libcupti this module loaded), so every API call made
  inside a stage is tagged with the innermost stage's id, exactly;
* a no-op ``cuptiSubscribe`` first, which claims CUPTI's single subscriber slot: when nsys,
  Kineto or another tool holds it, CUPTI answers MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED and we
  fall back to events-only stages instead of taking records from the other tool.

Buffers: CUPTI fills buffers handed out by the native stage core (``_native.cupti_buffers``:
C callbacks that only queue completed buffers, so nothing on CUPTI's thread touches Python or
the GIL). The session's flusher thread, at most every ``FLUSH_EVERY_S``, makes CUPTI deliver
what is complete (``_native.cupti_flush``, GIL released), takes the buffers (their bytes and
each record's offset, walked with ``cuptiActivityGetNextRecord``) and turns the records into
rows with numpy through cupti-python's own struct dtypes, then writes them. That numpy path is
trusted only after it gave exactly the rows of cupti-python's record objects (``from_ptr``,
attribute by attribute) on the first ``FAST_CHECK_ROWS`` records. Where the native buffers
cannot be had, cupti-python's Python callbacks are used: the callback only copies the buffer's
bytes and queues them. API records are kept only for the functions that launch GPU work (a
launch, copy or set: what the report joins ops to); every other runtime/driver function is
switched off. Records CUPTI dropped (no buffer in time) and records we dropped (queue over its
bound) are counted in activity.json and said in the report.
"""

from __future__ import annotations

import contextlib
import ctypes
import operator
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from maxinstr import config
from maxinstr.kernels.base import KernelsUnavailable
from maxinstr.rundir.activity import (
    ACTIVITY_DTYPE,
    KIND_DRIVER,
    KIND_EXTERNAL,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    KIND_RUNTIME,
    ActivityWriter,
    to_collector_clock,
)

BUFFER_BYTES = 16 << 20
FLUSH_EVERY_S = 0.25
# Driver API records: needed only for work launched through the driver API (CuPy, Triton, MAX,
# NCCL's cuLaunchKernelEx...); a program launching through the runtime (PyTorch) gets none of
# them, yet with DRIVER on every API call pays for it (about 6 % of a launch-bound step on an
# H200, benchmarks/cupti_configs.py). After this many GPU ops with no driver API record, DRIVER
# goes off; an op whose launch then left no API record turns it back on (docs/kernels.md).
DRIVER_PROBE_OPS = 5000
# The native launch tags (_native.cupti_tags; csrc/core/launch_tags.cpp: struct Tag)
TAG_DTYPE = np.dtype([("correlation_id", "<u4"), ("domain", "<i4"), ("stage_id", "<i8"), ("tid", "<i8"),
                      ("start_ns", "<i8"), ("end_ns", "<i8"), ("cbid", "<u4"), ("inner_correlation_id", "<u4")])  # fmt: skip
RECENT_RUNTIME_IDS = 1 << 16
MAX_QUEUED_ROWS = 8 << 20  # ~640 MB of rows waiting for the flusher: beyond, rows are dropped
MAX_PENDING_BYTES = 512 << 20  # completed CUPTI buffers not yet taken: beyond, buffers are dropped (counted)
CLOCK_PAIRS_MAX = 512
_PTR = operator.attrgetter("ptr")
# Records converted both ways (and compared) before the fast path is trusted. A record object
# costs ~60 us with the GIL held (cupti-python 13.0.1: made, read, freed): 1,000 of them stalled
# the H200 MAX decoder's main thread ~90 ms once, mid-run (389.5 against 1235.8 tokens/s plain,
# 2026-12-04), so few, in slices that hand the GIL back in between.
FAST_CHECK_ROWS = 128
FAST_CHECK_SLICE = 16

# API records are kept only for the functions that launch GPU work: the report joins each
# kernel, copy and set to the call that launched it (same correlation id) and reads the stage
# from that call's external-correlation record; every other call (cuEventRecord around each
# stage, cuDevicePrimaryCtxGetState, cuKernelGetAttribute... inside each launch) would only add
# records (and CUPTI's cost of writing them) to the program's thread. An op whose launching
# function were missed here would show up as "no launch-call record" in the report's notes.
_LAUNCH_WORDS = ("Launch", "Memcpy", "Memset")
_NOT_FUNCTIONS = ("INVALID", "SIZE", "FORCE_INT")

# The fields read from each kind of record, through cupti-python's description of its struct
# (``activity_<kind>N_dtype``) and, to check that path, its record class (``Activity<Kind>N``).
# Each cupti-python release describes the structs of its own CUDA minor (13.0.x: ActivityKernel10;
# 13.2.0: 11 only; 13.3.0: 12 only; 13.4.0: 9 to 13); a newer struct appends fields, these keep
# their offsets in every release checked (tests/data/cupti/cupti_python/, docs/kernels.md).
RECORD_FIELDS: dict[str, tuple[str, ...]] = {
    "kernel": ("kind", "start", "end", "device_id", "stream_id", "correlation_id", "name", "graph_node_id"),
    "memcpy": ("kind", "copy_kind", "bytes", "start", "end", "device_id", "stream_id", "correlation_id", "graph_node_id"),
    "memset": ("kind", "bytes", "start", "end", "device_id", "stream_id", "correlation_id", "graph_node_id"),
    "api": ("kind", "cbid", "start", "end", "thread_id", "correlation_id"),
    "external_correlation": ("kind", "external_kind", "external_id", "correlation_id"),
}
_RECORD_CLASS_STEM = {"kernel": "Kernel", "memcpy": "Memcpy", "memset": "Memset", "api": "API",
                      "external_correlation": "ExternalCorrelation"}  # fmt: skip
# cupti-python's functions and enums the collector cannot do without (the others it calls have a
# fallback: activity_enable_*_api, get_callback_name, activity_get_num_dropped_records)
CUPTI_FUNCTIONS = ("activity_enable", "activity_disable", "activity_flush_all", "activity_register_callbacks",
                   "activity_pop_external_correlation_id", "get_timestamp", "subscribe", "unsubscribe")  # fmt: skip
CUPTI_ENUMS = {
    "ActivityKind": ("MEMCPY", "MEMSET", "KERNEL", "DRIVER", "RUNTIME", "CONCURRENT_KERNEL", "EXTERNAL_CORRELATION"),
    "ExternalCorrelationKind": ("CUSTOM2",),
    "runtime_api_trace_cbid": (),  # the launch functions tagged or kept (_launch_cbids, _trace_launches_only)
    "driver_api_trace_cbid": (),
}


@dataclass(frozen=True)
class RecordLayout:
    """How one kind of record is read: cupti-python's struct description and record class."""

    family: str
    name: str  # the record class, e.g. "ActivityKernel13"
    dtype: np.dtype
    record_class: Any
    read_bytes: int  # where the last field read ends: a record is read up to here, whatever its struct's size


def _unreadable(dt: Any, fields: tuple[str, ...]) -> list[str]:
    """What keeps ``dt`` from giving these fields as the collector reads them (little-endian
    integers, aligned to their size)."""
    bad = []
    for f in fields:
        got = (getattr(dt, "fields", None) or {}).get(f)
        if got is None:
            bad.append(f"no {f}")
        elif got[0].kind not in "iu" or got[0].byteorder == ">":
            bad.append(f"{f} is {got[0].str}")
        elif got[1] % got[0].itemsize:
            bad.append(f"{f} unaligned at {got[1]}")
    return bad


def record_layouts(c: Any) -> dict[str, RecordLayout]:
    """For each kind of record the collector reads, the newest struct this cupti-python describes
    (``activity_<kind>N_dtype`` with its ``Activity<Kind>N`` class) that has every field read.
    Raises :class:`KernelsUnavailable` naming what is missing."""
    out: dict[str, RecordLayout] = {}
    problems = []
    names = dir(c)
    for family, fields in RECORD_FIELDS.items():
        stem = _RECORD_CLASS_STEM[family]
        versions = sorted(((int(m.group(1) or -1), m.group(1)) for m in
                           (re.fullmatch(rf"activity_{family}(\d*)_dtype", n) for n in names) if m), reverse=True)  # fmt: skip
        tried = []
        for _, n in versions:
            dt, cls = getattr(c, f"activity_{family}{n}_dtype"), getattr(c, f"Activity{stem}{n}", None)
            bad = _unreadable(dt, fields)
            if cls is None or not callable(getattr(cls, "from_ptr", None)):
                bad.append(f"no Activity{stem}{n}.from_ptr")
            if bad:
                tried.append(f"activity_{family}{n}_dtype: {', '.join(bad)}")
                continue
            end = max(dt.fields[f][1] + dt.fields[f][0].itemsize for f in fields)
            out[family] = RecordLayout(family, f"Activity{stem}{n}", dt, cls, int(end))
            break
        else:
            problems.append(f"no {family} record layout it can read ({'; '.join(tried) or f'no activity_{family}*_dtype'})")
    if problems:
        raise KernelsUnavailable(_unsupported(problems))
    return out


def check_cupti_python(c: Any) -> dict[str, RecordLayout]:
    """The record layouts to read with, once this cupti-python has everything the collector uses;
    else :class:`KernelsUnavailable` saying what it lacks (then the session warns once and records
    stages with events only, as for any other reason)."""
    missing = [f for f in CUPTI_FUNCTIONS if not callable(getattr(c, f, None))]
    for enum_name, members in CUPTI_ENUMS.items():
        enum = getattr(c, enum_name, None)
        if enum is None:
            missing.append(enum_name)
        missing += [f"{enum_name}.{m}" for m in members if enum is not None and not hasattr(enum, m)]
    if missing:
        raise KernelsUnavailable(_unsupported([f"no {', '.join(missing)}"]))
    return record_layouts(c)


def _unsupported(problems: list[str]) -> str:
    return (f"cupti-python {_version('cupti-python') or '(version unknown)'} is not supported: {'; '.join(problems)}; "
            f"install the versions maxinstr was checked with: pip install 'maxinstr[cupti]' ({_cupti_pin()})")


def _cupti_pin() -> str:
    """The cupti-python requirement of maxinstr's ``cupti`` extra, as installed."""
    try:
        from importlib.metadata import requires

        for req in requires("maxinstr") or []:
            spec, _, marker = req.partition(";")
            if spec.strip().startswith("cupti-python") and "cupti" in marker:
                return spec.strip()
    except Exception:  # noqa: BLE001
        pass
    return "cupti-python, see docs/kernels.md"


def _noop_callback(*args: Any) -> None:  # the subscriber enables no domain: never called
    return None


def _is_record_free_error(exc_type: Any, tb: Any) -> bool:
    """The KeyError cupti-python <= 13.0.1 raises in its BufferManager when a record object made
    with ``from_ptr`` over a buffer it did not allocate is freed (the object's ``__dealloc__``)."""
    if exc_type is not KeyError or tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return "buffer_manager" in tb.tb_frame.f_code.co_filename


@contextlib.contextmanager
def _quiet_record_objects(counter: list[int]) -> Iterator[None]:
    """While record objects over our buffers live and die: cupti-python <= 13.0.1 reports each
    one's free as a KeyError traceback on stderr, twice (Cython's __dealloc__ goes through
    sys.excepthook, then sys.unraisablehook): 2,000 tracebacks in a PyTorch program on the H200.
    Those are swallowed and counted in ``counter``; anything else goes to the hooks in place.
    The hooks are process-wide, so they are ours only for this block, and put back only if
    nobody replaced them meanwhile."""
    import sys

    prev_except, prev_unraisable = sys.excepthook, sys.unraisablehook

    def excepthook(exc_type, value, tb):
        if _is_record_free_error(exc_type, tb):  # the first of the two reports: counted at the second
            return
        prev_except(exc_type, value, tb)

    def unraisablehook(args):
        if _is_record_free_error(args.exc_type, args.exc_traceback):
            counter[0] += 1
            return
        prev_unraisable(args)

    sys.excepthook, sys.unraisablehook = excepthook, unraisablehook
    try:
        yield
    finally:
        if sys.excepthook is excepthook:
            sys.excepthook = prev_except
        if sys.unraisablehook is unraisablehook:
            sys.unraisablehook = prev_unraisable


def _error_text(cupti: Any, exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status is None and getattr(exc, "args", None) and isinstance(exc.args[0], int):
        status = exc.args[0]
    name = None
    try:
        name = cupti.Result(int(status)).name if status is not None else None
    except Exception:  # noqa: BLE001
        pass
    text = str(exc) or (name or type(exc).__name__)
    return f"CUPTI_{name}" if name and name not in text else text


def _loaded_cupti_paths() -> list[str]:
    """The libcupti files this process has mapped, in load order (usually one)."""
    found: list[str] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libcupti.so" in line:
                    path = line.split(None, 5)[-1].strip()
                    if path not in found:
                        found.append(path)
    except OSError:
        pass
    return found


def _same_instance_path(c: Any, kind: int) -> str | None:
    """The mapped libcupti that cupti-python talks to: an id pushed through a candidate file's own
    symbol must come back from cupti-python's pop (two copies of libcupti in one process would
    each keep their own stack). None when no candidate answers."""
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
    name = "cupti"

    def __init__(self, writer: ActivityWriter) -> None:
        self.writer = writer
        self._c: Any = None
        self._subscriber: Any = None
        self._enabled: list[Any] = []
        self._lock = threading.Lock()
        self._queue: list[np.ndarray] = []
        self._queued = 0
        self._names: dict[str, int] = {}
        self._name_list: list[str] = []
        self._api_names: dict[tuple[int, int], int] = {}
        self._dropped_queue = 0
        self._convert_errors = 0
        self._callback_s = 0.0
        self._buffers = 0
        self._rows = 0
        self._last_flush = 0.0
        self._pairs: list[list[int]] = []
        self._driver = "probing"  # "probing" (on), "needed" (on for good), "off"
        self._ops_seen = 0
        self._driver_rows = 0
        self._runtime_ids = np.empty(0, np.int64)  # recent runtime correlation ids, sorted
        self._ops_without_api = 0  # GPU ops launched while driver records were off: no stage
        self._driver_note = ""
        self._native: Any = None
        self._linked = False
        self._stopped = False
        self._quiet = 0
        self._kept_api = 0
        self._api_filter_errors = 0
        self._mode = "none"  # "native": buffers handled by the stage core; "python": cupti-python's callbacks
        self._raw: list[tuple[bytes, np.ndarray]] = []  # (buffer bytes, record offsets) waiting for conversion
        self._raw_bytes = 0
        self._take_s = 0.0
        self._keep_alive: Any = None
        self._fast: bool | None = None  # None: being checked against the attribute path
        self._fast_checked = 0
        self._fast_note = "fast path not used yet"
        self._record_free_errors = [0]  # cupti-python's KeyErrors on freeing our record objects, kept off stderr
        self._records: dict[int, RecordLayout] = {}  # by activity kind (check_cupti_python, at start)
        self._layout: dict[int, Any] = {}  # their dtypes, by activity kind
        self._read_bytes: dict[int, int] = {}
        self._name_ptrs: dict[int, int] = {}
        # stages from the core's launch tags (CUPTI callback API, csrc/core/launch_tags.cpp): on the
        # H200 they cost a launch-bound step less than API + external-correlation activity records
        # and read the same (docs/kernels.md); MAXINSTR_CUPTI_TAGS=0 goes back to those records
        self._tags = config.cupti_tags()
        self._tag_kind = 0
        self._tags_at_start: dict[str, int] = {}  # the core's tag counters (process-wide) when this session began

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        try:
            from cupti import cupti  # the optional extra maxinstr[cupti]
        except ImportError as exc:
            raise KernelsUnavailable(
                f"cupti-python is not installed ({exc}); install the extra: pip install 'maxinstr[cupti]'"
            ) from None
        except Exception as exc:  # noqa: BLE001 - a broken install: say so, record stages anyway
            raise KernelsUnavailable(f"cupti-python failed to import: {type(exc).__name__}: {exc}") from None
        self._c = c = cupti
        self._set_records(check_cupti_python(c))  # before CUPTI is touched: nothing to undo
        try:
            import maxinstr._native as native
        except Exception:  # noqa: BLE001
            raise KernelsUnavailable("the native stage core is not built: stages cannot be tagged") from None
        if not hasattr(native, "cupti_link"):
            raise KernelsUnavailable("this build of the native stage core predates kernels=True (rebuild maxinstr)")
        self._native = native
        try:
            # tags mode: the core's callback takes CUPTI's one subscriber slot (below)
            self._subscriber = None if self._tags else c.subscribe(_noop_callback, None)
        except Exception as exc:  # noqa: BLE001 - cuptiError, or no driver / no libcupti
            text = _error_text(c, exc)
            if "MULTIPLE_SUBSCRIBERS" in text:
                raise KernelsUnavailable(
                    "another tool (nsys, Nsight, torch.profiler/Kineto...) already holds CUPTI in this process "
                    f"({text}): stages are recorded with events only; take the kernels from that tool's trace"
                ) from None
            raise KernelsUnavailable(f"CUPTI could not start: {text}") from None
        try:
            kind_value = int(c.ExternalCorrelationKind.CUSTOM2)
            # cupti-python maps libcupti at its first call, and in tags mode nothing above called
            # it: where no framework loaded libcupti first (MAX, CuPy: no torch), none is mapped yet
            c.get_timestamp()
            path = _same_instance_path(c, kind_value)
            if not path:
                raise KernelsUnavailable(
                    f"could not tell which loaded libcupti cupti-python uses ({_loaded_cupti_paths() or 'none mapped'})"
                )
            # buffers before any activity kind is on: no record is ever written to a buffer we cannot read
            if hasattr(native, "cupti_buffers") and native.cupti_buffers(path, BUFFER_BYTES, MAX_PENDING_BYTES):
                self._mode = "native"
            else:
                c.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
                self._mode = "python"
            K = c.ActivityKind
            if self._tags:
                self._start_tags(path, kind_value)
                kinds: tuple[Any, ...] = (K.CONCURRENT_KERNEL, K.MEMCPY, K.MEMSET)
            else:
                kinds = (K.CONCURRENT_KERNEL, K.MEMCPY, K.MEMSET, K.RUNTIME, K.DRIVER, K.EXTERNAL_CORRELATION)
            for kind in kinds:
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
                raise KernelsUnavailable(
                    f"another tool already holds CUPTI in this process ({text}): stages are recorded with events only"
                ) from None
            raise KernelsUnavailable(f"CUPTI activity could not be enabled: {text}") from None
        self._clock_pair()
        self.writer.write_meta(
            status="collecting",
            collector="cupti",
            buffers_by=self._mode,
            cupti_library=path,
            cupti_python=_version("cupti-python"),
            record_layouts={r.family: r.name for r in self._records.values()},
            external_kind=kind_value,
            clock_pairs=self._pairs,
            buffer_bytes=BUFFER_BYTES,
            api_functions_kept=self._kept_api,
            quiet_api_functions=self._quiet,
            api_filter_errors=self._api_filter_errors,
            stage_correlation="launch tags (CUPTI callback API)" if self._tags else "external correlation records",
        )

    def _launch_cbids(self) -> tuple[list[int], list[int]]:
        """Callback ids of the runtime and driver functions that launch GPU work (names with
        Launch, Memcpy or Memset)."""
        out: tuple[list[int], list[int]] = ([], [])
        for i, enum_name in enumerate(("runtime_api_trace_cbid", "driver_api_trace_cbid")):
            for member in getattr(self._c, enum_name, None) or []:
                name = str(getattr(member, "name", ""))
                if name and name not in _NOT_FUNCTIONS and any(w in name for w in _LAUNCH_WORDS):
                    out[i].append(int(member))
        return out

    def _start_tags(self, path: str, kind_value: int) -> None:
        """The core's launch tags: its callback on the launch functions holds CUPTI's subscriber."""
        if not hasattr(self._native, "cupti_tags"):
            raise KernelsUnavailable("this build of the native stage core has no launch tags (MAXINSTR_CUPTI_TAGS)")
        runtime_ids, driver_ids = self._launch_cbids()
        rc = self._native.cupti_tags(path, runtime_ids, driver_ids)
        if rc is not True:
            if rc == 39:  # CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
                raise KernelsUnavailable(
                    "another tool (nsys, Nsight, torch.profiler/Kineto...) already holds CUPTI in this process "
                    "(ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED): stages are recorded with events only; take the "
                    "kernels from that tool's trace"
                )
            raise KernelsUnavailable(f"CUPTI launch tags could not start ({rc!r}: {self._native.stats()['errors'][-1:]})")
        self._kept_api = len(runtime_ids) + len(driver_ids)
        self._tag_kind = kind_value
        self._tags_at_start = dict(self._native.cupti_tags_stats())
        # the driver functions' callbacks go off, as driver records do, once the program is seen
        # to launch through the runtime alone: each is two more CUPTI dispatches inside every
        # runtime launch (H100, decoder_ab: the tags cost a launch-bound step 3 points over
        # CUPTI's floor with both domains on)
        self._tag_driver_ids = driver_ids
        self._driver = "probing"

    def _take_tags(self) -> np.ndarray:
        """Rows from the launch tags: an API row per outermost launch call and, inside a stage,
        an external-correlation row naming it, as CUPTI's records would be."""
        tags = np.frombuffer(self._native.cupti_tags_take(), dtype=TAG_DTYPE)
        n = len(tags)
        if not n:
            return np.empty(0, ACTIVITY_DTYPE)
        K = self._c.ActivityKind
        driver = tags["domain"] == 1
        api = np.zeros(n, ACTIVITY_DTYPE)
        api["kind"] = np.where(driver, KIND_DRIVER, KIND_RUNTIME)
        keys, inverse = np.unique(tags["cbid"].astype(np.int64) * 2 + driver, return_inverse=True)
        name_ids = []
        for key in keys.tolist():  # one name lookup per function, not per call
            drv, cbid = bool(key & 1), key >> 1
            k = int(K.DRIVER) if drv else int(K.RUNTIME)
            nid = self._api_names.get((k, cbid))
            name_ids.append(nid if nid is not None else self._api_name(k, cbid, drv))
        api["name_id"] = np.asarray(name_ids, np.int32)[inverse]
        # the tags carry the core's host clock; rows are on CUPTI's (the pair taken just before
        # this take covers them). A tag is kept at its call's exit, so end is set with start.
        host = np.stack([tags["start_ns"], tags["end_ns"]])
        coll = to_collector_clock(host.ravel(), self._pairs).reshape(2, n)
        timed = tags["start_ns"] >= 0
        api["start_ns"] = np.where(timed, coll[0], -1)
        api["end_ns"] = np.where(timed, coll[1], -1)
        api["correlation_id"] = tags["correlation_id"]
        api["tid"] = tags["tid"]
        api["cbid"] = tags["cbid"]
        for col in ("external_id", "stream_id", "graph_node_id", "device_id"):
            api[col] = -1
        inside = tags["stage_id"] >= 0
        # the driver call a runtime launch made inside itself is named too, so an op that
        # carries either call's id finds its stage
        inner = inside & (tags["inner_correlation_id"] != 0)
        ext = np.zeros(int(inside.sum() + inner.sum()), ACTIVITY_DTYPE)
        ext["kind"] = KIND_EXTERNAL
        ext["name_id"] = -1
        ext["correlation_id"] = np.concatenate([tags["correlation_id"][inside], tags["inner_correlation_id"][inner]])
        ext["external_id"] = np.concatenate([tags["stage_id"][inside], tags["stage_id"][inner]])
        for col in ("stream_id", "tid", "graph_node_id", "device_id"):
            ext[col] = -1
        ext["cbid"] = self._tag_kind
        return np.concatenate([api, ext])

    def _trace_launches_only(self) -> None:
        """API records only for the functions that launch GPU work (names with Launch, Memcpy or
        Memset); every other runtime and driver function CUPTI knows is switched off. A function
        CUPTI refuses to switch off keeps its records (counted in ``api_filter_errors``), as do
        all on a CUPTI without per-function control (correct, only more records)."""
        self._quiet = self._kept_api = self._api_filter_errors = 0
        for enum_name, fn_name in (("driver_api_trace_cbid", "activity_enable_driver_api"),
                                   ("runtime_api_trace_cbid", "activity_enable_runtime_api")):  # fmt: skip
            ids = getattr(self._c, enum_name, None)
            fn = getattr(self._c, fn_name, None)
            if ids is None or fn is None:
                continue
            done = 0
            for member in ids:
                name = str(getattr(member, "name", ""))
                if not name or name in _NOT_FUNCTIONS:
                    continue
                if any(w in name for w in _LAUNCH_WORDS):
                    self._kept_api += 1
                    continue
                try:
                    fn(int(member), 0)
                except Exception:  # noqa: BLE001 - an id this CUPTI refuses: that function keeps its records
                    self._api_filter_errors += 1
                    continue
                done += 1
            self._quiet += done

    def _teardown(self) -> None:
        c = self._c
        if self._tags and self._native is not None and hasattr(self._native, "cupti_tags"):
            try:
                self._native.cupti_tags(None)
            except Exception:  # noqa: BLE001
                pass
        if self._linked and self._native is not None:
            try:
                self._native.cupti_link(None)
            except Exception:  # noqa: BLE001
                pass
            self._linked = False
        for kind in self._enabled:
            try:
                c.activity_disable(kind)
            except Exception:  # noqa: BLE001
                pass
        self._enabled = []
        if self._subscriber is not None:
            try:
                c.unsubscribe(self._subscriber)
            except Exception:  # noqa: BLE001
                pass
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
            "status": "closed",
            "clock_pairs": self._pairs,
            "dropped_cupti": dropped_cupti,
            "dropped_queue": self._dropped_queue,
            "convert_errors": self._convert_errors,
            "buffers": self._buffers,
            "fast_path": self._fast_note,
            "record_free_errors": self._record_free_errors[0],
            "callback_s": round(self._callback_s, 6),
            "convert_s": round(self._take_s, 6),
            "stage_pushes": int(self._native.cupti_stats().get("pushes", 0)),
            "driver_api_records": self._driver,
            "driver_api_note": self._driver_note,
            "ops_without_api": self._ops_without_api,
            "push_errors": int(self._native.cupti_stats().get("errors", 0)),
        }
        if native_buffers is not None:
            stats["native_buffers"] = native_buffers
        if launch_tags is not None:
            stats["launch_tags"] = launch_tags
        self.writer.write_meta(**stats)
        return stats

    # -- CUPTI callbacks (python mode only; any thread) ---------------------------------------
    def _buffer_requested(self) -> tuple[int, int]:
        return BUFFER_BYTES, 0

    def _buffer_completed(self, activities: Any) -> None:
        """cupti-python's completed-buffer callback (on CUPTI's thread, holding the GIL): copy
        the buffer's bytes and the records' offsets, queue them, return. Converting happens on
        the flusher thread. Records without bytes (no ``ptr``) are converted here, by attribute."""
        t0 = time.perf_counter()
        try:
            n = len(activities)
            if n == 0:
                return
            try:
                ptrs = np.fromiter(map(_PTR, activities), np.int64, n)
            except Exception as exc:  # noqa: BLE001 - records without bytes: the attribute path
                if self._fast is not False:
                    self._fast = False
                    self._fast_note = f"fast path off: {type(exc).__name__}: {exc}"
                rows = self._convert(activities)
                with self._lock:
                    self._buffers += 1
                    self._queue_rows(rows)
                return
            base, last = int(ptrs.min()), int(ptrs.max())
            kind = int.from_bytes(ctypes.string_at(last, 4), "little")
            self._by_kind()
            data = ctypes.string_at(base, last - base + self._read_bytes.get(kind, 4))
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

    # -- flusher side: buffers -> rows ------------------------------------------------------
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
                rows = self._take_tags()
                self._adapt_driver(rows)  # the runtime calls' ids, before the ops they launched
                with self._lock:
                    self._queue_rows(rows)
            except Exception as exc:  # noqa: BLE001
                self._error(f"launch tags: {type(exc).__name__}: {exc}")
        for data, offs in raw:
            try:
                rows = self._convert_checked(data, offs)
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

    def _convert_checked(self, data: bytes, offs: np.ndarray) -> np.ndarray:
        """Rows from one buffer: the numpy path (the records' bytes read through cupti-python's
        own struct dtypes), checked against cupti-python's record objects on the first
        ``FAST_CHECK_ROWS`` records of the session (only those, a slice at a time: the objects
        cost tens of microseconds a record, with the GIL held); the record objects for everything
        once the two differed."""
        if self._fast is True:
            return self._convert_fast(data, offs)
        if self._fast is False:
            return self._convert_objects(data, offs)
        try:
            fast = self._convert_fast(data, offs)
        except Exception as exc:  # noqa: BLE001 - any surprise: the record objects, for good
            self._fast = False
            self._fast_note = f"fast path off: {type(exc).__name__}: {exc}"
            return self._convert_objects(data, offs)
        head = offs[: max(0, FAST_CHECK_ROWS - self._fast_checked)]
        try:
            slices = []
            for i in range(0, len(head), FAST_CHECK_SLICE):
                slices.append(self._convert_objects(data, head[i : i + FAST_CHECK_SLICE]))
                time.sleep(0)  # the GIL to the program's threads between slices
            slow = np.concatenate(slices) if slices else self._convert_objects(data, head)
        except Exception as exc:  # noqa: BLE001 - no record objects to check against
            self._fast = True
            self._fast_note = f"fast path on, unchecked (cupti-python record objects unavailable: {type(exc).__name__}: {exc})"
            return fast
        fast_head = fast if len(head) == len(offs) else self._convert_fast(data, head)
        if len(fast_head) != len(slow) or any(not np.array_equal(fast_head[f], slow[f]) for f in ACTIVITY_DTYPE.names or ()):
            self._fast = False
            bad = [f for f in ACTIVITY_DTYPE.names or () if len(fast_head) != len(slow) or not np.array_equal(fast_head[f], slow[f])]
            self._fast_note = f"fast path off: differs from the attribute path in {bad}"
            return self._convert_objects(data, offs)
        self._fast_checked += len(head)
        if self._fast_checked >= FAST_CHECK_ROWS:
            self._fast = True
            self._fast_note = f"fast path on (checked against the attribute path on {self._fast_checked} records)"
        else:
            self._fast_note = f"fast path used, checked on all {self._fast_checked} records so far"
        return fast

    def _convert_objects(self, data: bytes, offs: np.ndarray) -> np.ndarray:
        """Rows through cupti-python's record objects over the buffer's bytes; the objects are
        made and freed inside, with cupti-python's complaints about freeing them kept off stderr."""
        with _quiet_record_objects(self._record_free_errors):
            return self._convert(self._objects(data, offs))

    def _objects(self, data: bytes, offs: np.ndarray) -> list[Any]:
        """cupti-python's record objects over the buffer's bytes (``Activity*.from_ptr``), for the
        kinds we read; what its completed-buffer callback would have handed us."""
        if not len(offs):
            return []
        classes = {k: r.record_class for k, r in self._by_kind().items()}
        # the records' span, copied with room for a whole struct after the last record: an object
        # of a newer struct than the libcupti wrote (cupti-python 13.4 over libcupti 13.0) stays
        # inside memory we own
        lo, hi = int(offs.min()), int(offs.max())
        buf = np.zeros(hi - lo + max(int(r.dtype.itemsize) for r in self._records.values()), np.uint8)
        span = np.frombuffer(data, np.uint8)[lo:]
        buf[: min(len(span), len(buf))] = span[: len(buf)]
        addr = buf.ctypes.data - lo
        kinds = np.frombuffer(data, "<i4", count=len(data) // 4)[offs // 4]
        out = []
        for o, k in zip(offs.tolist(), kinds.tolist()):
            cls = classes.get(int(k))
            if cls is not None:
                out.append(cls.from_ptr(addr + o, True))
        self._keep_alive = buf  # the objects point into it until they are converted
        return out

    def _by_kind(self) -> dict[int, RecordLayout]:
        """The record layouts by activity kind: picked at start, or here for a collector used
        without start (benchmarks/cupti_convert.py, cupti_check_stall.py)."""
        if not self._records:
            self._set_records(check_cupti_python(self._c))
        return self._records

    def _set_records(self, records: dict[str, RecordLayout]) -> None:
        K = self._c.ActivityKind
        by_kind = {K.CONCURRENT_KERNEL: "kernel", K.KERNEL: "kernel", K.MEMCPY: "memcpy", K.MEMSET: "memset",
                   K.RUNTIME: "api", K.DRIVER: "api", K.EXTERNAL_CORRELATION: "external_correlation"}  # fmt: skip
        self._records = {int(k): records[family] for k, family in by_kind.items()}
        self._layout = {k: r.dtype for k, r in self._records.items()}
        self._read_bytes = {k: r.read_bytes for k, r in self._records.items()}

    def _convert_fast(self, data: bytes, off: np.ndarray) -> np.ndarray:
        """Rows read straight from a buffer's bytes: one numpy gather per field, from typed views
        over the buffer (CUPTI records are 8-byte aligned; anything unaligned or out of the
        buffer raises and the caller uses the record objects)."""
        n = len(off)
        if n == 0:
            return np.empty(0, ACTIVITY_DTYPE)
        self._by_kind()
        layout = self._layout
        if (off % 8).any() or int(off.min()) < 0:
            raise ValueError("activity records are not 8-byte aligned")
        kinds = np.frombuffer(data, "<i4", count=len(data) // 4)[off // 4]
        sizes = np.full(n, 4, np.int64)
        for k, end in self._read_bytes.items():
            sizes[kinds == k] = end
        if int((off + sizes).max()) > len(data):
            raise ValueError("an activity record runs past the end of its buffer")
        views: dict[str, np.ndarray] = {}

        def get(offs: np.ndarray, dt: Any, name: str) -> np.ndarray:
            fdt, fo = dt.fields[name][:2]
            w = fdt.itemsize
            pos = offs + fo
            if fo % w:
                raise ValueError(f"field {name} at offset {fo} is not aligned to its size {w}")
            v = views.get(fdt.str)
            if v is None:
                v = views[fdt.str] = np.frombuffer(data, fdt, count=len(data) // w)
            return v[pos // w]

        out = np.zeros(n, ACTIVITY_DTYPE)
        out["kind"] = -1
        for f in ("external_id", "stream_id", "tid", "graph_node_id", "name_id", "device_id", "cbid"):
            out[f] = -1
        K = self._c.ActivityKind
        k_kernel, k_kernel2 = int(K.CONCURRENT_KERNEL), int(K.KERNEL)
        k_rt, k_drv, k_ext = int(K.RUNTIME), int(K.DRIVER), int(K.EXTERNAL_CORRELATION)
        k_copy = int(K.MEMCPY)
        for k in np.unique(kinds).tolist():
            dt = layout.get(int(k))
            if dt is None:
                continue
            sel = np.flatnonzero(kinds == k)
            o = off[sel]
            cols: dict[str, Any] = {"correlation_id": get(o, dt, "correlation_id")}
            if k in (k_rt, k_drv):
                cols["kind"] = KIND_DRIVER if k == k_drv else KIND_RUNTIME
                cb = get(o, dt, "cbid").astype(np.int64)
                uniq, inv = np.unique(cb, return_inverse=True)
                ids = np.array([self._api_names.get((k, int(v))) if (k, int(v)) in self._api_names
                                else self._api_name(k, int(v), k == k_drv) for v in uniq.tolist()], np.int32)  # fmt: skip
                cols["name_id"] = ids[inv.reshape(-1)]
                cols["cbid"] = cb
                cols["tid"] = get(o, dt, "thread_id")
            elif k == k_ext:
                cols["kind"] = KIND_EXTERNAL
                cols["external_id"] = get(o, dt, "external_id").astype(np.int64)
                cols["cbid"] = get(o, dt, "external_kind")
                cols["start_ns"] = cols["end_ns"] = 0
            else:
                if k in (k_kernel, k_kernel2):
                    cols["kind"] = KIND_KERNEL
                    cols["name_id"] = self._kernel_name_ids(get(o, dt, "name"))
                else:
                    cols["kind"] = KIND_MEMCPY if k == k_copy else KIND_MEMSET
                    cols["bytes"] = get(o, dt, "bytes").astype(np.int64)
                    if k == k_copy:
                        cols["copy_kind"] = get(o, dt, "copy_kind")
                cols["stream_id"] = get(o, dt, "stream_id")
                cols["graph_node_id"] = get(o, dt, "graph_node_id").astype(np.int64)
                cols["device_id"] = get(o, dt, "device_id")
            if k != k_ext:
                cols["start_ns"] = get(o, dt, "start").astype(np.int64)
                cols["end_ns"] = get(o, dt, "end").astype(np.int64)
            for f, v in cols.items():
                out[f][sel] = v
        return out[out["kind"] >= 0]

    def _kernel_name_ids(self, name_ptrs: np.ndarray) -> np.ndarray:
        """Name ids of kernel records from their (shared, CUPTI-owned) name pointers."""
        cache = self._name_ptrs
        uniq, inv = np.unique(name_ptrs.astype(np.int64), return_inverse=True)
        ids = np.empty(len(uniq), np.int32)
        for i, p in enumerate(uniq.tolist()):
            nid = cache.get(p)
            if nid is None:
                text = ctypes.string_at(p).decode("utf-8", "replace") if p else ""
                nid = cache[p] = self._intern(text)
            ids[i] = nid
        return ids[inv.reshape(-1)]

    def _convert(self, activities: Any) -> np.ndarray:
        c = self._c
        K = c.ActivityKind
        k_kernel, k_kernel2 = int(K.CONCURRENT_KERNEL), int(K.KERNEL)
        k_copy, k_set = int(K.MEMCPY), int(K.MEMSET)
        k_rt, k_drv, k_ext = int(K.RUNTIME), int(K.DRIVER), int(K.EXTERNAL_CORRELATION)
        names, api_names = self._names, self._api_names
        out: list[tuple] = []
        app = out.append
        for a in activities:
            k = a.kind
            if k == k_rt or k == k_drv:
                cbid = a.cbid
                nid = api_names.get((k, cbid))
                if nid is None:
                    nid = self._api_name(k, cbid, k == k_drv)
                app((KIND_DRIVER if k == k_drv else KIND_RUNTIME, 0, 0, nid, a.start, a.end, a.correlation_id, -1,
                     -1, a.thread_id, -1, 0, -1, cbid))  # fmt: skip
            elif k == k_ext:
                app((KIND_EXTERNAL, 0, 0, -1, 0, 0, a.correlation_id, a.external_id, -1, -1, -1, 0, -1,
                     a.external_kind))  # fmt: skip
            elif k == k_kernel or k == k_kernel2:
                name = a.name
                nid = names.get(name)
                if nid is None:
                    nid = self._intern(name)
                app((KIND_KERNEL, 0, 0, nid, a.start, a.end, a.correlation_id, -1, a.stream_id, -1,
                     a.graph_node_id, 0, a.device_id, -1))  # fmt: skip
            elif k == k_copy:
                app((KIND_MEMCPY, a.copy_kind, 0, -1, a.start, a.end, a.correlation_id, -1, a.stream_id, -1,
                     a.graph_node_id, a.bytes, a.device_id, -1))  # fmt: skip
            elif k == k_set:
                app((KIND_MEMSET, 0, 0, -1, a.start, a.end, a.correlation_id, -1, a.stream_id, -1,
                     a.graph_node_id, a.bytes, a.device_id, -1))  # fmt: skip
        return np.array(out, dtype=ACTIVITY_DTYPE) if out else np.empty(0, ACTIVITY_DTYPE)

    def _intern(self, name: Any) -> int:
        text = name if isinstance(name, str) else (name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name))
        with self._lock:
            nid = self._names.get(text)
            if nid is None:
                nid = self._names[text] = len(self._name_list)
                self._name_list.append(text)
            if text is not name:
                self._names[name] = nid
        return nid

    def _api_name(self, kind: int, cbid: int, driver: bool) -> int:
        c = self._c
        try:
            domain = c.CallbackDomain.DRIVER_API if driver else c.CallbackDomain.RUNTIME_API
            name = c.get_callback_name(domain, cbid)
            if isinstance(name, bytes):
                name = name.decode("utf-8", "replace")
            name = str(name) or f"{'driver' if driver else 'runtime'} cbid {cbid}"
        except Exception:  # noqa: BLE001
            name = f"{'driver' if driver else 'runtime'} cbid {cbid}"
        nid = self._intern(name)
        self._api_names[(kind, cbid)] = nid
        return nid

    # -- flusher side -----------------------------------------------------------------------
    def _write_queued(self) -> None:
        with self._lock:
            chunks, self._queue, self._queued = self._queue, [], 0
            names = list(self._name_list)
        rows = np.concatenate(chunks) if chunks else np.empty(0, ACTIVITY_DTYPE)
        self._rows += len(rows)
        self.writer.write(rows, names)

    def _clock_pair(self) -> None:
        """One (host clock, CUPTI clock) pair: the host time is the midpoint of two reads around
        the CUPTI read; of three tries, the one whose host reads were closest (a thread preempted
        between them would put the pair off by up to the gap)."""
        if len(self._pairs) >= CLOCK_PAIRS_MAX:
            self._pairs = self._pairs[::2]
        best: tuple[int, int, int] | None = None
        try:
            for _ in range(3):
                h0 = int(self._native.clock_ns())
                t = int(self._c.get_timestamp())
                h1 = int(self._native.clock_ns())
                if best is None or h1 - h0 < best[0]:
                    best = (h1 - h0, (h0 + h1) // 2, t)
        except Exception:  # noqa: BLE001
            if best is None:
                return
        if best is None:  # (three tries: not without an exception)
            return
        self._pairs.append([best[1], best[2]])

    def _cupti_dropped(self) -> int | None:
        try:
            value = ctypes.c_size_t(0)
            self._c.activity_get_num_dropped_records(0, 0, ctypes.addressof(value))
            return int(value.value)
        except Exception:  # noqa: BLE001
            return None


def _version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001
        return None
