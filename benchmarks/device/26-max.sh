#!/usr/bin/env bash
# Issue 26 point 4: the one-command path on MAX against nsys alone, and plain and kernels=True,
# on examples/max_decoder.py (8 layers, hidden 2048, bf16; 3 requests of 32 tokens), tokens/s of
# the steady requests as the example prints them, rotated over MAX_ROUNDS rounds (default 2) after
# one untimed plain run that compiles the graphs into ~/.cache/modular. MAX's op markers are off in
# every configuration (`maxinstr run`'s default now). Run after run_all.sh unpacked MAX from
# /tmp/mx and installed maxinstr (carry .device for nsys). Results in $OUT/max26/.
#   plain    MAXINSTR_DISABLE=1: the program with no-op stages
#   kernels  --kernels (kernels=True)
#   run      maxinstr run -- (nsys, steady capture; the default one-command path)
#   nsys     nsys profile -t cuda,nvtx around the plain program (nsys alone)
set -uo pipefail
out="${OUT:-/tmp/out}/max26"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 COLUMNS=120
[ -f .device/nsys-env.sh ] && source .device/nsys-env.sh
work=/tmp/max26 && rm -rf "$work" && mkdir -p "$work"
args=(examples/max_decoder.py --requests 3 --steps 32 --no-report)
tps() { grep -ho "[0-9.]* tokens/s steady" "$@" 2>/dev/null | tail -1 | cut -d' ' -f1; }
s0=$(date +%s)
MAXINSTR_DISABLE=1 timeout 420 python3 "${args[@]}" --run-dir "$work/compile" > "$out/compile.txt" 2>&1
echo "compile run: rc=$? in $(( $(date +%s) - s0 )) s, $(tps "$out/compile.txt") tok/s"
configs=(plain run nsys kernels)
for r in $(seq 1 "${MAX_ROUNDS:-2}"); do
  n=${#configs[@]}; k=$(( (r - 1) % n ))
  for i in $(seq 0 $(( n - 1 ))); do
    c=${configs[$(( (i + k) % n ))]}
    d="$work/$c-$r"; log="$out/$c-$r.txt"; t0=$(date +%s)
    case $c in
      plain) MAXINSTR_DISABLE=1 python3 "${args[@]}" --run-dir "$d" > "$log" 2>&1 ;;
      kernels) python3 "${args[@]}" --run-dir "$d" --kernels > "$log" 2>&1 ;;
      run) python3 -m maxinstr run -y -q --no-report -o "$d" -- python3 "${args[@]}" --run-dir "$d" > "$log" 2>&1
           cat "$d/child.log" >> "$log" 2>/dev/null ;;
      nsys) MAXINSTR_DISABLE=1 nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none --force-overwrite=true \
              -o "$work/nsys-$r" python3 "${args[@]}" --run-dir "$d" > "$log" 2>&1 ;;
    esac
    echo "round $r $c: rc=$? $(tps "$log") tok/s in $(( $(date +%s) - t0 )) s"
  done
done
for c in "${configs[@]}"; do echo "$c: $(for r in $(seq 1 "${MAX_ROUNDS:-2}"); do tps "$out/$c-$r.txt"; done | tr '\n' ' ')"; done | tee "$out/summary.txt"
COLUMNS=120 python3 -m maxinstr report "$work/run-1" > "$out/run-1.report120.txt" 2>&1
COLUMNS=80 python3 -m maxinstr report "$work/run-1" > "$out/run-1.report80.txt" 2>&1
head -40 "$out/run-1.report120.txt"
exit 0
