#!/usr/bin/env bash
# Runs on the lent H200 (device tool) from the repo root: builds and installs maxinstr into
# /tmp/site, then runs each benchmarks/device/NN-*.sh step (or only those named), each with
# its own time limit, and packs every step's results and log into $OUT/results.tgz (the device
# tool returns at most 8 files, so everything travels in one archive; the summary is printed).
#   usage: bash benchmarks/device/run_all.sh [STEP_NAME_SUBSTRING ...]
set -u
REAL_OUT=${OUT:?OUT is set by the device tool}
export OUT=/tmp/results && rm -rf "$OUT" && mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -f .device/nsys-env.sh ] && source .device/nsys-env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 --version; command -v nsys ncu; } > "$OUT/machine.txt" 2>&1
t0=$(date +%s)
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > "$OUT/wheels.log" 2>&1
fi
# MAX, when its parts were sent ahead (benchmarks/device/max-parts.sh): unpacked once per machine
if ls /tmp/mx/mxpart.* >/dev/null 2>&1 && [ ! -d /tmp/site/max/engine ]; then
  if [ "$(cat /tmp/mx/mxpart.* | sha256sum | cut -d' ' -f1)" != "$(cat /tmp/mx/SHA256 2>/dev/null)" ]; then
    echo "MAX parts in /tmp/mx are incomplete or damaged (SHA256): not installed" | tee -a "$OUT/summary.txt"
  else
    mkdir -p /tmp/site
    cat /tmp/mx/mxpart.* | { xz -dc -T0 2>/dev/null || python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)'; } \
      | tar -x -C /tmp/site && echo "MAX unpacked into /tmp/site in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
  fi
fi
# with the benchmark-only driver probes (_driver_costs, _event_diag: csrc/core/CMakeLists.txt)
python3 -m pip install --no-build-isolation --no-deps --no-compile --target /tmp/site \
  --config-settings=cmake.define.MAXINSTR_BENCH_PROBES=ON . > "$OUT/build.log" 2>&1
echo "build rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
# bytecode, as a user's pip install leaves it: without it every process compiles maxinstr's
# sources again (0.37 s of a 2.5 s `maxinstr report` there: the image sets no bytecode cache)
python3 -m compileall -q /tmp/site/maxinstr > /dev/null 2>&1
echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset}" >> "$OUT/machine.txt"
export PYTHONPATH=/tmp/site
budget=${STEP_TIMEOUT:-240}
# TOTAL_S: the whole call's budget (default 540 s, under the device tool's 600 s per call), so
# a late step is cut short or skipped and the archive below is always written.
deadline=$(( t0 + ${TOTAL_S:-540} ))
# PARALLEL="name ..." : steps that only check correctness run together after the others (the
# timing steps run alone first); each keeps its own time limit and log.
par=()
run_step() {  # name step seconds
  local s0; s0=$(date +%s)
  timeout -k 10 "$3" bash "$2" > "$OUT/$1.log" 2>&1
  local rc=$?
  echo "$1 rc=$rc in $(( $(date +%s) - s0 )) s" | tee -a "$OUT/summary.txt"
  tail -n 25 "$OUT/$1.log" | sed "s/^/  [$1] /"
}
for step in benchmarks/device/[0-9]*.sh; do
  name=$(basename "$step" .sh)
  if [ $# -gt 0 ]; then keep=0; for want in "$@"; do [[ $name == *$want* ]] && keep=1; done; [ $keep = 1 ] || continue; fi
  s0=$(date +%s)
  left=$(( deadline - s0 - 15 ))
  if [ "$left" -lt 20 ]; then echo "$name skipped: ${left} s left of TOTAL_S" | tee -a "$OUT/summary.txt"; continue; fi
  for p in ${PARALLEL:-}; do [[ $name == *$p* ]] && { par+=("$name:$step"); continue 2; }; done
  seq=${SEQ_TIMEOUT:-$budget}  # SEQ_TIMEOUT: the limit of each step run alone (default STEP_TIMEOUT)
  this=$(( seq < left ? seq : left ))
  run_step "$name" "$step" "$this"
done
if [ ${#par[@]} -gt 0 ]; then
  left=$(( deadline - $(date +%s) - 15 ))
  this=$(( budget < left ? budget : left ))
  echo "parallel: ${par[*]} (${this} s each)" | tee -a "$OUT/summary.txt"
  for item in "${par[@]}"; do run_step "${item%%:*}" "${item#*:}" "$this" > "$OUT/${item%%:*}.tail" & done
  wait
  cat "$OUT"/*.tail 2>/dev/null; rm -f "$OUT"/*.tail
fi
tar czf "$REAL_OUT/results.tgz" -C "$OUT" . && ls -la "$REAL_OUT"
cat "$OUT/summary.txt"
