"""Cost per activity record of kernels=True's two conversion paths (docs/kernels.md), on a
CUPTI-like buffer of stand-in records (CPU; no GPU or libcupti needed):

    FAKE_CUPTI_LIB=$(cc -shared -fPIC -o /tmp/libcupti.so.fake tests/core/native/fake_cupti.c && echo /tmp/libcupti.so.fake) \
      PYTHONPATH=tests/kernels/fake_cupti:src python benchmarks/cupti_convert.py

Per launch: a runtime API record, an external-correlation record, a kernel record (40 + 24 +
216 bytes, 8-byte packed as CUPTI packs them). Prints ns per record for the attribute path
(cupti-python record objects read field by field) and the fast path (numpy over the bytes),
and their ratio. What cupti-python itself spends making the record objects is not included.
"""

import time, ctypes, numpy as np
from types import SimpleNamespace
from cupti import cupti as fake
from maxinstr.kernels.cupti import CuptiCollector
from maxinstr.kernels.store import ActivityWriter
N = 3000
K, A, E = fake.activity_kernel10_dtype, fake.activity_api_dtype, fake.activity_external_correlation_dtype
buf = np.zeros(N * (A.itemsize + E.itemsize + K.itemsize), np.uint8)
names = [ctypes.create_string_buffer(f"kernel_{j}".encode()) for j in range(20)]
recs = []; off = 0; base = buf.ctypes.data
for i in range(N):
    for dt, kind, vals in ((A, 5, dict(cbid=211, start=i, end=i+1, thread_id=7, correlation_id=i, process_id=1)),
                           (E, 39, dict(external_kind=5, external_id=1000 + i, correlation_id=i)),
                           (K, 10, dict(start=i, end=i+5, device_id=0, stream_id=7, correlation_id=i, name=ctypes.addressof(names[i % 20]), graph_node_id=0))):
        v = buf[off:off + dt.itemsize].view(dt); v["kind"] = kind
        for k, x in vals.items(): v[k] = x
        ns = SimpleNamespace(kind=kind, ptr=base + off, **vals)
        if kind == 10: ns.name = f"kernel_{i % 20}"
        recs.append(ns); off += dt.itemsize
import tempfile
c = CuptiCollector(ActivityWriter(tempfile.mkdtemp(), {})); c._c = fake
res = {}
for name, fn in (("attribute path", c._convert), ("fast path", c._convert_fast)):
    fn(recs)
    best = []
    for _ in range(5):
        t = time.perf_counter()
        fn(recs)
        best.append(time.perf_counter() - t)
    res[name] = min(best) / len(recs) * 1e9
    print(f"{name}: {res[name]:.0f} ns/record")
a, b = c._convert(recs), c._convert_fast(recs)
assert all(np.array_equal(a[f], b[f]) for f in a.dtype.names), "the two paths disagree"
print(f"fast/attribute: {res['fast path'] / res['attribute path']:.2f} ({len(recs)} records, same rows)")
