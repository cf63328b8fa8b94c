#!/usr/bin/env bash
# Sampler on the H200 (run from the repo root after run_all.sh built maxinstr into PYTHONPATH).
# Second run: after per-call timing and the sampler process (run 1 showed ~2.8 ms per row with
# the GIL held).
#   1. per-call cost on the real NVML (MAXINSTR_SAMPLER_PROFILE=1, sampler alone, 100 Hz, default
#      mode: a child process that reads with GIL mode "auto"): wall/CPU time of each NVML call,
#      which ones were moved off the per-row cadence and why (samples.json cost.probes). Printed
#      first: this names the slow call(s).
#   2. GPU tests of tests/sample (pytest -m gpu): GPM near zero idle, > 50 % under bf16 matmuls;
#      energy of a ~1 s matmul stage vs mean power x time (0.7..1.4); snapshot verdicts busy /
#      host-bound / launch/sync-bound; per-row calls cheap (< 50 us p50) or moved, tick p50 < 0.5 ms
#   3. maxinstr snapshot tables for matmul and idle (power cap and thermal/HW slowdown now in
#      separate columns; the tiny / narrow verdicts are in step 2's JSON)
#   4. benchmarks/sampler_cost.py on the real NVML in the three MAXINSTR_SAMPLER_GIL modes
#      (process = default, auto and release = a thread in the program): Python loop and
#      decode-like GPU loop, sampler off / 10 / 100 / 1000 Hz, slowdown and "stall +". Target:
#      <= 1 % slowdown at 100 Hz for both loops in the default mode
#   5. a real samples part (idle, matmul, tiny phases) as a candidate test fixture
# Results land in $OUT/sampler/. Budget: ~2.5 minutes.
set -uo pipefail
out="${OUT:-/tmp/out}/sampler"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export MAXINSTR_GPU_RESULTS="$out/gpu-tests"
unset MAXINSTR_SAMPLER_GIL MAXINSTR_SAMPLER_PROFILE
rc=0
t_start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee "$out/gpu.txt"

echo "== 1. per-call cost (real NVML, 100 Hz, sampler alone, MAXINSTR_SAMPLER_PROFILE=1)"
MAXINSTR_SAMPLER_PROFILE=1 python3 - "$out/profile" <<'PY' 2>&1 | tee "$out/per-call.txt"
import json, sys, time
from maxinstr.sample import read_samples, start_sampler
part = sys.argv[1]
s = start_sampler(part, 0.01)
time.sleep(2.0)
s.stop()
r = read_samples(part)
c = r.meta["cost"]
print("gil:", r.meta.get("gil"))
print(f"tick p50 {c['per_tick_ns']['p50'] / 1e3:.1f} us, p99 {c['per_tick_ns']['p99'] / 1e3:.1f} us, "
      f"thread CPU {c.get('thread_cpu_pct', 0):.2f}% ({c['ticks']} ticks, {c['missed_ticks']} missed)")
print(f"{'call':<16} {'cadence':>7} {'calls':>6} {'calib us (5 calls)':>30} {'p50 us':>8} {'p99 us':>8} {'max us':>8} {'CPU us':>7}  moved")
for dev, table in c.get("probes", {}).items():
    for name, p in table.items():
        cal = ",".join(f"{x / 1e3:.0f}" for x in p.get("calibration_ns", []))
        cpu = p.get("thread_cpu_mean_ns")
        print(f"{name:<16} {p['cadence']:>7} {p['calls']:>6} {cal:>30} {p.get('p50_ns', 0) / 1e3:>8.1f} "
              f"{p.get('p99_ns', 0) / 1e3:>8.1f} {p.get('max_ns', 0) / 1e3:>8.1f} "
              f"{'-' if cpu is None else f'{cpu / 1e3:.1f}':>7}  {p.get('moved', '')}")
for e in r.errors:
    print("note:", e["message"])
PY
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

echo "== 2. GPU tests"
python3 -m pytest -q -m gpu tests/sample -p no:cacheprovider -s -rs 2>&1 | tee "$out/pytest-gpu.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

echo "== 3. snapshot tables"
for mode in matmul idle; do
  echo "-- snapshot: $mode"
  COLUMNS=120 python3 -m maxinstr snapshot --interval 0.02 -- \
    python3 tests/sample/gpu_workloads.py "$mode" 3 2>&1 | tee "$out/snapshot-$mode.txt"
done

echo "== 4. sampler cost (real NVML; modes process = default, auto, release)"
timeout 120 python3 benchmarks/sampler_cost.py --device real --modes process,auto,release --seconds 0.25 --rounds 6 \
  --json "$out/cost.json" 2>&1 | tee "$out/cost.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

echo "== 5. a real samples part"
PYTHONPATH="tests/sample:$PYTHONPATH" python3 - "$out/fixture" <<'PY' || rc=1
import sys, time
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
print(len(r), "rows;", r.meta["cost"]["per_tick_ns"], r.meta.get("gil"), [e["message"] for e in r.errors])
PY
ls -la "$out/fixture"
echo "30-sampler rc=$rc ($(( $(date +%s) - t_start )) s)"
exit $rc
