"""What an open session adds per stage: the flusher drains and writes every record.

    python benchmarks/session_overhead.py [--n 200000] [--reps 7] [--threads 1]

Prints the median ns per stage enter+exit (host clock only, no GPU) with no session (records
drained afterwards, untimed) and inside a session writing a run directory, plus the flusher's
cost per record measured directly (drain + write of one large batch).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import maxinstr
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
    res: dict[str, list[float]] = {"no session": [], "session": []}
    for rep in range(args.reps):
        res["no session"].append(loop(args.n, args.threads))
        _native.drain(-1)
        with maxinstr.session(tmp / f"run{rep}", sample_hz=0):
            res["session"].append(loop(args.n, args.threads))
    for k, v in res.items():
        print(f"{k:>10}: median {statistics.median(v):7.0f} ns per stage ({args.threads} thread(s), {args.reps} reps of {args.n})")

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
