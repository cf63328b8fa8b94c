#!/usr/bin/env bash
# Diagnostics for issue 2's GPU-event cost and issue 9's small-step overhead (run from the repo
# root after run_all.sh built maxinstr; carry .whl for cupti-python). Results in $OUT/diag/:
#   event-diag.txt/.json   benchmarks/event_diag.py with MAXINSTR_TIME_DRIVER=1: driver patterns
#                          timed in C, python loops split into issue / resolve and driver time per
#                          stage, the decode-like step with GPU timing on 3, 1 or 0 stages
#   cupti-configs.txt/.json benchmarks/cupti_configs.py: on/off ratio of each CUPTI configuration
#                          in one process, records per launch by kind
set -uo pipefail
out="${OUT:-/tmp/out}/diag"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
rc=0
if [ "${DIAG_EVENTS:-1}" = 1 ]; then  # DIAG_EVENTS=0: the CUPTI configurations only
echo "== event diag"
MAXINSTR_TIME_DRIVER=1 timeout 120 python3 benchmarks/event_diag.py --json "$out/event-diag.json" 2>&1 | tee "$out/event-diag.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
if [ "${DIAG_CUPTI:-1}" = 1 ]; then  # DIAG_CUPTI=0: the event diagnostics only
echo "== cupti configs"
# DIAG_CONFIGS: the configurations (names separated by ';'), default the launch-tag breakdown
configs="${DIAG_CONFIGS:-control (no CUPTI);kernel;kernel+extcorr+runtime;kernel + launch tags;kernel + launch tags, no times;kernel + callback dispatch only;launch tags alone;callback dispatch alone}"
timeout 240 python3 benchmarks/cupti_configs.py --configs "$configs" --json "$out/cupti-configs.json" 2>&1 | tee "$out/cupti-configs.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
exit $rc
