#!/usr/bin/env bash
# The PyTorch decoder's decode step every way that can share one process (issue 18): bare, NVTX
# ranges, maxinstr's default session, kernels=True (launch tags, and the record path), and
# CUPTI's own floor (kernel/copy/set records only), in rotated blocks: benchmarks/decoder_ab.py.
# Run from the repo root after run_all.sh installed maxinstr and the .whl wheels (nvtx,
# cupti-python). Results in $OUT/decoder-ab/ (table.txt, decoder_ab.json).
set -uo pipefail
out="${OUT:-/tmp/out}/decoder-ab"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# AB_CPUS: pin the process to these CPUs (taskset -c), against the host's drift between rounds
pin=(); [ -n "${AB_CPUS:-}" ] && pin=(taskset -c "$AB_CPUS")
"${pin[@]}" python3 benchmarks/decoder_ab.py --rounds "${AB_ROUNDS:-6}" --steps "${AB_STEPS:-128}" ${AB_ARGS:-} \
  --json "$out/decoder_ab.json" 2>&1 | tee "$out/table.txt"
exit "${PIPESTATUS[0]}"
