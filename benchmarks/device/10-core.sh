#!/usr/bin/env bash
# Stage core on the H200 (run from the repo root after run_all.sh built maxinstr into PYTHONPATH).
#   1. GPU tests of tests/core (pytest -m gpu): a 200 us spin kernel alone in a stage within
#      max(1 %, 2 us) once the calibrated GPU floor is taken out (the printed line shows the
#      readings, the floor and what CuPy's raw event pair adds), non-default stream, sibling
#      boundary sharing, graph capture, profiler_start from a fresh thread (primary context)
#   2. benchmarks/stage_overhead.py with no tool attached (full run, args from STAGE_ARGS; also prints the driver
#      calls' own costs timed in C and the floor)
#   3. the same benchmark under nsys (quick run): NVTX ranges cost more when a tool listens
#   4. nsys capture of tests/core/gpu_nsys.py probe, exported to SQLite, checked: domain
#      "maxinstr" ranges whose int64 payloads equal the run's record ids (names, tids too)
# Results land in $OUT/core/.
set -uo pipefail
out="${OUT:-/tmp/out}/core"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
rc=0
python3 -c "import maxinstr._native as n; print('native from', n.__file__); print(n.stats())" || rc=1

echo "== 1. GPU tests"
python3 -m pytest -q -m gpu tests/core -p no:cacheprovider -s -rs 2>&1 | tee "$out/pytest-gpu.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

# CORE_BENCH=0: GPU tests and the nsys payload check only (steps 2-3 skipped)
if [ "${CORE_BENCH:-1}" = 1 ]; then
echo "== 2. overhead, no tool attached"
python3 benchmarks/stage_overhead.py ${STAGE_ARGS:---budgets 0.01,0.005} --json "$out/overhead-notool.json" 2>&1 | tee "$out/overhead-notool.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi

if [ -f .device/nsys-env.sh ]; then
  source .device/nsys-env.sh
fi
if command -v nsys >/dev/null; then
  NSYS="nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none -f true"
  if [ "${CORE_BENCH:-1}" = 1 ]; then
  echo "== 3. overhead under nsys"
  $NSYS -o /tmp/mi-bench python3 benchmarks/stage_overhead.py --quick --json "$out/overhead-nsys.json" \
    > "$out/overhead-nsys.txt" 2>&1 || rc=1
  grep -v "^Collecting\|^Generating\|^Processing\|^\s*$" "$out/overhead-nsys.txt" | head -40
  fi

  echo "== 4. nsys payload check"
  $NSYS -o /tmp/mi-probe python3 tests/core/gpu_nsys.py probe "$out/probe.json" > "$out/nsys-probe.log" 2>&1 || rc=1
  if [ ! -f /tmp/mi-probe.nsys-rep ] && [ -f /tmp/mi-probe.qdstrm ]; then
    QdstrmImporter -i /tmp/mi-probe.qdstrm >> "$out/nsys-probe.log" 2>&1
  fi
  nsys export --type sqlite -f true -o /tmp/mi-probe.sqlite /tmp/mi-probe.nsys-rep >> "$out/nsys-probe.log" 2>&1 || rc=1
  python3 tests/core/gpu_nsys.py check "$out/probe.json" /tmp/mi-probe.sqlite 2>&1 | tee "$out/nsys-check.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || { rc=1; tail -20 "$out/nsys-probe.log"; }
else
  echo "nsys not found: steps 3-4 skipped (carry .device, see /work/shared/device/README.md)"
  rc=1
fi
echo "10-core rc=$rc"
exit $rc
