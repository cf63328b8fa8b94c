#!/usr/bin/env bash
# Traces and attribution on the H200 (run from the repo root after run_all.sh built maxinstr
# into PYTHONPATH; needs .device carried for nsys). Results in $OUT/traces/:
#   1. h200_threads.sqlite (+ .stats/*.csv from nsys stats, + h200_threads-run/ run directory):
#      benchmarks/scenarios/threads_startend.py under nsys -- worker-thread launches inside a
#      maxinstr stage, an NVTX start/end range ended on another thread, CUDA graph replays.
#      The coordinator can copy these three into tests/data/nsys/ as a fixture.
#   2. tests/attribute/test_threads_capture.py run on that fresh capture (rules, nsys equality,
#      payload join), plus the CPU tests of the reader/attribution with the native module
#      built here (native == Python backend).
#   3. benchmarks/trace_merge.py 10k..10M kernels, with `nsys stats` timed side by side on the
#      same files (up to 1M) and our per-range totals checked against nsys's CSV:
#      trace_merge.txt / trace_merge.json.
set -uo pipefail
out="${OUT:-/tmp/out}/traces"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
rc=0
[ -f .device/nsys-env.sh ] && source .device/nsys-env.sh
if ! command -v nsys >/dev/null; then
  echo "nsys not found (carry .device, see /work/shared/device/README.md)"; exit 1
fi
nsys --version

echo "== 1. capture threads_startend under nsys"
rm -rf "$out/h200_threads-run" /tmp/mi-threads.*
nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none --cuda-graph-trace=node -f true -o /tmp/mi-threads \
  python3 benchmarks/scenarios/threads_startend.py --run-dir "$out/h200_threads-run" > "$out/capture.log" 2>&1 || rc=1
tail -3 "$out/capture.log"
if [ ! -f /tmp/mi-threads.nsys-rep ] && [ -f /tmp/mi-threads.qdstrm ]; then
  QdstrmImporter -i /tmp/mi-threads.qdstrm >> "$out/capture.log" 2>&1
fi
nsys export --type sqlite -f true -o "$out/h200_threads.sqlite" /tmp/mi-threads.nsys-rep >> "$out/capture.log" 2>&1 || rc=1
mkdir -p "$out/h200_threads.stats"
nsys stats --force-export=false -r nvtx_gpu_proj_sum,nvtx_sum,cuda_gpu_kern_sum -f csv \
  -o "$out/h200_threads.stats/x" "$out/h200_threads.sqlite" >> "$out/capture.log" 2>&1
for f in "$out/h200_threads.stats"/x_*.csv; do [ -f "$f" ] && mv "$f" "$out/h200_threads.stats/${f##*/x_}"; done
ls -la "$out/h200_threads.sqlite" "$out/h200_threads.stats" 2>&1 | tail -4
cat "$out/h200_threads.stats/nvtx_gpu_proj_sum.csv" 2>/dev/null

echo "== 2. tests on the capture, and reader/attribution tests with the native module built here"
python3 -c "import maxinstr._columns as c; print('native columns:', c.available(), 'sqlite', c.sqlite_version())" || rc=1
MAXINSTR_THREADS_CAPTURE="$out/h200_threads.sqlite" python3 -m pytest -q -p no:cacheprovider -rs \
  tests/attribute tests/traces/test_nsys.py 2>&1 | tee "$out/pytest.txt" | tail -15
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

if [ "${TRACES_SCALE:-1}" = 0 ]; then echo "== 3. skipped (TRACES_SCALE=0)"; exit $rc; fi
echo "== 3. trace-merge benchmark (ours vs Python sqlite3, SQL join, nsys stats), then 10M (ours only) last"
python3 benchmarks/trace_merge.py --sizes 10k,100k,1M --workdir /tmp/tm --nsys-stats \
  --python-max 1M --sql-max 100k --sql-limit 20 --limit 120 --json "$out/trace_merge.json" 2>&1 | tee "$out/trace_merge.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
python3 benchmarks/trace_merge.py --sizes 10M --workdir /tmp/tm --cases ours-native --limit 120 \
  --json "$out/trace_merge_10M.json" 2>&1 | tee "$out/trace_merge_10M.txt"
rm -rf /tmp/tm
exit $rc
