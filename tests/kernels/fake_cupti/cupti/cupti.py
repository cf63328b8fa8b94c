"""Test-only stand-in for ``cupti.cupti`` (cupti-python): the calls maxinstr.kernels.cupti
makes, with the same names, enum values and record attributes, over a simulated GPU. Which
release it stands in for (its record layouts and classes, functions, and whether freeing a
record object prints) comes from that release's description recorded from the real wheel
(tests/data/cupti/cupti_python/, ``FAKE_CUPTI_VERSION``; below). The external-correlation stack is the real one the stage core pushes to: a compiled
tests/core/native/fake_cupti.c loaded from ``FAKE_CUPTI_LIB`` (a path containing
"libcupti.so", as the collector looks it up in /proc/self/maps). ``launch()`` plays an API call
that launches one op (or a graph of several): it queues the API record, the external-
correlation record for the innermost pushed id of the calling thread, and the op records,
delivered to the completed-buffer callback at the next flush, as CUPTI does: to C callbacks
registered with the library's cuptiActivityRegisterCallbacks (the stage core's native buffers:
each record's bytes are queued in the C library, which fills the buffers), or else to the
Python callbacks registered here (``activity_register_callbacks``), as record objects.
``Activity*.from_ptr`` read a record's fields from its bytes through the true struct layout."""

from __future__ import annotations

import ctypes
import enum
import functools
import inspect
import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np



class _LazyLib:
    """The library, loaded at the first call of any function of this module, as cupti-python
    loads libcupti (not at import): a process that imported cupti but called nothing has no
    libcupti mapped."""

    def __init__(self) -> None:
        self._lib: ctypes.CDLL | None = None

    def load(self) -> ctypes.CDLL:
        if self._lib is None:
            self._lib = ctypes.CDLL(os.environ["FAKE_CUPTI_LIB"], mode=ctypes.RTLD_GLOBAL)
            _setup_native(self._lib)
        return self._lib

    def __getattr__(self, name: str):
        return getattr(self.load(), name)


_LIB = _LazyLib()
_EPOCH = 10**12  # CUPTI's clock is not the host's: a fixed offset


class ActivityKind(enum.IntEnum):
    MEMCPY = 1
    MEMSET = 2
    KERNEL = 3
    DRIVER = 4
    RUNTIME = 5
    CONCURRENT_KERNEL = 10
    EXTERNAL_CORRELATION = 39


class ExternalCorrelationKind(enum.IntEnum):
    INVALID = 0
    UNKNOWN = 1
    OPENACC = 2
    CUSTOM0 = 3
    CUSTOM1 = 4
    CUSTOM2 = 5


class CallbackDomain(enum.IntEnum):
    DRIVER_API = 1
    RUNTIME_API = 2


class Result(enum.IntEnum):
    SUCCESS = 0
    ERROR_QUEUE_EMPTY = 29
    ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39


class cuptiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"{Result(status).name} ({int(status)})")
        self.status = status


class runtime_api_trace_cbid(enum.IntEnum):
    cudaGetLastError_v3020 = 10
    cudaMemcpyAsync_v3020 = 41
    cudaLaunchKernel_v7000 = 211


class driver_api_trace_cbid(enum.IntEnum):
    cuEventRecord = 119
    cuLaunchKernel = 307
    cuGraphLaunch = 514


_DATA = Path(__file__).resolve().parents[3] / "data" / "cupti" / "cupti_python"


def _description(spec: str) -> dict:
    """A release's recorded description (tests/data/cupti/cupti_python/VERSION.json, made from
    the real wheel by tests/kernels/cupti_python_description.py), or a .json file's."""
    path = Path(spec) if spec.endswith(".json") else _DATA / f"{spec}.json"
    return json.loads(path.read_text())


def _dtype(layout: dict) -> np.dtype:
    fields = layout["fields"]
    return np.dtype({"names": list(fields), "formats": [f[0] for f in fields.values()],
                     "offsets": [f[1] for f in fields.values()], "itemsize": layout["itemsize"]})  # fmt: skip


def _newest(desc: dict, family: str) -> np.dtype:
    """The layout of ``family`` a libcupti of that release writes: its newest struct version."""
    found = [(int(m.group(1) or 0), name) for name in desc["layouts"]
             if (m := re.fullmatch(rf"activity_{family}(\d*)_dtype", name))]  # fmt: skip
    return _dtype(desc["layouts"][max(found)[1]])


