#!/usr/bin/env bash
# Short checks for the end of a session (run from the repo root after run_all.sh installed
# maxinstr): the stage core's overhead table (benchmarks/stage_overhead.py, STAGE_ARGS, default
# the full run) and the per-stage power scenario (benchmarks/scenarios/power_lag.py: a busy stage
# then an idle one; the idle one must read its own power). Results in $OUT/checks/.
set -uo pipefail
out="${OUT:-/tmp/out}/checks"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 COLUMNS=120
rc=0
echo "== stage core overhead"
python3 benchmarks/stage_overhead.py ${STAGE_ARGS:-} --json "$out/overhead.json" 2>&1 | tee "$out/overhead.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
echo "== power lag"
python3 benchmarks/scenarios/power_lag.py --run-dir /tmp/power_lag 2>&1 | tee "$out/power_lag.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
python3 -m maxinstr report /tmp/power_lag --quiet > "$out/power_lag.report.txt" 2>&1
exit $rc
