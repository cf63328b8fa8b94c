#!/usr/bin/env bash
# The runnable examples on the H200 (run from the repo root after run_all.sh built maxinstr into
# PYTHONPATH). Results land in $OUT/examples/, to be kept in docs/examples/ as real reports.
#   1. examples/torch_decode.py and examples/cupy_pipeline.py, each under nsys
#      (-t cuda,nvtx), then `maxinstr report RUN --trace FILE.nsys-rep` as text and Markdown:
#      <ex>.report.txt / <ex>.report.md, plus the unprofiled run's report (<ex>.plain.txt)
#   2. (the one-command path, `maxinstr run`, runs in step 4 as a docs block; its output is kept
#      in $OUT/examples/docs/)
#   3. examples/max_block.py if MAX is importable here (it is not installed on the lent machine
#      and its wheels are too big to carry: the step says so and moves on)
#   4. pytest -m gpu tests/examples (GPU-timed stages on torch's current stream and on CuPy's two
#      non-blocking streams; the docs' `console gpu` blocks)
set -uo pipefail
# about 4 minutes on the H200 (the docs' deep-dive block re-runs the torch example under ncu):
# run it with STEP_TIMEOUT=360
out="${OUT:-/tmp/out}/examples"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 COLUMNS=120
[ -f .device/nsys-env.sh ] && source .device/nsys-env.sh
work=/tmp/examples-runs
rm -rf "$work" && mkdir -p "$work"
rc=0
nsys_profile() {  # nsys_profile NAME CMD... -> $work/NAME.nsys-rep
  local name=$1; shift
  nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none --force-overwrite=true -o "$work/$name" "$@" \
    > "$out/$name.nsys.log" 2>&1
  local st=$?
  if [ ! -f "$work/$name.nsys-rep" ] && [ -f "$work/$name.qdstrm" ]; then
    QdstrmImporter -i "$work/$name.qdstrm" >> "$out/$name.nsys.log" 2>&1
  fi
  [ -f "$work/$name.nsys-rep" ] || { echo "no $name.nsys-rep (nsys status $st)"; return 1; }
}

echo "== 1. examples under nsys, and their reports"
command -v nsys || echo "nsys not on PATH (source .device/nsys-env.sh)"
for ex in torch_decode cupy_pipeline; do
  echo "-- $ex: plain run"
  s0=$(date +%s%N)
  python3 "examples/$ex.py" --run-dir "$work/$ex-plain" > "$out/$ex.plain.txt" 2>&1 || { echo "$ex plain run failed"; rc=1; }
  echo "$ex plain run: $(( ($(date +%s%N) - s0) / 1000000 )) ms"
  head -3 "$out/$ex.plain.txt"
  echo "-- $ex: under nsys"
  s0=$(date +%s%N)
  if nsys_profile "$ex" python3 "examples/$ex.py" --run-dir "$work/$ex" --no-report; then
    echo "$ex under nsys: $(( ($(date +%s%N) - s0) / 1000000 )) ms"
    # headline timings from the unprofiled run, kernels from the capture; the trace is read once
    # (JSON), the text and Markdown views are rendered from it
    python3 -m maxinstr report "$work/$ex" --trace "$work/$ex.nsys-rep" --unprofiled "$work/$ex-plain" --quiet \
      --format json -o "$out/$ex.report.json" || rc=1
    python3 -m maxinstr report "$out/$ex.report.json" --quiet > "$out/$ex.report.txt" 2>&1 || rc=1
    python3 -m maxinstr report "$out/$ex.report.json" --quiet --format md -o "$out/$ex.report.md" || rc=1
    cat "$out/$ex.report.txt"
  else
    rc=1; tail -20 "$out/$ex.nsys.log"
  fi
done

echo "== 3. MAX block"
if python3 -c "import max.engine" 2>/dev/null; then
  nsys_profile max_block env MODULAR_ENABLE_PROFILING=detailed python3 examples/max_block.py \
      --run-dir "$work/max_block" --max-profiling detailed --no-report \
    && python3 -m maxinstr report "$work/max_block" --trace "$work/max_block.nsys-rep" --quiet > "$out/max_block.report.txt" 2>&1 \
    && python3 -m maxinstr report "$work/max_block" --trace "$work/max_block.nsys-rep" --quiet --format md -o "$out/max_block.report.md" \
    || rc=1
  cat "$out/max_block.report.txt" 2>/dev/null
else
  echo "MAX is not installed on this machine (pip install max needs the network; its wheels exceed the carry limit): skipped" \
    | tee "$out/max_block.skipped.txt"
fi

if [ "${EXAMPLES_TESTS:-1}" = 0 ]; then echo "== 4. skipped (EXAMPLES_TESTS=0)"; exit $rc; fi
echo "== 4. GPU tests of the examples (and the docs' gpu blocks)"
MAXINSTR_DOCS_OUT="$out/docs" python3 -m pytest -q -m gpu tests/examples -p no:cacheprovider -rs --durations=10 2>&1 \
  | tee "$out/pytest-gpu.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
exit $rc
