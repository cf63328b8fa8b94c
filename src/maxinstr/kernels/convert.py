"""CUPTI's activity records and the core's launch tags -> rows of
:data:`~maxinstr.rundir.activity.ACTIVITY_DTYPE` (the collector's lifecycle is :mod:`.cupti`):
:func:`rows_from_bytes` (numpy over a buffer, through cupti-python's own struct dtypes),
:func:`rows_from_records` (cupti-python's record objects, attribute by attribute),
:func:`rows_from_tags`, and :class:`Converter`, which trusts the first only once it matched the
second on a session's first ``FAST_CHECK_ROWS`` records.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import requires, version
from typing import Any

import numpy as np

from maxinstr.kernels.base import KernelsUnavailable
from maxinstr.rundir.activity import (ACTIVITY_DTYPE, KIND_DRIVER, KIND_EXTERNAL, KIND_KERNEL, KIND_MEMCPY,
                                      KIND_MEMSET, KIND_RUNTIME, to_collector_clock)

# The native launch tags (_native.cupti_tags; csrc/core/launch_tags.cpp: struct Tag)
TAG_DTYPE = np.dtype([("correlation_id", "<u4"), ("domain", "<i4"), ("stage_id", "<i8"), ("tid", "<i8"),
                      ("start_ns", "<i8"), ("end_ns", "<i8"), ("cbid", "<u4"), ("inner_correlation_id", "<u4")])  # fmt: skip
# Records converted both ways (and compared) before the fast path is trusted: few, in slices that
# hand the GIL back, as a record object costs ~60 us with the GIL held (cupti-python 13.0.1):
# 1,000 stalled the H200 MAX decoder ~90 ms (389.5 against 1235.8 tokens/s plain, 2026-12-04).
FAST_CHECK_ROWS = 128
FAST_CHECK_SLICE = 16

# The fields read per kind of record, through ``activity_<kind>N_dtype`` (checked by ``Activity<Kind>N``);
# each release describes its CUDA minor's structs (13.0.x: ActivityKernel10; 13.4.0: 9 to 13), these
# fields at the same offsets in every release checked (tests/data/cupti/cupti_python/, docs/kernels.md).
RECORD_FIELDS: dict[str, tuple[str, ...]] = {
    "kernel": ("kind", "start", "end", "device_id", "stream_id", "correlation_id", "name", "graph_node_id"),
    "memcpy": ("kind", "copy_kind", "bytes", "start", "end", "device_id", "stream_id", "correlation_id", "graph_node_id"),
    "memset": ("kind", "bytes", "start", "end", "device_id", "stream_id", "correlation_id", "graph_node_id"),
    "api": ("kind", "cbid", "start", "end", "thread_id", "correlation_id"),
    "external_correlation": ("kind", "external_kind", "external_id", "correlation_id"),
}
_RECORD_CLASS_STEM = {"kernel": "Kernel", "memcpy": "Memcpy", "memset": "Memset", "api": "API",
                      "external_correlation": "ExternalCorrelation"}  # fmt: skip
# cupti-python's functions and enums the collector cannot do without (the others have a fallback)
CUPTI_FUNCTIONS = ("activity_enable", "activity_disable", "activity_flush_all", "activity_register_callbacks",
                   "activity_pop_external_correlation_id", "get_timestamp", "subscribe", "unsubscribe")  # fmt: skip
CUPTI_ENUMS = {
    "ActivityKind": ("MEMCPY", "MEMSET", "KERNEL", "DRIVER", "RUNTIME", "CONCURRENT_KERNEL", "EXTERNAL_CORRELATION"),
    "ExternalCorrelationKind": ("CUSTOM2",),
    "runtime_api_trace_cbid": (),  # the launch functions tagged or kept (cupti.py: launch_cbids, trace_launches_only)
    "driver_api_trace_cbid": (),
}


@dataclass(frozen=True)
class RecordLayout:  # how one kind of record is read: cupti-python's struct description and class
    family: str
    name: str  # the record class, e.g. "ActivityKernel13"
    dtype: np.dtype
    record_class: Any
    read_bytes: int  # where the last field read ends: a record is read up to here, whatever its struct's size


def _unreadable(dt: Any, fields: tuple[str, ...]) -> list[str]:
    """What keeps ``dt`` from giving ``fields`` as aligned little-endian integers."""
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
    """Per kind of record, the newest struct this cupti-python describes with every field read
    (:class:`KernelsUnavailable` naming what is missing)."""
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
    else :class:`KernelsUnavailable` saying what it lacks."""
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
    return (f"cupti-python {installed('cupti-python') or '(version unknown)'} is not supported: {'; '.join(problems)}; "
            f"install the versions maxinstr was checked with: pip install 'maxinstr[cupti]' ({_cupti_pin()})")


