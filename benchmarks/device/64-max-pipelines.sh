#!/usr/bin/env bash
# MAX's own commands on the GPU (issue 27, point 6): `max generate` and `max serve` with a random
# Llama the size of examples/max_decoder.py (8 layers, hidden 2048, 16 heads, FFN 5632, vocabulary
# 32000, bf16: examples/tiny_llama.py makes it, nothing is downloaded), under the max preset.
# Needs MAX *and its serve extras* in /tmp/site: `MAX_SERVE=1 benchmarks/device/max-parts.sh`
# here, then one call per part (docs/benchmarks.md, "MAX's own commands"); run_all.sh unpacks them.
#   1. max generate bare, twice (the first compiles into MAX's cache): tokens/s of each
#   2. the same under `maxinstr run` (nsys from steady state, MAX's detailed markers): tokens/s
#      and the per-stage report (prefill, decode, forward, sample, graph with their kernels)
#   3. the same under kernels=True (benchmarks/max_generate_kernels.py), then the per-stage
#      kernel counts and times of 2 and 3 side by side
#   4. max serve under `maxinstr server` (nsys windows), examples/serve_load.py in the window:
#      the client's numbers, the serving loop's, and the window's report
# Results in $OUT/max-pipelines/ (reports at 120 and 80 columns, JSON), packed by run_all.sh.
set -uo pipefail
out="${OUT:-/tmp/out}/max-pipelines"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 COLUMNS=120 HF_HUB_OFFLINE=1
[ -f .device/nsys-env.sh ] && source .device/nsys-env.sh
work=/tmp/max-pipelines
mkdir -p "$work"
rc=0
model=$work/llama-8x2048
TOKENS=${MAX_TOKENS:-128}
GEN=(generate --model-path "$model" --devices gpu --prompt "hello world" --max-new-tokens "$TOKENS" --ignore-eos)
# `max` is a console script: without one on PATH (MAX unpacked into /tmp/site), its module
command -v max > /dev/null && MAX=(max) || MAX=(python3 -m max._entrypoints.pipelines)

python3 examples/tiny_llama.py "$model" --layers 8 --hidden 2048 --heads 16 --kv-heads 16 --intermediate 5632 \
  --vocab 32000 --dtype bfloat16 | tee "$out/model.txt" || exit 1

timed() {  # timed NAME CMD...: output in $out/NAME.txt, wall seconds and tokens/s printed
  local name=$1; shift
  local s0; s0=$(date +%s%N)
  "$@" > "$out/$name.txt" 2>&1
  local st=$?
  echo "$name: rc=$st in $(( ($(date +%s%N) - s0) / 1000000 )) ms; $(grep -h 'Eval throughput (token-generation)' "$out/$name.txt" | tail -1)"
  [ $st = 0 ] || { rc=1; tail -25 "$out/$name.txt"; }
  return $st
}
report() {  # report NAME RUN [--trace FILE]
  local name=$1; shift
  COLUMNS=120 python3 -m maxinstr report "$@" > "$out/$name.report120.txt" 2>&1 || rc=1
  COLUMNS=80 python3 -m maxinstr report "$@" > "$out/$name.report80.txt" 2>&1
  python3 -m maxinstr report "$@" --format json -o "$out/$name.report.json" > /dev/null 2>&1
}

timed gen-bare1 "${MAX[@]}" "${GEN[@]}"          # compiles (MAX's cache: ~/.cache/modular)
timed gen-bare2 "${MAX[@]}" "${GEN[@]}"          # from the cache
timed gen-run python3 -m maxinstr run -y --warmup 2 -o "$work/gen-run" -- "${MAX[@]}" "${GEN[@]}"
report gen-run "$work/gen-run"
timed gen-kernels python3 -m maxinstr run -y --profiler none --preset max --warmup 2 -o "$work/gen-kernels" -- \
  python3 benchmarks/max_generate_kernels.py "${GEN[@]}"
report gen-kernels "$work/gen-kernels"
timed gen-bare3 "${MAX[@]}" "${GEN[@]}"          # bare again: the machine's drift across the runs above
python3 - "$out/gen-run.report.json" "$out/gen-kernels.report.json" <<'PY' | tee "$out/gen-kernels-vs-nsys.txt"
import json, sys
def per_stage(path):  # stage key -> (ops over the instances the mix used, their GPU ns)
    rep = json.load(open(path))
    return {s["name"]: (s["mix"]["ops"], s["mix"]["gpu_ns"], s["mix"]["instances"]) for s in rep["stages"] if s.get("mix")}
a, b = per_stage(sys.argv[1]), per_stage(sys.argv[2])
print(f"{'stage':<24} {'nsys ops':>9} {'GPU ms':>8} {'inst':>5}   {'kernels=True ops':>16} {'GPU ms':>8} {'inst':>5}")
for key in sorted(set(a) | set(b)):
    x, y = a.get(key, (0, 0.0, 0)), b.get(key, (0, 0.0, 0))
    print(f"{key:<24} {x[0]:>9} {x[1] / 1e6:>8.2f} {x[2]:>5}   {y[0]:>16} {y[1] / 1e6:>8.2f} {y[2]:>5}")
PY

port=8123
timed serve-start python3 -m maxinstr server start -o "$work/serve" --ready 'Server ready' --ready-timeout 480 -- \
  "${MAX[@]}" serve --model-path "$model" --devices gpu --port "$port" --max-batch-size 16
timed serve-window python3 -m maxinstr server window "$work/serve" -- python3 examples/serve_load.py \
  --url "http://127.0.0.1:$port" --requests 64 --concurrency 16 --max-tokens 64 --stream
python3 -m maxinstr server stop "$work/serve" > "$out/serve-stop.txt" 2>&1
grep -h "client:\|latency\|first token\|serving loop\|prefill \|decode \|tokenize \|queueing" "$out/serve-window.txt"
[ -f "$work/serve/window-1.sqlite" ] && report serve "$work/serve" --trace "$work/serve/window-1.sqlite"

( cd "$work" && tar czf "$out/max-pipelines-runs.tgz" --exclude='*.nsys-rep' --exclude='*.qdstrm' \
    --exclude='llama-8x2048' . )
exit $rc
