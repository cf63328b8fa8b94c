#!/usr/bin/env bash
# The PyTorch decoder watched every way a user can (run from the repo root after run_all.sh
# installed maxinstr and the .whl wheels: cupti-python, nvtx): benchmarks/decoder_sources.py,
# fresh processes, rotated, SOURCES_ROUNDS rounds (default 3): tokens/s against the decoder
# alone and the lines each way wrote to stderr. Results in $OUT/sources/ (table.txt, sources.json).
set -uo pipefail
out="${OUT:-/tmp/out}/sources"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
[ -f .device/nsys-env.sh ] && source .device/nsys-env.sh
python3 benchmarks/decoder_sources.py --rounds "${SOURCES_ROUNDS:-3}" --out /tmp/decoder-sources ${SOURCES_ARGS:-} 2>&1 | tee "$out/table.txt"
rc=${PIPESTATUS[0]}
cp /tmp/decoder-sources/sources.json "$out/" 2>/dev/null
exit $rc
