"""How the non-nsys readers scale: time and peak memory of ``open_trace`` on real fixtures
scaled up by time-shifted copies.

    PYTHONPATH=src python benchmarks/readers_scale.py [--kernels 1000000] [--kineto-copies 300]
        [--v1-copies 10000] [--v1-json-copies 2000] [--rpd-json-copies 20]

* rocprofv3 CSV: the real llama.cpp decode set (144 kernels, 920 HIP calls) copied until it
  holds ``--kernels`` kernels; each copy shifted past the previous one in time, with its
  correlation ids offset so kernels still join their calls.
* Kineto: the real H200 decode trace (4.5k events) copied ``--kineto-copies`` times the
  same way (timestamps, correlation ids and flow ids shifted).

* rocprof v1: the real Kokkos run's results.db (9 rocTX, 104 HIP, 14 OPS, 30 COPY rows) and
  results.json copied ``--v1-copies`` / ``--v1-json-copies`` times (times, Index and flow ids
  shifted; in the JSON the microsecond ``ts`` of events and flows too).
* RPD's Chrome export: the rpd2tracing export of the real mytrace.rpd copied
  ``--rpd-json-copies`` times (times and flow ids shifted).

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
V1 = ROOT / "tests" / "data" / "rocprof" / "rocprof_v1_kokkos"
RPD_JSON = ROOT / "tests" / "data" / "rocprof" / "rpd" / "mytrace_rpd2tracing.json.gz"


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


def scale_v1_db(out: Path, copies: int) -> None:
    import shutil
    import sqlite3

    shutil.copyfile(V1 / "results.db", out)
    con = sqlite3.connect(out)
    span = 10**9  # the run spans 0.57 s: each copy starts 1 s after the previous one
    for table in ("rocTX", "HIP", "OPS", "COPY"):
        cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
        rows = con.execute(f'SELECT * FROM "{table}"').fetchall()
        bi, ei = cols.index("BeginNs"), cols.index("EndNs")
        ii = cols.index("Index")
        marks = ",".join("?" * len(cols))
        for k in range(1, copies):
            con.executemany(f'INSERT INTO "{table}" VALUES ({marks})', [
                tuple(v + k * span if j in (bi, ei) else (v + k * 1000 if j == ii and table != "rocTX" else v)
                      for j, v in enumerate(r)) for r in rows])
    con.commit()
    con.close()


def scale_v1_json(out: Path, copies: int) -> None:
    doc = json.loads((V1 / "results.json").read_text())
    events = doc["traceEvents"]
    span_us, span_ns = 10**6, 10**9
    scaled = [e for e in events if e.get("ph") == "M"]
    n_flows = 1 + max(e["id"] for e in events if e.get("ph") in ("s", "t"))
    for k in range(copies):
        for e in events:
            ph = e.get("ph")
            if ph == "X":
                args = dict(e["args"], BeginNs=str(int(e["args"]["BeginNs"]) + k * span_ns),
                            EndNs=str(int(e["args"]["EndNs"]) + k * span_ns))
                scaled.append(dict(e, ts=str(int(e["ts"]) + k * span_us), args=args))
            elif ph in ("s", "t"):
                scaled.append(dict(e, ts=e["ts"] + k * span_us, id=e["id"] + k * n_flows))
    doc["traceEvents"] = scaled
    out.write_text(json.dumps(doc))


def scale_rpd_json(out: Path, copies: int) -> None:
    doc = json.loads(gzip.decompress(RPD_JSON.read_bytes()))
    events = doc["traceEvents"]
    timed = [float(e["ts"]) for e in events if e.get("ph") in ("X", "i") and "ts" in e]
    span = round(max(timed) - min(timed)) + 1000  # us
    scaled = [e for e in events if e.get("ph") == "M"]
    for k in range(copies):
        for e in events:
            if e.get("ph") in ("X", "i", "s", "f") and "ts" in e:
                e2 = dict(e, ts=f"{float(e['ts']) + k * span:.3f}")
                if e.get("ph") in ("s", "f"):
                    e2["id"] = f"{e['id']}-{k}"
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
    ap.add_argument("--v1-copies", type=int, default=10_000)
    ap.add_argument("--v1-json-copies", type=int, default=2_000)
    ap.add_argument("--rpd-json-copies", type=int, default=20)
    ap.add_argument("--only", choices=["csv", "kineto", "amd-chrome"], default=None,
                    help="run one group: rocprofv3 CSV, Kineto, or rocprof v1 + RPD export")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "csv"):
            d = Path(tmp) / "csv"
            d.mkdir()
            t0 = time.perf_counter()
            scale_csv(d, args.kernels)
            size = sum(f.stat().st_size for f in d.iterdir()) / 1e6
            print(f"rocprofv3 CSV ({size:.0f} MB, built in {time.perf_counter() - t0:.0f} s):", measure(d))
        if args.only in (None, "kineto"):
            k = Path(tmp) / "kineto.json"
            scale_kineto(k, args.kineto_copies)
            print(f"Kineto JSON ({k.stat().st_size / 1e6:.0f} MB):", measure(k))
        if args.only in (None, "amd-chrome"):
            db = Path(tmp) / "results.db"
            scale_v1_db(db, args.v1_copies)
            print(f"rocprof v1 results.db x{args.v1_copies} ({db.stat().st_size / 1e6:.0f} MB):", measure(db))
            js = Path(tmp) / "v1" / "results.json"
            js.parent.mkdir()
            scale_v1_json(js, args.v1_json_copies)
            print(f"rocprof v1 results.json x{args.v1_json_copies} ({js.stat().st_size / 1e6:.0f} MB):", measure(js))
            rj = Path(tmp) / "rpd.json"
            scale_rpd_json(rj, args.rpd_json_copies)
            print(f"RPD export x{args.rpd_json_copies} ({rj.stat().st_size / 1e6:.0f} MB):", measure(rj))
    print(load_average())


if __name__ == "__main__":
    main()