def _cupti_pin() -> str:  # the cupti-python requirement of maxinstr's ``cupti`` extra
    with contextlib.suppress(Exception):  # metadata missing or broken: name the docs instead
        for req in requires("maxinstr") or []:
            spec, _, marker = req.partition(";")
            if spec.strip().startswith("cupti-python") and "cupti" in marker:
                return spec.strip()
    return "cupti-python, see docs/kernels.md"


def installed(dist: str) -> str | None:
    try:
        return version(dist)
    except Exception:  # noqa: BLE001 - not installed, or broken metadata
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
    """cupti-python <= 13.0.1 reports each free of a record object over our buffers as a KeyError
    traceback on stderr, twice (sys.excepthook, sys.unraisablehook): 2,000 in a PyTorch program on
    the H200. Here they are counted in ``counter``; anything else goes to the hooks in place."""
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


class Names:
    """Kernel and API function names as ids into activity_names.jsonl; thread-safe."""

    def __init__(self, c: Any) -> None:
        self.c = c
        self.lock = threading.Lock()
        self.ids: dict[Any, int] = {}  # a name (str, and the raw value it came as) -> id
        self.names: list[str] = []
        self.api: dict[tuple[int, int], int] = {}  # (activity kind, cbid) -> id
        self._pointers: dict[int, int] = {}  # a kernel record's (CUPTI-owned) name pointer -> id

    def intern(self, name: Any) -> int:
        text = name if isinstance(name, str) else (name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name))
        with self.lock:
            nid = self.ids.get(text)
            if nid is None:
                nid = self.ids[text] = len(self.names)
                self.names.append(text)
            if text is not name:
                self.ids[name] = nid
        return nid

    def snapshot(self) -> list[str]:
        with self.lock:
            return list(self.names)

    def api_id(self, kind: int, cbid: int, driver: bool) -> int:
        nid = self.api.get((kind, cbid))
        if nid is not None:
            return nid
        c = self.c
        try:
            domain = c.CallbackDomain.DRIVER_API if driver else c.CallbackDomain.RUNTIME_API
            name = c.get_callback_name(domain, cbid)
            if isinstance(name, bytes):
                name = name.decode("utf-8", "replace")
            name = str(name) or f"{'driver' if driver else 'runtime'} cbid {cbid}"
        except Exception:  # noqa: BLE001 - an id this CUPTI cannot name: named by number
            name = f"{'driver' if driver else 'runtime'} cbid {cbid}"
        nid = self.api[(kind, cbid)] = self.intern(name)
        return nid

    def api_ids(self, kind: int, cbids: np.ndarray, driver: bool) -> np.ndarray:
        uniq, inv = np.unique(cbids, return_inverse=True)
        ids = np.array([self.api_id(kind, v, driver) for v in uniq.tolist()], np.int32)
        return ids[inv.reshape(-1)]

    def kernel_ids(self, pointers: np.ndarray) -> np.ndarray:  # from the records' (CUPTI-owned) name pointers
        cache = self._pointers
        uniq, inv = np.unique(pointers.astype(np.int64), return_inverse=True)
        ids = np.empty(len(uniq), np.int32)
        for i, p in enumerate(uniq.tolist()):
            nid = cache.get(p)
            if nid is None:
                nid = cache[p] = self.intern(ctypes.string_at(p).decode("utf-8", "replace") if p else "")
            ids[i] = nid
        return ids[inv.reshape(-1)]


