#!/usr/bin/env bash
# What a user runs, read as a user reads it (run from the repo root after run_all.sh installed
# maxinstr): the PyTorch decoder (KV cache, several requests) under `maxinstr run`, timed as a
# process beside the plain program, and its report at 80 and 120 columns, stderr kept.
# Results in $OUT/user/.
set -uo pipefail
out="${OUT:-/tmp/out}/user"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
[ -f .device/nsys-env.sh ] && source .device/nsys-env.sh
work=/tmp/user-runs && rm -rf "$work" && mkdir -p "$work"
args="--requests 6 --steps 64"
rc=0
t() { local s0; s0=$(date +%s%N); "$@"; local st=$?; echo "wall $(( ($(date +%s%N) - s0) / 1000000 )) ms (exit $st): $*"; return $st; }
echo "== plain"
t python3 examples/torch_decode.py --run-dir "$work/plain" $args > "$out/plain.out" 2> "$out/plain.err" || rc=1
tail -3 "$out/plain.out"
echo "== maxinstr run"
t python3 -m maxinstr run -o "$work/run" -- python3 examples/torch_decode.py --run-dir "$work/run-own" --no-report $args \
  > "$out/run.out" 2> "$out/run.err" || rc=1
echo "-- stderr of maxinstr run"; cat "$out/run.err"
for cols in 80 120; do
  echo "== report at $cols columns"
  COLUMNS=$cols python3 -m maxinstr report "$work/run" > "$out/report-$cols.txt" 2> "$out/report-$cols.err" || rc=1
  cat "$out/report-$cols.txt" "$out/report-$cols.err"
done
python3 -m maxinstr report "$work/run" --format json -o "$out/report.json" 2>/dev/null || rc=1
ls "$work/run" > "$out/rundir-files.txt"
exit $rc
