"""Checks a `maxinstr run` capture of decode_workload.py: warm-up not captured, stages join
the trace by payload id, the window held.   usage: python check_capture.py RUN_DIR [MAX_WINDOW_S]"""
import json
import sys
from pathlib import Path

import numpy as np

import maxinstr
from maxinstr.traces import open_trace

run_dir = Path(sys.argv[1])
max_window_s = float(sys.argv[2]) if len(sys.argv) > 2 else None
launch = json.loads((run_dir / "launch.json").read_text())
trace = open_trace(launch["artifact"]["files"]["trace"])
run = maxinstr.load(run_dir)
names = run["name"].astype(str)
warm = run["warmup"]
strings = np.asarray(trace.strings, dtype=object)
rname = strings[trace.ranges.name_id].astype(str)
kernels = strings[trace.ops.name_id[trace.ops.kind == 0]].astype(str)
ok = True


def check(cond, msg):
    global ok
    print(("PASS " if cond else "FAIL ") + msg)
    ok = ok and bool(cond)


dec = names == "decode"
steady_ids = set(run["id"][dec & ~warm].tolist())
warm_ids = set(run["id"][dec & warm].tolist())
tr_dec = rname == "decode"
payloads = set(trace.ranges.payload[tr_dec].tolist())
print(f"run: {dec.sum()} decode records ({len(warm_ids)} warm-up); trace: {tr_dec.sum()} decode ranges, {len(kernels)} kernels")
check(len(payloads) > 0, "the trace has decode ranges")
check(not (payloads & warm_ids), "no warm-up decode instance is in the trace (by payload id)")
check(payloads <= steady_ids, "every traced decode range joins a steady-state record by payload id")
check(not any("cumsum" in k or "scan" in k.lower() for k in kernels), "the warm-up-only kernel (cumsum) is not in the trace")
check("steady_state" in run.meta and (run.meta.get("capture") or {}).get("started"), "the session started the capture at steady state")
if max_window_s is not None:
    span_s = (trace.ops.end_ns.max() - trace.ops.start_ns.min()) / 1e9
    check(span_s <= max_window_s, f"captured GPU span {span_s:.2f} s <= window bound {max_window_s} s")
    check(len(payloads) < len(steady_ids), f"the window ended the capture early ({len(payloads)} of {len(steady_ids)} steady decode steps)")
print("CHECK", "OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
