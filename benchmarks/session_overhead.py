"""What an open session adds per stage: the records are taken and written as they complete.

    python benchmarks/session_overhead.py [--n 200000] [--reps 7] [--threads 1]

Prints the median ns per stage enter+exit (host clock only, no GPU) with no session (records
drained afterwards, untimed) and inside a session writing a run directory, once with the
core's native writer thread (the default) and once with the Python flusher writing
(MAXINSTR_NATIVE_WRITER=0), the three interleaved rep by rep in a rotated order (after an
untimed warm-up); the records each session dropped
(buffer full); and the Python flusher's cost per record measured directly (drain + write of
one large batch).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import maxinstr
from harness import interleave
from maxinstr import _native
from maxinstr.rundir import format as fmt
from maxinstr.rundir.writer import PartWriter


def loop(n: int, threads: int) -> float:
    def work() -> None:
        st = maxinstr.stage
        for _ in range(n):
            with st("x"):
                pass

    pool = [threading.Thread(target=work) for _ in range(threads)]
    t0 = time.perf_counter_ns()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return (time.perf_counter_ns() - t0) / (n * threads)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="maxinstr-bench"))
    writers = {"session, native writer": "1", "session, python writer": "0"}
    dropped: dict[str, int] = {"no session": 0, **dict.fromkeys(writers, 0)}
    saved = os.environ.get("MAXINSTR_NATIVE_WRITER")

    def measure(key: str, rep: int) -> float:
        if key == "no session":
            ns = loop(args.n, args.threads)
            _native.drain(-1)
            return ns
        env = writers[key]
        os.environ["MAXINSTR_NATIVE_WRITER"] = env
        with maxinstr.session(tmp / f"run{rep}-{env}", sample_hz=0) as s:
            ns = loop(args.n, args.threads)
        part = json.loads((tmp / f"run{rep}-{env}" / "parts" / s.part / "part.json").read_text())
        dropped[key] += int(part.get("dropped_records", 0))
        return ns

    loop(min(args.n, 1000), args.threads)  # warm: first calls, first buffers
    _native.drain(-1)
    try:
        res = interleave(list(dropped), args.reps, measure)
    finally:
        if saved is None:
            os.environ.pop("MAXINSTR_NATIVE_WRITER", None)
        else:
            os.environ["MAXINSTR_NATIVE_WRITER"] = saved
    for k, v in res.items():
        extra = f", dropped {dropped[k]}" if k != "no session" else ""
        print(f"{k:>22}: median {statistics.median(v):7.0f} ns per stage ({args.threads} thread(s), {args.reps} reps of {args.n}{extra})")

    w = PartWriter(tmp / "bench-part", {"part": "bench"}, fsync_interval_s=-1)
    w.open()
    for _ in range(args.n):
        with maxinstr.stage("x"):
            pass
    t0 = time.perf_counter_ns()
    data, names, attrs = _native.drain(-1)
    t1 = time.perf_counter_ns()
    rows = np.frombuffer(data, dtype=fmt.STAGE_DTYPE)
    w.write(rows, dict(names), attrs)
    t2 = time.perf_counter_ns()
    print(f"flusher cost: drain {(t1 - t0) / len(rows):.0f} ns/record, write {(t2 - t1) / len(rows):.0f} ns/record ({len(rows)} records)")


if __name__ == "__main__":
    main()
