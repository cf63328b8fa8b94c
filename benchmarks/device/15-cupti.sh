#!/usr/bin/env bash
# In-process kernels (session kernels=True, CUPTI) on the H200 -- issue 9's proof. Run from the
# repo root after run_all.sh put maxinstr and the .whl/ wheels (cupti-python) on PYTHONPATH:
#   bash benchmarks/device/run_all.sh cupti        (carry .whl and .device)
# Results in $OUT/cupti/:
#   check.txt     1. the workload of benchmarks/cupti_check.py with kernels=True, and the same
#                    kernels=True workload under nsys (where it falls back: see 2); per-stage
#                    kernel counts, launches and GPU ns from our in-process records vs the nsys
#                    SQLite + attribution. Look for "RESULT kernels: PASS" (counts equal, kernel
#                    times within 1%) and "RESULT copies/sets: PASS" (counts and bytes equal,
#                    times within 1% or within the printed run-to-run noise floor).
#   check-records.txt  the same comparison for MAXINSTR_CUPTI_TAGS=0 (API + external-correlation
#                    records instead of kernels=True's default launch tags), same nsys capture.
#   noise.txt        the same table for two kernels=True runs (run-to-run GPU time noise); the
#                    second run is check.txt's --noise run.
#   activity-inproc.json  the collector's activity.json (buffers_by "native", fast_path, rows).
#   fallback.txt  2. that run under nsys: the one plain warning (CUPTI held by nsys),
#                    activity.json status "unavailable", the report's note, and the report
#                    built from the nsys trace. Look for "maxinstr: kernels=True:" and "fallback: OK".
#   overhead.txt  3. benchmarks/cupti_overhead.py: bare / stages / kernels / nsys / torch.profiler,
#   overhead.json    small-kernel step and >= 1 ms step, ratios to bare: fresh processes
#                    (CUPTI_ROUNDS), then one process each for maxinstr (CUPTI_AB_ROUNDS),
#                    torch.profiler and nsys (CUPTI_PEER_ROUNDS) with rotated blocks.
#                    CUPTI_CHECKS=0 runs this part only.
#   fixture/      4. the raw activity files of the in-process run (activity.bin, activity_names.jsonl,
#                    activity.json, stages.bin, strings.jsonl, part.json, meta.json, expected.json):
#                    copy to tests/data/cupti/h200_small/ (tests/kernels/test_inprocess_fixture.py).
#   versions.txt  cupti-python, nvidia-cuda-cupti, the libcupti it loaded.
set -uo pipefail
out="${OUT:-/tmp/out}/cupti"
rm -rf "$out" && mkdir -p "$out"
export PYTHONUNBUFFERED=1
# no LD_LIBRARY_PATH for libcupti: torch and cupti-python must load the same file (nvidia/cu13/lib)
[ -f .device/nsys-env.sh ] && source .device/nsys-env.sh
work=/tmp/cupti-work && rm -rf "$work" && mkdir -p "$work"
rc=0

python3 - > "$out/versions.txt" 2>&1 <<'PY'
import importlib.metadata as md
for d in ("cupti-python", "nvidia-cuda-cupti", "cuda-bindings", "torch", "cupy-cuda13x"):
    try: print(d, md.version(d))
    except Exception as e: print(d, "missing", e)
try:
    import torch
    torch.zeros(1, device="cuda")
    from cupti import cupti
    print("cupti import ok; timestamp", cupti.get_timestamp())
    print("libcupti mapped:", sorted({l.split()[-1] for l in open("/proc/self/maps") if "libcupti" in l}))
except Exception as e:
    print("cupti import/use failed:", type(e).__name__, e)
PY
cat "$out/versions.txt"