# What this stand-in is: the cupti-python release FAKE_CUPTI_VERSION (default 13.0.1, CI's and
# the H200's), exposing exactly that release's record layouts (its activity_*_dtype, every field
# at its real offset) and record classes; and the libcupti under it, which writes the newest
# layouts of release FAKE_CUPTI_WRITES (default: the same; pip pairs cupti-python 13.0.1 with
# nvidia-cuda-cupti 13.5, whose records are newer than the layouts that release knows).
DESCRIPTION = _description(os.environ.get("FAKE_CUPTI_VERSION") or "13.0.1")
_WRITES = _description(os.environ.get("FAKE_CUPTI_WRITES") or os.environ.get("FAKE_CUPTI_VERSION") or "13.0.1")
for _name, _layout in DESCRIPTION["layouts"].items():
    globals()[_name] = _dtype(_layout)
_WRITE = {family: _newest(_WRITES, family) for family in ("kernel", "memcpy", "memset", "api", "external_correlation")}
_API_BYTES = _WRITE["api"]
if os.environ.get("FAKE_CUPTI_BAD_LAYOUT"):  # the API dtype handed out disagrees with the bytes written
    _bad = json.loads(json.dumps(DESCRIPTION["layouts"]["activity_api_dtype"]))
    _bad["fields"]["start"][1], _bad["fields"]["end"][1] = _bad["fields"]["end"][1], _bad["fields"]["start"][1]
    activity_api_dtype = _dtype(_bad)
_NATIVE = False  # set when the library loads: a build without the native-buffer calls has the Python callbacks only


def _setup_native(lib: ctypes.CDLL) -> None:
    global _NATIVE
    _NATIVE = hasattr(lib, "cuptiActivityRegisterCallbacks")
    if not _NATIVE:
        return
    lib.fake_cupti_queue.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.fake_cupti_set_size.argtypes = [ctypes.c_int, ctypes.c_size_t]
    lib.cuptiActivityFlushAll.argtypes = [ctypes.c_uint32]
    for k, dt in ((ActivityKind.CONCURRENT_KERNEL, _WRITE["kernel"]), (ActivityKind.KERNEL, _WRITE["kernel"]),
                  (ActivityKind.MEMCPY, _WRITE["memcpy"]), (ActivityKind.MEMSET, _WRITE["memset"]),
                  (ActivityKind.RUNTIME, _API_BYTES), (ActivityKind.DRIVER, _API_BYTES),
                  (ActivityKind.EXTERNAL_CORRELATION, _WRITE["external_correlation"])):  # fmt: skip
        lib.fake_cupti_set_size(int(k), dt.itemsize)


def _native_buffers() -> bool:
    return _NATIVE and bool(_LIB.fake_cupti_native_registered())


# the frame the real KeyError comes from (cupti-python's buffer_manager.pyx, line 31)
_BUFFER_MANAGER_RAISE = compile("\n" * 30 + "raise KeyError(key)", "cupti/buffer_manager.pyx", "exec")


class _Record:
    """A record object over a record's bytes (what cupti-python's from_ptr gives)."""

    _dtype: np.dtype

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr
        self._rec = np.frombuffer((ctypes.c_uint8 * self._dtype.itemsize).from_address(ptr), self._dtype)[0]

    @classmethod
    def from_ptr(cls, ptr: int, readonly: bool = False):
        STATE["from_ptr"] = STATE.get("from_ptr", 0) + 1
        obj = cls(ptr)
        obj._foreign = True
        return obj

    def __del__(self) -> None:
        # cupti-python 13.0.x (record_free_prints in its description): freeing a record object
        # made over a buffer its BufferManager did not allocate (from_ptr over ours) raises KeyError
        # in __dealloc__, which Cython reports through sys.excepthook and then sys.unraisablehook:
        # two tracebacks on stderr per record. 13.2 and later have no BufferManager.
        if self.__dict__.get("_foreign") and DESCRIPTION["record_free_prints"]:
            try:
                exec(_BUFFER_MANAGER_RAISE, {"key": self.ptr})
            except KeyError:
                sys.excepthook(*sys.exc_info())
                raise


    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        v = self._rec[name]
        if name == "name":
            return ctypes.string_at(int(v)).decode()
        return int(v)


