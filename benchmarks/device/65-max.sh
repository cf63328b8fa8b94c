#!/usr/bin/env bash
# MAX on the H200 (run from the repo root after run_all.sh installed MAX and maxinstr into
# PYTHONPATH; MAX travels in parts: benchmarks/device/max-parts.sh says how). Results land in
# $OUT/max/: run directories, nsys SQLite exports and reports, packed by run_all.sh.
#   MAX_EXAMPLES="block decoder" (default both): which examples run
#   MAX_RUNS="plain plain2 nsys run kernels maxprof" (default all): which runs of each (plain
#      compiles the graphs into MAX's cache first; maxprof recompiles them with MAX's markers)
#   1. examples/max_block.py: plain (events on MAX's queue), under nsys (MAX's markers off), under
#      `maxinstr run` (MODULAR_ENABLE_PROFILING=detailed, its default), with kernels=True, and
#      with --max-profiling detailed (session.gpu_profiling: MAX's kernel-level markers) with and
#      without nsys; MAX's NVTX library lookups seen through LD_DEBUG
#   2. examples/max_decoder.py (8 layers, hidden 2048, bf16): plain, `maxinstr run`, kernels=True,
#      --max-profiling detailed under nsys; tokens/s of each
set -uo pipefail
out="${OUT:-/tmp/out}/max"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 COLUMNS=120
[ -f .device/nsys-env.sh ] && source .device/nsys-env.sh
work=/tmp/max-runs
mkdir -p "$work"
rc=0
NSYS_FLAGS=(-t cuda,nvtx --sample=none --cpuctxsw=none --force-overwrite=true)

python3 - <<'PY' 2>&1 | tee "$out/facts.txt"
import glob, os, sys
try:
    import max
    from maxinstr.integrations.max import max_versions, nvtx_v2_candidates
    print("max", max_versions())
    print("nvtx v2 candidates:", nvtx_v2_candidates())
except Exception as exc:
    print("MAX not importable:", exc); sys.exit(1)
for pat in ("/usr/local/cuda*/lib64/libnvToolsExt*", "/usr/local/cuda*/lib64/libnvtx3*", "/usr/local/cuda*/targets/*/lib/libnvtx*",
            "/usr/lib/x86_64-linux-gnu/libnvToolsExt*", "/usr/local/cuda*/lib64/libcupti*", "/usr/local/cuda*/targets/*/lib/libcupti.so*"):
    print(pat, glob.glob(pat))
PY
[ "${PIPESTATUS[0]}" = 0 ] || exit 1

timed() {  # timed NAME CMD...: runs CMD, its output in $out/NAME.txt, wall seconds printed
  local name=$1; shift
  local s0; s0=$(date +%s%N)
  "$@" > "$out/$name.txt" 2>&1
  local st=$?
  echo "$name: rc=$st in $(( ($(date +%s%N) - s0) / 1000000 )) ms"
  [ $st = 0 ] || { rc=1; tail -25 "$out/$name.txt"; }
  return $st
}
export_sqlite() {  # export_sqlite BASE: BASE.nsys-rep -> BASE.sqlite
  [ -f "$1.nsys-rep" ] || { [ -f "$1.qdstrm" ] && QdstrmImporter -i "$1.qdstrm" > /dev/null 2>&1; }
  nsys export --type sqlite --force-overwrite=true -o "$1.sqlite" "$1.nsys-rep" > /dev/null 2>&1 || echo "export of $1 failed"
}
report() {  # report NAME RUN [--trace FILE]: text at 120 and 80 columns, JSON
  local name=$1; shift
  COLUMNS=120 python3 -m maxinstr report "$@" > "$out/$name.report120.txt" 2>&1 || rc=1
  COLUMNS=80 python3 -m maxinstr report "$@" > "$out/$name.report80.txt" 2>&1
  python3 -m maxinstr report "$@" --format json -o "$out/$name.report.json" > /dev/null 2>&1
}

