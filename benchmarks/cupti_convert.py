"""Cost per activity record of kernels=True's record handling (docs/kernels.md), on a
CUPTI-like buffer of stand-in records (CPU; no GPU or libcupti needed):

    cc -shared -fPIC -o /tmp/libcupti.so.fake tests/core/native/fake_cupti.c -lpthread
    FAKE_CUPTI_LIB=/tmp/libcupti.so.fake PYTHONPATH=tests/kernels/fake_cupti python benchmarks/cupti_convert.py

Per launch: a runtime API record, an external-correlation record, a kernel record (40 + 24 +
216 bytes, 8-byte packed as CUPTI packs them). Prints ns per record, best of 5, for:

* ``attribute path``: rows from record objects read field by field (what the first collector
  did in cupti-python's buffer callback, on CUPTI's thread, holding the GIL);
* ``python callback``: what the callback does now when cupti-python's callbacks are used (copy
  the buffer's bytes and the record offsets, queue them);
* ``native take``: the stage core's buffers (C callbacks, no Python on CUPTI's thread): a flush
  of the stand-in libcupti, then ``_native.cupti_take()`` (walk with GetNextRecord + copy);
* ``fast path``: numpy over the bytes (cupti-python's struct dtypes), on the flusher thread.

What cupti-python spends making its record objects (python callbacks only) and CUPTI's own
cost are not included; the H200 overhead run measures everything together.
"""

import ctypes
import os
import tempfile
from types import SimpleNamespace

import numpy as np
from cupti import cupti as fake

from harness import time_calls_ns
from maxinstr import _native
from maxinstr.kernels.convert import Converter, rows_from_bytes, rows_from_records
from maxinstr.kernels.cupti import CuptiCollector
from maxinstr.rundir.activity import ActivityWriter

N = 3000
K, A, E = fake.activity_kernel10_dtype, fake.activity_api_dtype, fake.activity_external_correlation_dtype
buf = np.zeros(N * (A.itemsize + E.itemsize + K.itemsize), np.uint8)
names = [ctypes.create_string_buffer(f"kernel_{j}".encode()) for j in range(20)]
recs = []
offs = []
off = 0
base = buf.ctypes.data
for i in range(N):
    for dt, kind, vals in ((A, 5, dict(cbid=211, start=i, end=i + 1, thread_id=7, correlation_id=i, process_id=1)),
                           (E, 39, dict(external_kind=5, external_id=1000 + i, correlation_id=i)),
                           (K, 10, dict(start=i, end=i + 5, device_id=0, stream_id=7, correlation_id=i,
                                        name=ctypes.addressof(names[i % 20]), graph_node_id=0))):  # fmt: skip
        v = buf[off : off + dt.itemsize].view(dt)
        v["kind"] = kind
        for k, x in vals.items():
            v[k] = x
        ns = SimpleNamespace(kind=kind, ptr=base + off, **vals)
        if kind == 10:
            ns.name = f"kernel_{i % 20}"
        recs.append(ns)
        offs.append(off)
        off += dt.itemsize
data, offs_a = buf.tobytes(), np.array(offs, np.int64)
c = CuptiCollector(ActivityWriter(tempfile.mkdtemp(), {}))
c._c, c._conv = fake, Converter(fake)


def best(fn, reps: int = 5) -> float:
    """ns per record of the fastest of ``reps`` calls, after one untimed call."""
    return min(time_calls_ns(fn, reps, warmup=1)) / len(recs)


def callback() -> None:
    c._buffer_completed(recs)
    c._raw, c._raw_bytes = [], 0


res = {"attribute path": best(lambda: rows_from_records(recs, c._conv.kinds, c._conv.names)),
       "python callback": best(callback)}
if fake._NATIVE and _native.cupti_buffers(os.environ["FAKE_CUPTI_LIB"], 16 << 20, 512 << 20):
    fake._LIB.fake_cupti_set_size(10, K.itemsize)

    def native_take() -> None:
        fake._LIB.fake_cupti_queue(base, len(data))
        fake._LIB.cuptiActivityFlushAll(0)
        got = _native.cupti_take()
        assert sum(len(o) // 8 for _, o in got) == len(recs)

    res["native take"] = best(native_take)
res["fast path"] = best(lambda: rows_from_bytes(data, offs_a, c._conv.kinds, c._conv.names))
a, b = rows_from_records(recs, c._conv.kinds, c._conv.names), rows_from_bytes(data, offs_a, c._conv.kinds, c._conv.names)
assert all(np.array_equal(a[f], b[f]) for f in a.dtype.names), "the two paths disagree"
for k, v in res.items():
    print(f"{k:16} {v:7.0f} ns/record")
flusher = res.get("native take", 0) + res["fast path"]
on_cupti = "0 ns (native buffers)" if "native take" in res else f"{res['python callback']:.0f} ns (python callback)"
print(f"on CUPTI's thread, per record: attribute path {res['attribute path']:.0f} ns -> {on_cupti}")
print(f"on the flusher thread (GIL held), per record: {flusher:.0f} ns; per 32-launch step (96 records): "
      f"{flusher * 96 / 1e3:.1f} us ({len(recs)} records, both paths give the same rows)")
