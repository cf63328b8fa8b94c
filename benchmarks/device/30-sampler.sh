#!/usr/bin/env bash
# Sampler on the H200 (run from the repo root after run_all.sh built maxinstr into PYTHONPATH).
#   1. GPU tests of tests/sample (pytest -m gpu): GPM SM activity near zero idle and > 50 % under
#      bf16 8192^3 matmuls; energy of a ~1 s matmul stage vs mean power x time (0.7..1.4);
#      snapshot verdict "busy" for a matmul loop, "host-bound" for tiny kernels + syncs, and
#      "launch/sync-bound" for back-to-back one-block kernels (cupy; util ~100 %, SM activity ~1 %)
#   2. maxinstr snapshot tables for matmul / tiny / idle (what a user sees)
#   3. benchmarks/sampler_cost.py on the real NVML device: Python loop and decode-like GPU loop,
#      sampler off / 10 / 100 / 1000 Hz; then again with the GIL released per NVML call
#      (MAXINSTR_SAMPLER_GIL=release) to compare the two ways of calling NVML
#   4. a real samples part (samples.bin + samples.json: idle, matmul, tiny phases) kept as a
#      candidate test fixture
# Results land in $OUT/sampler/.
set -uo pipefail
out="${OUT:-/tmp/out}/sampler"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export MAXINSTR_GPU_RESULTS="$out/gpu-tests"
rc=0
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee "$out/gpu.txt"

echo "== 1. GPU tests"
python3 -m pytest -q -m gpu tests/sample -p no:cacheprovider -s -rs 2>&1 | tee "$out/pytest-gpu.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

echo "== 2. snapshot tables"
for mode in matmul tiny narrow idle; do
  echo "-- snapshot: $mode"
  COLUMNS=120 python3 -m maxinstr snapshot --interval 0.02 -- \
    python3 tests/sample/gpu_workloads.py "$mode" 5 2>&1 | tee "$out/snapshot-$mode.txt"
done

echo "== 3. sampler cost (real NVML)"
timeout 150 python3 benchmarks/sampler_cost.py --device real --seconds 0.8 --rounds 5 \
  --json "$out/cost-hold-gil.json" 2>&1 | tee "$out/cost-hold-gil.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
MAXINSTR_SAMPLER_GIL=release timeout 100 python3 benchmarks/sampler_cost.py --device real --seconds 0.8 --rounds 3 \
  --json "$out/cost-release-gil.json" 2>&1 | tee "$out/cost-release-gil.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

echo "== 4. a real samples part"
python3 - "$out/fixture" <<'PY' || rc=1
import sys, time
sys.path.insert(0, "tests/sample")
import gpu_workloads as w
from maxinstr.sample import start_sampler, read_samples
from maxinstr.sample.writer import clock_ns
part = sys.argv[1]
w.matmul(0.2)
marks = {}
s = start_sampler(part, 0.01)
marks["idle"] = clock_ns(); time.sleep(1.0)
marks["matmul"] = clock_ns(); w.matmul(1.5)
marks["tiny"] = clock_ns(); w.tiny(1.0)
marks["end"] = clock_ns()
s.stop()
r = read_samples(part)
import json, pathlib
pathlib.Path(part, "phases.json").write_text(json.dumps(marks))
print(len(r), "rows;", r.meta["cost"], r.meta.get("gil"), r.errors)
PY
ls -la "$out/fixture"
echo "30-sampler rc=$rc"
exit $rc