for ex in ${MAX_EXAMPLES:-block decoder}; do
  if [ "$ex" = block ]; then
    script=examples/max_block.py; args=(--requests 3 --steps 16)
  else
    script=examples/max_decoder.py; args=(--requests 3 --steps 32)
  fi
  p="$work/$ex"
  echo "== $ex"
  unset MODULAR_ENABLE_PROFILING
  want() { [[ " ${MAX_RUNS:-plain plain2 nsys run kernels maxprof} " == *" $1 "* ]]; }
  if want plain; then
    timed "$ex-plain" python3 $script "${args[@]}" --run-dir "$p-plain" || {
      if [ "$ex" = decoder ]; then  # flash attention where plain attention would do: try that
        args+=(--attention plain); timed "$ex-plain-retry" python3 $script "${args[@]}" --run-dir "$p-plain"
      fi
    }
    grep -E "^max_(block|decoder):" "$out/$ex-plain.txt" "$out/$ex-plain-retry.txt" 2>/dev/null
    report "$ex-plain" "$p-plain"
  fi
  if want plain2; then
    timed "$ex-plain2" python3 $script "${args[@]}" --run-dir "$p-plain2" --no-report  # compiled: cache warm
    grep -E "^max_(block|decoder):" "$out/$ex-plain2.txt"
    report "$ex-plain2" "$p-plain2"
  fi

  # nsys with MAX's markers off: what a user gets from a bare `nsys profile`
  want nsys && timed "$ex-nsys" nsys profile "${NSYS_FLAGS[@]}" -o "$p-nsys" python3 $script "${args[@]}" --run-dir "$p-nsys" --no-report
  want nsys && { export_sqlite "$p-nsys"; report "$ex-nsys" "$p-nsys" --trace "$p-nsys.sqlite"; }

  # the one-command path (MODULAR_ENABLE_PROFILING=detailed by default there)
  if want run; then
    timed "$ex-run" python3 -m maxinstr run -y -o "$p-run" -- python3 $script "${args[@]}" --no-report
    ls "$p-run" > "$out/$ex-run.files.txt" 2>&1
    cp "$p-run"/*.sqlite "$p-run.sqlite" 2>/dev/null || export_sqlite "$p-run/profile"
    report "$ex-run" "$p-run"
  fi
  if want kernels; then
    timed "$ex-kernels" python3 $script "${args[@]}" --run-dir "$p-kernels" --kernels --no-report
    grep -E "^max_(block|decoder):|kernels=True|Warning" "$out/$ex-kernels.txt" | head -5
    report "$ex-kernels" "$p-kernels"
  fi
  want maxprof || { grep -h -E "^max_(block|decoder):" "$out/$ex"-*.txt; continue; }

  # MAX's kernel-level markers (session.gpu_profiling) need NVTX's v2 entry points: maxinstr
  # provides them (enable_max_profiling); without nsys, then under nsys
  timed "$ex-maxprof" python3 $script "${args[@]}" --run-dir "$p-maxprof" --max-profiling detailed --no-report
  timed "$ex-maxprof-nsys" nsys profile "${NSYS_FLAGS[@]}" -o "$p-maxprof-nsys" python3 $script "${args[@]}" \
    --run-dir "$p-maxprof-nsys" --max-profiling detailed --no-report
  export_sqlite "$p-maxprof-nsys"
  report "$ex-maxprof-nsys" "$p-maxprof-nsys" --trace "$p-maxprof-nsys.sqlite"
  if [ "$ex" = block ]; then  # the cause, seen: which NVTX libraries MAX looks for, and what it does without one
    MAXINSTR_NO_NVTX_V2=1 LD_DEBUG=libs python3 $script "${args[@]}" --run-dir "$p-ldd" --max-profiling detailed --no-report \
      > "$out/$ex-ld-debug-full.txt" 2>&1
    echo "without maxinstr's NVTX v2 library: rc=$?" | tee "$out/$ex-ld-debug.txt"
    grep -i -E "nvtx|nvToolsExt|ABORT|symbol" "$out/$ex-ld-debug-full.txt" | grep -v "calling init" | head -60 >> "$out/$ex-ld-debug.txt"
    rm -f "$out/$ex-ld-debug-full.txt"
  fi
  grep -h -E "^max_(block|decoder):" "$out/$ex"-*.txt
done

# what comes back: run directories and SQLite exports of this step, compressed
( cd "$work" && tar czf "$out/max-runs.tgz" --exclude='*.nsys-rep' --exclude='*.qdstrm' . )
ls -la "$out/max-runs.tgz"
exit $rc