class Kinds:  # cupti-python's ActivityKind values, and the record layout read for each
    def __init__(self, c: Any, layouts: dict[str, RecordLayout]) -> None:
        K = c.ActivityKind
        self.kernel, self.kernel2 = int(K.CONCURRENT_KERNEL), int(K.KERNEL)
        self.memcpy, self.memset = int(K.MEMCPY), int(K.MEMSET)
        self.runtime, self.driver, self.external = int(K.RUNTIME), int(K.DRIVER), int(K.EXTERNAL_CORRELATION)
        family = {self.kernel: "kernel", self.kernel2: "kernel", self.memcpy: "memcpy", self.memset: "memset",
                  self.runtime: "api", self.driver: "api", self.external: "external_correlation"}  # fmt: skip
        self.records = {k: layouts[f] for k, f in family.items()}
        self.read_bytes = {k: r.read_bytes for k, r in self.records.items()}


def rows_from_bytes(data: bytes, off: np.ndarray, kinds: Kinds, names: Names) -> np.ndarray:
    """Rows of the records at ``off`` in a buffer: one numpy gather per field from typed views;
    anything not 8-byte aligned (as CUPTI's records are) or out of the buffer raises."""
    n = len(off)
    if n == 0:
        return np.empty(0, ACTIVITY_DTYPE)
    if (off % 8).any() or int(off.min()) < 0:
        raise ValueError("activity records are not 8-byte aligned")
    kind_col = np.frombuffer(data, "<i4", count=len(data) // 4)[off // 4]
    sizes = np.full(n, 4, np.int64)
    for k, end in kinds.read_bytes.items():
        sizes[kind_col == k] = end
    if int((off + sizes).max()) > len(data):
        raise ValueError("an activity record runs past the end of its buffer")
    views: dict[str, np.ndarray] = {}

    def get(offs: np.ndarray, dt: Any, name: str) -> np.ndarray:
        fdt, fo = dt.fields[name][:2]
        w = fdt.itemsize
        if fo % w:
            raise ValueError(f"field {name} at offset {fo} is not aligned to its size {w}")
        v = views.get(fdt.str)
        if v is None:
            v = views[fdt.str] = np.frombuffer(data, fdt, count=len(data) // w)
        return v[(offs + fo) // w]

    out = np.zeros(n, ACTIVITY_DTYPE)
    for f in ("kind", "external_id", "stream_id", "tid", "graph_node_id", "name_id", "device_id", "cbid"):
        out[f] = -1
    for k in np.unique(kind_col).tolist():
        record = kinds.records.get(int(k))
        if record is None:
            continue
        dt = record.dtype
        sel = np.flatnonzero(kind_col == k)
        o = off[sel]
        cols: dict[str, Any] = {"correlation_id": get(o, dt, "correlation_id")}
        if k in (kinds.runtime, kinds.driver):
            cols["kind"] = KIND_DRIVER if k == kinds.driver else KIND_RUNTIME
            cols["cbid"] = get(o, dt, "cbid").astype(np.int64)
            cols["name_id"] = names.api_ids(k, cols["cbid"], k == kinds.driver)
            cols["tid"] = get(o, dt, "thread_id")
        elif k == kinds.external:
            cols["kind"] = KIND_EXTERNAL
            cols["external_id"] = get(o, dt, "external_id").astype(np.int64)
            cols["cbid"] = get(o, dt, "external_kind")
            cols["start_ns"] = cols["end_ns"] = 0
        else:
            if k in (kinds.kernel, kinds.kernel2):
                cols["kind"] = KIND_KERNEL
                cols["name_id"] = names.kernel_ids(get(o, dt, "name"))
            else:
                cols["kind"] = KIND_MEMCPY if k == kinds.memcpy else KIND_MEMSET
                cols["bytes"] = get(o, dt, "bytes").astype(np.int64)
                if k == kinds.memcpy:
                    cols["copy_kind"] = get(o, dt, "copy_kind")
            cols["stream_id"] = get(o, dt, "stream_id")
            cols["graph_node_id"] = get(o, dt, "graph_node_id").astype(np.int64)
            cols["device_id"] = get(o, dt, "device_id")
        if k != kinds.external:
            cols["start_ns"] = get(o, dt, "start").astype(np.int64)
            cols["end_ns"] = get(o, dt, "end").astype(np.int64)
        for f, v in cols.items():
            out[f][sel] = v
    return out[out["kind"] >= 0]


def rows_from_records(activities: Any, kinds: Kinds, names: Names) -> np.ndarray:
    """Rows from cupti-python's record objects, attribute by attribute."""
    k_kernel, k_kernel2, k_copy, k_set = kinds.kernel, kinds.kernel2, kinds.memcpy, kinds.memset
    k_rt, k_drv, k_ext = kinds.runtime, kinds.driver, kinds.external
    ids, api_ids = names.ids, names.api
    out: list[tuple] = []
    app = out.append
    for a in activities:
        k = a.kind
        if k == k_rt or k == k_drv:
            cbid = a.cbid
            nid = api_ids.get((k, cbid))
            if nid is None:
                nid = names.api_id(k, cbid, k == k_drv)
            app((KIND_DRIVER if k == k_drv else KIND_RUNTIME, 0, 0, nid, a.start, a.end, a.correlation_id, -1,
                 -1, a.thread_id, -1, 0, -1, cbid))  # fmt: skip
        elif k == k_ext:
            app((KIND_EXTERNAL, 0, 0, -1, 0, 0, a.correlation_id, a.external_id, -1, -1, -1, 0, -1,
                 a.external_kind))  # fmt: skip
        elif k == k_kernel or k == k_kernel2:
            name = a.name
            nid = ids.get(name)
            if nid is None:
                nid = names.intern(name)
            app((KIND_KERNEL, 0, 0, nid, a.start, a.end, a.correlation_id, -1, a.stream_id, -1,
                 a.graph_node_id, 0, a.device_id, -1))  # fmt: skip
        elif k == k_copy:
            app((KIND_MEMCPY, a.copy_kind, 0, -1, a.start, a.end, a.correlation_id, -1, a.stream_id, -1,
                 a.graph_node_id, a.bytes, a.device_id, -1))  # fmt: skip
        elif k == k_set:
            app((KIND_MEMSET, 0, 0, -1, a.start, a.end, a.correlation_id, -1, a.stream_id, -1,
                 a.graph_node_id, a.bytes, a.device_id, -1))  # fmt: skip
    return np.array(out, dtype=ACTIVITY_DTYPE) if out else np.empty(0, ACTIVITY_DTYPE)


def rows_from_tags(tags: np.ndarray, kinds: Kinds, names: Names, pairs: list[list[int]], tag_kind: int) -> np.ndarray:
    """Rows from the core's launch tags (:data:`TAG_DTYPE`), as CUPTI's records would be: an API
    row per outermost launch call and, inside a stage, an external-correlation row naming it."""
    n = len(tags)
    if not n:
        return np.empty(0, ACTIVITY_DTYPE)
    driver = tags["domain"] == 1
    api = np.zeros(n, ACTIVITY_DTYPE)
    api["kind"] = np.where(driver, KIND_DRIVER, KIND_RUNTIME)
    keys, inverse = np.unique(tags["cbid"].astype(np.int64) * 2 + driver, return_inverse=True)
    name_ids = [names.api_id(kinds.driver if key & 1 else kinds.runtime, key >> 1, bool(key & 1))
                for key in keys.tolist()]  # one name lookup per function, not per call
    api["name_id"] = np.asarray(name_ids, np.int32)[inverse]
    # the tags carry the core's host clock, rows CUPTI's (the pair taken just before covers them)
    coll = to_collector_clock(np.stack([tags["start_ns"], tags["end_ns"]]).ravel(), pairs).reshape(2, n)
    timed = tags["start_ns"] >= 0
    api["start_ns"] = np.where(timed, coll[0], -1)
    api["end_ns"] = np.where(timed, coll[1], -1)
    api["correlation_id"] = tags["correlation_id"]
    api["tid"] = tags["tid"]
    api["cbid"] = tags["cbid"]
    for col in ("external_id", "stream_id", "graph_node_id", "device_id"):
        api[col] = -1
    inside = tags["stage_id"] >= 0
    # the driver call inside a runtime launch is named too: an op with either id finds its stage
    inner = inside & (tags["inner_correlation_id"] != 0)
    ext = np.zeros(int(inside.sum() + inner.sum()), ACTIVITY_DTYPE)
    ext["kind"] = KIND_EXTERNAL
    ext["name_id"] = -1
    ext["correlation_id"] = np.concatenate([tags["correlation_id"][inside], tags["inner_correlation_id"][inner]])
    ext["external_id"] = np.concatenate([tags["stage_id"][inside], tags["stage_id"][inner]])
    for col in ("stream_id", "tid", "graph_node_id", "device_id"):
        ext[col] = -1
    ext["cbid"] = tag_kind
    return np.concatenate([api, ext])


class Converter:
    """A session's buffers -> rows: :func:`rows_from_bytes`, trusted once it matched the record
    objects on the first ``FAST_CHECK_ROWS`` records; the record objects for all if they differ."""

    def __init__(self, c: Any, layouts: dict[str, RecordLayout] | None = None) -> None:
        self.names = Names(c)
        self.kinds = Kinds(c, check_cupti_python(c) if layouts is None else layouts)
        self.fast: bool | None = None  # None: being checked against the record objects
        self.fast_checked = 0
        self.fast_note = "fast path not used yet"
        self.record_free_errors = [0]  # cupti-python's KeyErrors on freeing our record objects, kept off stderr
        self._keep_alive: Any = None

    def convert(self, data: bytes, offs: np.ndarray) -> np.ndarray:
        if self.fast is True:
            return rows_from_bytes(data, offs, self.kinds, self.names)
        if self.fast is False:
            return self.from_objects(data, offs)
        try:
            fast = rows_from_bytes(data, offs, self.kinds, self.names)
        except Exception as exc:  # noqa: BLE001 - any surprise: the record objects, for good
            self.fast = False
            self.fast_note = f"fast path off: {type(exc).__name__}: {exc}"
            return self.from_objects(data, offs)
        head = offs[: max(0, FAST_CHECK_ROWS - self.fast_checked)]
        try:
            slices = []
            for i in range(0, len(head), FAST_CHECK_SLICE):
                slices.append(self.from_objects(data, head[i : i + FAST_CHECK_SLICE]))
                time.sleep(0)  # the GIL to the program's threads between slices
            slow = np.concatenate(slices) if slices else self.from_objects(data, head)
        except Exception as exc:  # noqa: BLE001 - no record objects to check against
            self.fast = True
            self.fast_note = f"fast path on, unchecked (cupti-python record objects unavailable: {type(exc).__name__}: {exc})"
            return fast
        fast_head = fast if len(head) == len(offs) else rows_from_bytes(data, head, self.kinds, self.names)
        bad = [f for f in ACTIVITY_DTYPE.names or () if len(fast_head) != len(slow) or not np.array_equal(fast_head[f], slow[f])]
        if bad:
            self.fast = False
            self.fast_note = f"fast path off: differs from the attribute path in {bad}"
            return self.from_objects(data, offs)
        self.fast_checked += len(head)
        if self.fast_checked >= FAST_CHECK_ROWS:
            self.fast = True
            self.fast_note = f"fast path on (checked against the attribute path on {self.fast_checked} records)"
        else:
            self.fast_note = f"fast path used, checked on all {self.fast_checked} records so far"
        return fast

    def from_objects(self, data: bytes, offs: np.ndarray) -> np.ndarray:
        """Rows through cupti-python's record objects over the buffer (``from_ptr``, as its
        completed-buffer callback would hand them), their free's complaints kept off stderr."""
        with _quiet_record_objects(self.record_free_errors):
            return rows_from_records(self._objects(data, offs), self.kinds, self.names)

    def _objects(self, data: bytes, offs: np.ndarray) -> list[Any]:
        if not len(offs):
            return []
        classes = {k: r.record_class for k, r in self.kinds.records.items()}
        # room for a whole struct after the last record: a newer struct than libcupti wrote stays in our memory
        lo, hi = int(offs.min()), int(offs.max())
        buf = np.zeros(hi - lo + max(int(r.dtype.itemsize) for r in self.kinds.records.values()), np.uint8)
        span = np.frombuffer(data, np.uint8)[lo:]
        buf[: min(len(span), len(buf))] = span[: len(buf)]
        addr = buf.ctypes.data - lo
        kind_col = np.frombuffer(data, "<i4", count=len(data) // 4)[offs // 4]
        out = []
        for o, k in zip(offs.tolist(), kind_col.tolist()):
            cls = classes.get(int(k))
            if cls is not None:
                out.append(cls.from_ptr(addr + o, True))
        self._keep_alive = buf  # the objects point into it until they are converted
        return out