if [ "${CUPTI_CHECKS:-1}" = 1 ]; then  # CUPTI_CHECKS=0: the overhead benchmark (3.) only
echo "== 1. kernels=True in-process, and the same kernels=True workload under nsys"
# Under nsys the collector must fall back (2.), so that run is also the nsys reference for (1.).
timeout 60 python3 benchmarks/cupti_check.py run "$work/inproc" --kernels > "$out/inproc.log" 2>&1 || { echo "in-process run failed"; rc=1; }
tail -5 "$out/inproc.log"
cat "$work"/inproc/parts/*/activity.json 2>/dev/null | head -c 1500; echo
# a second kernels=True run: the run-to-run noise floor of copy/set times (compare --noise)
timeout 60 python3 benchmarks/cupti_check.py run "$work/inproc2" --kernels > "$out/inproc2.log" 2>&1 || echo "second in-process run failed"
noise=(); [ -d "$work/inproc2" ] && noise=(--noise "$work/inproc2")
if command -v nsys >/dev/null; then
  NSYS="nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none -f true"
  timeout 90 $NSYS -o "$work/nsys" python3 benchmarks/cupti_check.py run "$work/nsysrun" --kernels > "$out/fallback.txt" 2>&1 || { echo "nsys run failed"; rc=1; }
  timeout 60 nsys export --type sqlite -f true -o "$work/nsys.sqlite" "$work/nsys.nsys-rep" > "$out/nsys-export.log" 2>&1 || rc=1
  timeout 60 python3 benchmarks/cupti_check.py compare "$work/inproc" "$work/nsysrun" "$work/nsys.sqlite" ${noise[@]+"${noise[@]}"} 2>&1 | tee "$out/check.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
else
  echo "nsys not on PATH (carry .device): comparison and fallback skipped" | tee "$out/check.txt"; rc=1
fi
# check.txt is kernels=True's default (launch tags); the other path too, against the same capture
echo "-- API + external-correlation records (MAXINSTR_CUPTI_TAGS=0): the same workload, the same nsys capture"
MAXINSTR_CUPTI_TAGS=0 timeout 60 python3 benchmarks/cupti_check.py run "$work/records" --kernels > "$out/records.log" 2>&1 || echo "records run failed"
if [ -f "$work/nsys.sqlite" ] && [ -d "$work/records" ]; then
  timeout 60 python3 benchmarks/cupti_check.py compare "$work/records" "$work/nsysrun" "$work/nsys.sqlite" ${noise[@]+"${noise[@]}"} 2>&1 | tee "$out/check-records.txt" | tail -4
  cat "$work"/records/parts/*/activity.json > "$out/activity-records.json" 2>/dev/null
fi
echo "-- noise floor: the second kernels=True run against the first (same comparison, no nsys)"
[ -d "$work/inproc2" ] && timeout 60 python3 benchmarks/cupti_check.py compare "$work/inproc2" "$work/inproc" - 2>&1 | tail -14 | tee "$out/noise.txt"
cat "$work"/inproc/parts/*/activity.json > "$out/activity-inproc.json" 2>/dev/null
timeout 60 python3 -m maxinstr report "$work/inproc" > "$out/report-inproc.txt" 2>&1 || true
head -45 "$out/report-inproc.txt"

echo "== 4. (early, before the long part) fixture: raw activity files of the in-process run"
timeout 60 python3 benchmarks/cupti_check.py dump "$work/inproc" "$out/fixture" 2>&1 | tail -3 || rc=1
ls -la "$out/fixture" 2>/dev/null

echo "== 2. the single-subscriber fallback (the kernels=True run under nsys above)"
if command -v nsys >/dev/null; then
  grep -n "kernels=True" "$out/fallback.txt" | head -3
  cat "$work"/nsysrun/parts/*/activity.json >> "$out/fallback.txt" 2>&1
  python3 - "$work/nsysrun" "$work/nsys.sqlite" >> "$out/fallback.txt" 2>&1 <<'PY' || rc=1
import json, sys, pathlib
run = pathlib.Path(sys.argv[1])
k = json.loads((run / "meta.json").read_text()).get("kernels")
print("meta.json kernels:", k)
act = [json.loads(p.read_text()) for p in run.glob("parts/*/activity.json")]
ok = bool(k) and k.get("status") == "unavailable" and all(a.get("status") == "unavailable" and not (a.get("rows") or 0) for a in act)
from maxinstr.analyze.report import build_report
notes = build_report(run)["sources"]["notes"]
print("report (no --trace) notes:", notes)
ok = ok and any("kernels=True" in n for n in notes)
r2 = build_report(run, trace=sys.argv[2])
print("report with the nsys trace: format", r2["sources"]["trace_format"], "join", r2["sources"]["join"])
print("fallback:", "OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
  tail -4 "$out/fallback.txt"
fi

fi

echo "== 3. overhead: bare / stages / kernels / nsys / torch.profiler"
timeout 450 python3 benchmarks/cupti_overhead.py --rounds "${CUPTI_ROUNDS:-3}" --ab-rounds "${CUPTI_AB_ROUNDS:-24}" \
  --peer-rounds "${CUPTI_PEER_ROUNDS:-12}" --out "$out" 2>&1 | tee "$out/overhead.txt" | tail -45

exit $rc