def _record_class(name: str) -> type:
    """The record class ``name`` of the release: ActivityKernel10 reads its fields through the
    release's activity_kernel10_dtype (its compiled struct: the true one, FAKE_CUPTI_BAD_LAYOUT
    or not)."""
    stem = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name[len("Activity"):]).lower()
    return type(name, (_Record,), {"_dtype": _dtype(DESCRIPTION["layouts"][f"activity_{stem}_dtype"])})


for _name in DESCRIPTION["classes"]:
    globals()[_name] = _record_class(_name)


_KEEP: list = []  # record bytes and kernel names stay alive, as CUPTI's buffers do during the callback


def _record(ns: SimpleNamespace, dtype: np.dtype, **raw) -> SimpleNamespace:
    """Give the record real bytes in the struct layout and a ``ptr`` to them, as cupti-python's
    record objects have; a record object carries the same values as attributes."""
    buf = np.zeros(1, dtype)
    for f in dtype.names:
        if f in raw or hasattr(ns, f):
            buf[f] = raw[f] if f in raw else getattr(ns, f)
    if _native_buffers():  # the record goes to the C library's buffers
        _LIB.fake_cupti_queue(buf.ctypes.data, dtype.itemsize)
        ns.native = True
        return ns
    if not os.environ.get("FAKE_CUPTI_NO_PTR"):
        ns.raw = buf.view(np.uint8)  # laid out in one buffer (and given its ptr) when delivered
    return ns


STATE = {"sub": None, "enabled": set(), "cb": None, "quiet": [], "pending": [], "corr": 0, "dropped": 0, "buffers": 0}
_lock = threading.Lock()


