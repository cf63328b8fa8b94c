"""A trace field of the wrong shape (issue 20, class 4): ``"tid": [1]`` made the Kineto reader
build a 2-D column and the report broadcast it n x n (a 20 MB trace asked for 25.7 GiB).

Property: whatever value (a list, a nested list, an object, a string, a huge number) or absence a
field of every event of a category has, reading the trace gives a valid Trace or a one-line
TraceError naming the file, and reading plus the whole report allocate at most a small multiple
of the input (tracemalloc counts numpy's arrays too)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxinstr.analyze.report import build_report
from maxinstr.errors import TraceError
from maxinstr.traces import open_trace

_WORK = Path(tempfile.mkdtemp(prefix="maxinstr-memory-"))
N_OPS = 4000


def _base(n_ops: int = N_OPS) -> dict:
    """A Kineto trace shaped like torch.profiler's: annotations holding launches of kernels and
    copies (runtime call + GPU op), a few with a cpu_op around them and an ac2g flow."""
    ev: list[dict] = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}}]
    ts = 1000.0
    for i in range(n_ops):
        if i % 30 == 0:
            ev.append({"ph": "X", "cat": "user_annotation", "name": f"step{i // 30 % 4}", "pid": 1, "tid": 1,
                       "ts": ts, "dur": 30 * 12.0})
        copy_op = i % 10 == 0
        if copy_op:
            ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": 1, "tid": 1, "ts": ts, "dur": 4.0})
            ev.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": i + 1, "pid": 1, "tid": 1, "ts": ts + 1})
            ev.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": i + 1, "pid": 0, "tid": 7, "ts": ts + 5, "bp": "e"})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts + 1,
                   "dur": 2.0, "args": {"correlation": i + 1}})
        ev.append({"ph": "X", "cat": "gpu_memcpy" if copy_op else "kernel", "name": f"gemm_kernel_{i % 7}", "pid": 0,
                   "tid": 7, "ts": ts + 5, "dur": 3.0, "args": {"correlation": i + 1, "stream": 7, "device": 0, "bytes": 64}})
        ts += 12.0
    return {"traceEvents": ev, "baseTimeNanoseconds": 1_700_000_000_000_000_000}


BASE = _base()
# reading such a trace peaks at ~7x its size (the parsed JSON); 20x leaves room, an n x n int64
# column of its ops does not fit (checked below)
RATIO = 20
SLACK_BYTES = 4 << 20

CATS = ["user_annotation", "cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "ac2g"]
FIELDS = ["tid", "pid", "ts", "dur", "name", "ph", "args", "args.correlation", "args.stream", "args.device",
          "args.bytes", "args.graph node id", "id"]
VALUES = st.sampled_from([[1], [[1]], [1, 2], [], {"a": 1}, {}, "7", "stream 7", "x" * 300, "", None, True,
                          2**70, -(2**63), 1e300, -1, 0, 1.5, float("nan")])


def _mutated(cat: str, field: str, value, delete: bool) -> bytes:
    doc = copy.deepcopy(BASE)
    for e in doc["traceEvents"]:
        if e.get("cat") != cat:
            continue
        target, key = e, field
        if field.startswith("args."):
            target, key = e.get("args"), field[5:]
            if not isinstance(target, dict):
                continue
        if delete:
            target.pop(key, None)
        else:
            target[key] = copy.deepcopy(value)
    return json.dumps(doc).encode()  # NaN as NaN: Python's json reads it back


def check(data: bytes) -> None:
    folder = _WORK / "case"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    path = folder / "trace.json"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        try:
            trace = open_trace(path)
        except TraceError as exc:
            assert str(folder) in str(exc) and "\n" not in str(exc), str(exc)
            trace = None
        if trace is not None:
            trace.validate()
            for table in (trace.ranges, trace.calls, trace.ops):
                for name in table.__dataclass_fields__:
                    assert getattr(table, name).ndim == 1, name
            build_report(trace=trace)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= RATIO * len(data) + SLACK_BYTES, f"peak {peak / 2**20:.1f} MiB for {len(data) / 2**20:.1f} MiB of input"


def test_list_tid_on_every_kernel_is_not_a_matrix():
    # the input: no args.stream, so the stream comes from a tid that is a list
    doc = copy.deepcopy(BASE)
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["tid"] = [1]
            e.get("args", {}).pop("stream", None)
    check(json.dumps(doc).encode())


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck),
          derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1")
@given(cat=st.sampled_from(CATS), field=st.sampled_from(FIELDS), value=VALUES, delete=st.booleans())
def test_malformed_field_is_an_error_or_a_trace_in_bounded_memory(cat, field, value, delete):
    check(_mutated(cat, field, value, delete))


def test_the_bound_would_catch_a_square():
    assert N_OPS**2 * np.dtype(np.int64).itemsize > 2 * (RATIO * len(json.dumps(BASE)) + SLACK_BYTES)
