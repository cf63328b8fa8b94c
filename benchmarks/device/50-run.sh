#!/usr/bin/env bash
# `maxinstr run`, the deep dive and the server path on the H200 with the real nsys and ncu
# (run from the repo root after run_all.sh installed maxinstr into PYTHONPATH).
#   1. maxinstr run --warm-run on a PyTorch decode loop (session warmup=3, a warm-up-only
#      cumsum kernel): check that no warm-up instance/kernel is in the trace, that traced
#      decode ranges join steady-state records by payload id, that the report prints
#   2. maxinstr deep-dive on run 1's decode stage with the real ncu: verdict, real CSV kept
#   3. the same run with --window 1 on a longer loop: the capture ends after ~1 s (CaptureWindow)
#   4. maxinstr server run: a small GPU HTTP server under nsys launch, one start/stop window
#      around a benchmark client; the window's trace has kernels and "handle" stage ranges
# Results land in $OUT/run/.
set -uo pipefail
out="${OUT:-/tmp/out}/run"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
[ -f .device/nsys-env.sh ] && source .device/nsys-env.sh
W=tests/launch/gpu
rc=0
python3 -c "from maxinstr.launch.env import detect_environment as d; print(*d().summary_lines(), sep='\n')" | tee "$out/env.txt"

echo "== 1. maxinstr run --warm-run (steady-state capture)"
python3 -m maxinstr run -y --warm-run -o "$out/decode" -- python3 $W/decode_workload.py 60 3 > "$out/run-decode.txt" 2>&1 || rc=1
grep -v "^steps" "$out/run-decode.txt" | tail -45
python3 $W/check_capture.py "$out/decode" 2>&1 | tee "$out/check-decode.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

echo "== 2. deep dive (real ncu) on decode's dominant kernel"
python3 -m maxinstr deep-dive "$out/decode" --stage decode --yes --timeout 110 > "$out/deep-dive.txt" 2>&1 || rc=1
cat "$out/deep-dive.txt"
cp "$out/decode/deep-dive/details.csv" "$out/ncu-details.csv" 2>/dev/null
tail -5 "$out/decode/deep-dive/ncu.log" 2>/dev/null

echo "== 3. --window 1 on a longer run"
python3 -m maxinstr run -y --no-report --window 1 -o "$out/window" -- python3 $W/decode_workload.py 200 3 > "$out/run-window.txt" 2>&1 || rc=1
tail -8 "$out/run-window.txt"
python3 $W/check_capture.py "$out/window" 1.6 2>&1 | tee "$out/check-window.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

echo "== 4. server under nsys launch / start / stop"
port=18931
python3 -m maxinstr server run -o "$out/serve" --ready 'Server ready' --ready-timeout 60 \
  --bench "python3 $W/bench.py $port 40" -- python3 $W/gpu_server.py $port > "$out/server.txt" 2>&1 || rc=1
tail -12 "$out/server.txt"
python3 - "$out/serve" <<'PY' 2>&1 | tee "$out/check-server.txt"
import json, sys
import numpy as np
from maxinstr.traces import open_trace
state = json.load(open(f"{sys.argv[1]}/server.json"))
w = state["windows"][0]
tr = open_trace(w["artifact"]["files"]["trace"])
names = np.asarray(tr.strings, dtype=object)[tr.ranges.name_id].astype(str)
handle = int((names == "handle").sum())
print(f"window 1: {len(tr.ops)} GPU ops, {handle} 'handle' ranges, bench {w['bench_status']}")
ok = len(tr.ops) > 0 and 1 <= handle <= 40 and w["bench_status"] == "ok"
print("CHECK", "OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
# keep the tarball small: the .nsys-rep files stay, the exported sqlite of the long run goes
rm -f "$out/window/profile.sqlite" "$out/decode/warm-run/"*.bin 2>/dev/null
du -sh "$out" 2>/dev/null
echo "50-run rc=$rc"
exit $rc