def subscribe(callback, userdata):
    if os.environ.get("FAKE_CUPTI_HELD") or STATE["sub"] is not None:
        raise cuptiError(Result.ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
    STATE["sub"] = object()
    return STATE["sub"]


def unsubscribe(subscriber):
    assert subscriber is STATE["sub"]
    STATE["sub"] = None


def activity_register_callbacks(requested, completed):
    STATE["cb"] = (requested, completed)


def activity_enable(kind):
    STATE["enabled"].add(int(kind))


def activity_disable(kind):
    STATE["enabled"].discard(int(kind))


def activity_enable_driver_api(cbid, enable):
    STATE["quiet"].append(("driver", int(cbid), int(enable)))


def activity_enable_runtime_api(cbid, enable):
    STATE["quiet"].append(("runtime", int(cbid), int(enable)))


def get_timestamp():
    return time.monotonic_ns() + _EPOCH


def get_callback_name(domain, cbid):
    enum_cls = driver_api_trace_cbid if int(domain) == CallbackDomain.DRIVER_API else runtime_api_trace_cbid
    return enum_cls(cbid).name.split("_v")[0]


def activity_pop_external_correlation_id(kind):
    last = ctypes.c_uint64(0)
    if _LIB.cuptiActivityPopExternalCorrelationId(int(kind), ctypes.byref(last)) != 0:
        raise cuptiError(Result.ERROR_QUEUE_EMPTY)
    return last.value


def activity_get_num_dropped_records(context, stream_id, dropped_ptr):
    ctypes.c_size_t.from_address(dropped_ptr).value = STATE["dropped"]


def activity_flush_all(flag):
    if _native_buffers():
        return _LIB.cuptiActivityFlushAll(int(flag))
    requested, completed = STATE["cb"]
    size, _ = requested()
    assert size > 0
    with _lock:
        batch, STATE["pending"] = STATE["pending"], []
    if batch:
        if all(hasattr(r, "raw") for r in batch):  # one contiguous buffer, as CUPTI's
            arena = np.concatenate([r.raw for r in batch])
            _KEEP.append(arena)
            pos = arena.ctypes.data
            for r in batch:
                r.ptr = pos
                pos += len(r.raw)
        STATE["buffers"] += 1
        completed(batch)


def cbid_for(api: str, kind: str, graph_nodes: int) -> int:
    if api == "runtime":
        return runtime_api_trace_cbid.cudaMemcpyAsync_v3020 if kind == "memcpy" else runtime_api_trace_cbid.cudaLaunchKernel_v7000
    return driver_api_trace_cbid.cuGraphLaunch if graph_nodes else driver_api_trace_cbid.cuLaunchKernel


def launch(name: str, kind: str = "kernel", dur_ns: int = 1000, api: str = "runtime", graph_nodes: int = 0,
           nbytes: int = 0) -> int | None:
    """One API call launching GPU work now, on the calling thread. Returns its correlation id
    (None when activity is off)."""
    if ActivityKind.CONCURRENT_KERNEL not in STATE["enabled"]:
        return None
    with _lock:
        STATE["corr"] += 1
        corr = STATE["corr"]
    top = ctypes.c_uint64(0)
    top_kind = _LIB.fake_cupti_top(ctypes.byref(top))
    t = get_timestamp()
    recs = []
    # as CUPTI: an API record (and so its external correlation) only while its kind is on
    if (ActivityKind.RUNTIME if api == "runtime" else ActivityKind.DRIVER) not in STATE["enabled"]:
        top_kind = 0
    elif api == "runtime":
        cbid = runtime_api_trace_cbid.cudaMemcpyAsync_v3020 if kind == "memcpy" else runtime_api_trace_cbid.cudaLaunchKernel_v7000
        recs.append(_record(SimpleNamespace(kind=ActivityKind.RUNTIME, cbid=int(cbid), start=t, end=t + 300, correlation_id=corr,
                                            thread_id=threading.get_native_id(), process_id=os.getpid()), _API_BYTES))  # fmt: skip
    else:
        cbid = driver_api_trace_cbid.cuGraphLaunch if graph_nodes else driver_api_trace_cbid.cuLaunchKernel
        recs.append(_record(SimpleNamespace(kind=ActivityKind.DRIVER, cbid=int(cbid), start=t, end=t + 300, correlation_id=corr,
                                            thread_id=threading.get_native_id(), process_id=os.getpid()), _API_BYTES))  # fmt: skip
    # a subscriber's callback on this function (the stage core's launch tags), as the driver would
    _LIB.fake_cupti_call(2 if api == "runtime" else 1, int(cbid_for(api, kind, graph_nodes)), corr)
    if top_kind:
        recs.append(_record(SimpleNamespace(kind=ActivityKind.EXTERNAL_CORRELATION, correlation_id=corr, external_id=top.value,
                                            external_kind=top_kind), _WRITE["external_correlation"]))  # fmt: skip
    start = t + 5_000
    for g in range(max(1, graph_nodes)):
        common = dict(start=start, end=start + dur_ns, correlation_id=corr, stream_id=7, device_id=0,
                      graph_node_id=(100 + g) if graph_nodes else 0)  # fmt: skip
        if kind == "kernel":
            cname = ctypes.create_string_buffer(name.encode())
            _KEEP.append(cname)
            recs.append(_record(SimpleNamespace(kind=ActivityKind.CONCURRENT_KERNEL, name=name, **common), _WRITE["kernel"],
                                name=ctypes.addressof(cname)))  # fmt: skip
        elif kind == "memcpy":
            recs.append(_record(SimpleNamespace(kind=ActivityKind.MEMCPY, copy_kind=1, bytes=nbytes, **common), _WRITE["memcpy"]))
        else:
            recs.append(_record(SimpleNamespace(kind=ActivityKind.MEMSET, bytes=nbytes, **common), _WRITE["memset"]))
        start += dur_ns + 100
    recs = [r for r in recs if not getattr(r, "native", False)]
    with _lock:
        STATE["pending"] += recs
    return corr


def buffers() -> int:
    """Buffers delivered so far, both ways."""
    return STATE["buffers"] + (int(_LIB.fake_cupti_buffers()) if _NATIVE else 0)


def _loading(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        _LIB.load()
        return fn(*args, **kwargs)

    return call


for _name, _fn in list(globals().items()):
    if inspect.isfunction(_fn) and _fn.__module__ == __name__ and not _name.startswith("_"):
        globals()[_name] = _loading(_fn)
for _name, _present in DESCRIPTION["functions"].items():  # as the release has them
    if not _present:
        globals().pop(_name, None)
