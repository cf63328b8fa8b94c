#!/usr/bin/env bash
# Every source of per-stage kernels a PyTorch user has, on one decoder (run from the repo root
# after run_all.sh installed maxinstr): examples/torch_decode.py (6 layers, hidden 1024, bf16,
# KV cache, 3 requests of 64 steps) run plain, under torch.profiler (its Kineto trace beside the
# run directory), under nsys (`maxinstr run`, the whole run captured) and with kernels=True
# (stderr kept: a profiler prints nothing into the user's program). Results in $OUT/torch/:
# run directories, the Kineto trace and the nsys SQLite export, in one archive.
set -uo pipefail
out="${OUT:-/tmp/out}/torch"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 COLUMNS=120
[ -f .device/nsys-env.sh ] && source .device/nsys-env.sh
work=/tmp/torch-runs
rm -rf "$work" && mkdir -p "$work"
rc=0
args=(--layers 6 --hidden 1024 --requests 3 --steps 64 --batch 1 --no-report)

timed() {  # timed NAME CMD...
  local name=$1; shift
  local s0; s0=$(date +%s%N)
  "$@" > "$out/$name.txt" 2> "$out/$name.stderr.txt"
  local st=$?
  echo "$name: rc=$st in $(( ($(date +%s%N) - s0) / 1000000 )) ms; stderr lines: $(wc -l < "$out/$name.stderr.txt")"
  grep -h "^torch_decode:" "$out/$name.txt"
  [ $st = 0 ] || { rc=1; tail -20 "$out/$name.stderr.txt"; }
}
timed plain python3 examples/torch_decode.py "${args[@]}" --run-dir "$work/plain"
timed kineto python3 examples/torch_decode.py "${args[@]}" --run-dir "$work/kineto" --torch-profiler "$work/kineto.pt.trace.json"
timed kernels python3 examples/torch_decode.py "${args[@]}" --run-dir "$work/kernels" --kernels
timed nsys python3 -m maxinstr run -y --capture all -o "$work/nsys" -- python3 examples/torch_decode.py "${args[@]}"
ls "$work/nsys" > "$out/nsys.files.txt" 2>&1
for r in plain kineto kernels; do
  COLUMNS=120 python3 -m maxinstr report "$work/$r" > "$out/$r.report120.txt" 2>&1 || rc=1
done
COLUMNS=120 python3 -m maxinstr report "$work/kineto" --trace "$work/kineto.pt.trace.json" > "$out/kineto-trace.report120.txt" 2>&1
COLUMNS=120 python3 -m maxinstr report "$work/nsys" > "$out/nsys.report120.txt" 2>&1 || rc=1
gzip -f "$work/kineto.pt.trace.json"
( cd "$work" && tar czf "$out/torch-runs.tgz" --exclude='*.nsys-rep' --exclude='*.qdstrm' . )
ls -la "$out/torch-runs.tgz"
exit $rc
