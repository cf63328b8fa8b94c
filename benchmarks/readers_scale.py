"""How the non-nsys readers scale: time and peak memory of ``open_trace`` on real fixtures
scaled up by time-shifted copies.

    PYTHONPATH=src python benchmarks/readers_scale.py [--kernels 1000000] [--kineto-copies 300]

* rocprofv3 CSV: the real llama.cpp decode set (144 kernels, 920 HIP calls) copied until it
  holds ``--kernels`` kernels; each copy shifted past the previous one in time, with its
  correlation ids offset so kernels still join their calls.
* Kineto: the real H200 decode trace (4.5k events) copied ``--kineto-copies`` times the
  same way (timestamps, correlation ids and flow ids shifted).

Each read runs in a fresh subprocess so its peak RSS (``os.wait4``'s ``ru_maxrss``) is its own.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

from harness import load_average, run_child

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ROOT / "tests" / "data" / "rocprof" / "rocprofv3_llamacpp_decode"
KINETO = ROOT / "tests" / "data" / "kineto" / "h200_decode.pt.trace.json.gz"


def scale_csv(out: Path, kernels: int) -> None:
    with open(LLAMA / "decode_kernel_trace.csv", newline="") as fh:
        n_kernels = sum(1 for _ in fh) - 1
    copies = max(1, kernels // n_kernels)
    for name in ("decode_kernel_trace.csv", "decode_hip_api_trace.csv"):
        with open(LLAMA / name, newline="") as fh:
            rows = list(csv.reader(fh))
        header, body = rows[0], rows[1:]
        si, ei, ci = (header.index(c) for c in ("Start_Timestamp", "End_Timestamp", "Correlation_Id"))
        span = max(int(r[ei]) for r in body) - min(int(r[si]) for r in body) + 1000
        with open(out / name, "w", newline="") as fh:
            w = csv.writer(fh, quoting=csv.QUOTE_ALL)
            w.writerow(header)
            for k in range(copies):
                for r in body:
                    r2 = list(r)
                    r2[si], r2[ei] = str(int(r[si]) + k * span), str(int(r[ei]) + k * span)
                    r2[ci] = str(int(r[ci]) + k * 100_000)
                    w.writerow(r2)


def scale_kineto(out: Path, copies: int) -> None:
    doc = json.loads(gzip.decompress(KINETO.read_bytes()))
    events = doc["traceEvents"]
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 10
    scaled = [e for e in events if e.get("ph") not in ("X", "s", "f")]
    for k in range(copies):
        for e in events:
            if e.get("ph") in ("X", "s", "f") and isinstance(e.get("ts"), (int, float)):
                e2 = dict(e, ts=round(e["ts"] + k * span, 3))
                if isinstance(e.get("args"), dict) and "correlation" in e["args"]:
                    e2["args"] = dict(e["args"], correlation=e["args"]["correlation"] + k * 100_000)
                if e.get("ph") in ("s", "f"):
                    e2["id"] = e["id"] + k * 100_000
                scaled.append(e2)
    doc["traceEvents"] = scaled
    out.write_text(json.dumps(doc))


_CHILD = """
import json, sys, time
t0 = time.perf_counter()
from maxinstr.traces import open_trace
t = open_trace(sys.argv[1])
dt = time.perf_counter() - t0
print("RESULT " + json.dumps(dict(ops=len(t.ops), calls=len(t.calls), ranges=len(t.ranges), seconds=round(dt, 2))))
"""


def measure(path: Path) -> dict:
    """open_trace in a fresh process: its counts and seconds (import + read), and its peak RSS."""
    run = run_child([sys.executable, "-c", _CHILD, str(path)])
    if run.result is None or run.rc != 0:
        raise SystemExit(f"open_trace({path}) failed: {run.error or 'no RESULT line'}")
    return {**run.result, "peak_mb": round(run.peak_rss_mb)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--kineto-copies", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "csv"
        d.mkdir()
        t0 = time.perf_counter()
        scale_csv(d, args.kernels)
        size = sum(f.stat().st_size for f in d.iterdir()) / 1e6
        print(f"rocprofv3 CSV ({size:.0f} MB, built in {time.perf_counter() - t0:.0f} s):", measure(d))
        k = Path(tmp) / "kineto.json"
        scale_kineto(k, args.kineto_copies)
        print(f"Kineto JSON ({k.stat().st_size / 1e6:.0f} MB):", measure(k))
    print(load_average())


if __name__ == "__main__":
    main()
