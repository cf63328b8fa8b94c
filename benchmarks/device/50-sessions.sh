#!/usr/bin/env bash
# Sessions, run directory and reliability on the H200 (run from the repo root after run_all.sh
# built maxinstr into PYTHONPATH). Results land in $OUT/sessions/.
#   1. GPU session tests (pytest -m gpu tests/reliability, slow included):
#      - session start creates no CUDA context; meta.json names GPU/driver/CUDA/torch/cuDNN;
#        GPU-timed records of a torch stream reach the run directory; NVML samples present
#      - SIGKILL after 200 GPU stages: all 200 on disk, GPU-timed
#      - fork after CUDA init: the child writes its own host-only part
#      - 16 threads x 100k stages with GPU events: every record on disk or counted as dropped
#   3. benchmarks/session_overhead.py: ns per stage with no session, in a session written by
#      the native writer thread and in one written by the Python flusher (MAXINSTR_NATIVE_WRITER=0),
#      1 and 16 threads, with the records each dropped; and the flusher's drain/write cost
#   With the native writer (default since 2026-12-03) look for: "lost N (native writer)" with N a
#   few hundred at most in the mid_loop line, and "dropped 0, writer native" in the 16 x 100k lines.
#   2. the CPU session/reliability/rundir suites on this machine (signals, fork/spawn/forkserver,
#      ranks, disk full, SIGKILL loss bound), with -s so the measured numbers are printed
set -uo pipefail
out="${OUT:-/tmp/out}/sessions"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
rc=0
python3 -c "import maxinstr, maxinstr._native as n; print('maxinstr from', maxinstr.__file__); print(n.stats())" || rc=1

echo "== 1. GPU session tests"
python3 -m pytest -q -m gpu tests/reliability -p no:cacheprovider -s -rs 2>&1 | tee "$out/pytest-gpu.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

if [ "${SESSIONS_CPU:-1}" = 1 ]; then  # SESSIONS_CPU=0 skips the CPU suites (CI runs them)
echo "== 2. CPU session / reliability / rundir tests"
python3 -m pytest -q -m "not gpu" tests/session tests/reliability tests/rundir -p no:cacheprovider -s -rs \
  --ignore=tests/rundir/test_rundir_fuzz.py 2>&1 | tee "$out/pytest-cpu.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
echo "== 3. what an open session adds per stage (flusher drain + write)"
python3 benchmarks/session_overhead.py --n 200000 --reps 7 2>&1 | tee "$out/session-overhead-1t.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
python3 benchmarks/session_overhead.py --n 50000 --reps 5 --threads 16 2>&1 | tee "$out/session-overhead-16t.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
exit $rc
