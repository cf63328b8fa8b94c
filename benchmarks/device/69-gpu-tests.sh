#!/usr/bin/env bash
# Every test marked `gpu` (run from the repo root after run_all.sh installed maxinstr): the stage
# core's GPU events, the sampler, sessions under load, the examples and the docs' gpu blocks.
# Results in $OUT/gpu-tests/ (the pytest log).
set -uo pipefail
out="${OUT:-/tmp/out}/gpu-tests"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 COLUMNS=120
[ -f .device/nsys-env.sh ] && source .device/nsys-env.sh
MAXINSTR_DOCS_OUT="$out/docs" python3 -m pytest -q -m gpu tests -p no:cacheprovider -rs --durations=10 2>&1 | tee "$out/pytest-gpu.txt"
exit "${PIPESTATUS[0]}"
