#!/usr/bin/env bash
# Which time does an NVML utilization value / a GPM value describe? (run from the repo root after
# run_all.sh built maxinstr into PYTHONPATH; ~25 s). A square wave of bf16 matmul stages and
# sleeps of 50 ms .. 1 s in a session sampling at 100 Hz; the CUDA-event times of the busy
# stages are the ground truth. Prints the driver's update period, the fitted lag/window of
# utilization and the fitted GPM lag against the constants maxinstr.sample.attribute uses
# (NVML_UTIL_LAG_NS 25 ms, NVML_GPM_LAG_NS 87 ms, window = the period), the per-stage table,
# and CHECK lines; then the GPU tests whose per-stage utilization the attribution changed.
# Results in $OUT/util-windows/ (util_windows.json, square-run/).
set -uo pipefail
out="${OUT:-/tmp/out}/util-windows"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
unset MAXINSTR_SAMPLER_GIL MAXINSTR_SAMPLER_PROFILE
rc=0
echo "== 1. square wave: fitted windows vs the constants"
timeout 120 python3 benchmarks/util_windows.py "$out" 2>&1 | tee "$out/fit.txt" || rc=1
echo "== 2. GPU tests: busy/idle stage utilization (was 14.8 % for a busy stage), no torch.cuda init at session start"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/analyze/test_gpu_report.py::test_busy_and_idle_stages_from_samples_and_events \
  tests/reliability/test_gpu_sessions.py::test_session_meta_names_the_gpu_without_creating_a_context \
  -s 2>&1 | tail -40 | tee "$out/pytest-gpu.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
exit $rc
