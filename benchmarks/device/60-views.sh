#!/usr/bin/env bash
# Views on the H200 (run from the repo root after run_all.sh built maxinstr into PYTHONPATH).
# A real decode run (benchmarks/scenarios/reprefill_decode.py --mode kvcache, small) under nsys,
# with maxinstr stages (NVTX payload = record id) and the GPU sampler, then:
#   - Perfetto JSON: the clock offset comes from payload-matched record/range pairs
#     (metadata clock.method == matched_pairs, join == payload, spread small), sampler counter
#     tracks are present, every trace op is a slice, and after alignment no joined stage's
#     projected GPU span starts before its host range (the GPU cannot run work not yet launched)
#   - HTML: written with util / SM activity / power lines over the stage bands
#   - the same without nsys (plain run: samples + GPU event spans, no trace)
# Results in $OUT/views/: kv.sqlite, kv-run/, kv.perfetto.json.gz, kv.html, plain-run/, plain.html,
# checks.txt. Takes ~1-2 minutes.
set -uo pipefail
out="${OUT:-/tmp/out}/views"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
rc=0
[ -f .device/nsys-env.sh ] && source .device/nsys-env.sh
scenario=benchmarks/scenarios/reprefill_decode.py
args="--mode kvcache --steps 48 --requests 2 --d-model 4096"

echo "== plain run (sampler, GPU events, no profiler)"
rm -rf "$out/plain-run"
python3 $scenario $args --run-dir "$out/plain-run" 2>&1 | tail -2 || rc=1
python3 -m maxinstr report "$out/plain-run" --quiet --format html -o "$out/plain.html" || rc=1
python3 -m maxinstr report "$out/plain-run" --quiet --format perfetto -o "$out/plain.perfetto.json" || rc=1

if command -v nsys >/dev/null; then
  echo "== nsys capture"
  rm -rf "$out/kv-run" /tmp/mi-views.*
  nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none -f true -o /tmp/mi-views \
    python3 $scenario $args --run-dir "$out/kv-run" > "$out/kv.nsys.log" 2>&1 || rc=1
  [ ! -f /tmp/mi-views.nsys-rep ] && [ -f /tmp/mi-views.qdstrm ] && QdstrmImporter -i /tmp/mi-views.qdstrm >> "$out/kv.nsys.log" 2>&1
  nsys export --type sqlite -f true -o "$out/kv.sqlite" /tmp/mi-views.nsys-rep >> "$out/kv.nsys.log" 2>&1 || rc=1
  python3 -m maxinstr report "$out/kv-run" --trace "$out/kv.sqlite" --quiet --format html -o "$out/kv.html" || rc=1
else
  echo "nsys not found (carry .device): trace checks skipped"; rc=1
fi

echo "== checks"
python3 - "$out" <<'PY' 2>&1 | tee "$out/checks.txt"
import json, os, sys, time
from pathlib import Path
import numpy as np
from maxinstr.analyze.report import analyze
from maxinstr.analyze.timeline import timeline
from maxinstr.render import perfetto, html
out = Path(sys.argv[1]); bad = 0
def check(ok, what):
    global bad
    bad += not ok
    print(("ok   " if ok else "FAIL ") + what)

a = analyze(run=out / "plain-run")
m = perfetto.write(out / "plain.perfetto.json.gz", a.report, analysis=a)
c = m["counts"]
check(c["counter_samples"] > 0, f"plain: counter samples {c['counter_samples']}")
check(c["gpu_event_spans"] > 0, f"plain: GPU event spans {c['gpu_event_spans']} of {c['stage_ranges']} stages")
doc = html.render(a.report, analysis=a)
n_series = doc.count('class="series"')
check(n_series >= 3, f"plain html: {n_series} plotted series, {len(doc)} bytes")

if (out / "kv.sqlite").exists():
    a = analyze(run=out / "kv-run", trace=out / "kv.sqlite")
    t = time.perf_counter()
    m = perfetto.write(out / "kv.perfetto.json.gz", a.report, analysis=a)
    dt = time.perf_counter() - t
    c, clk = m["counts"], m["clock"]
    print(json.dumps(m["clock"]), json.dumps(c), f"write {dt:.2f} s")
    check(clk["method"] == "matched_pairs" and clk["join"] == "payload", f"clock {clk['method']} by {clk['join']}, {clk['pairs']} pairs")
    check(clk["spread_ns"] is not None and clk["spread_ns"] < 20_000, f"offset {clk['offset_ns']} ns, spread (MAD) {clk['spread_ns']} ns")
    check(c["ops"] == len(a.trace.ops), f"ops {c['ops']} == trace ops {len(a.trace.ops)}")
    check(c["counter_samples"] > 0, f"counter samples {c['counter_samples']}")
    tl = timeline(a)
    j = (a.instances.range_index >= 0) & (tl.proj_start_ns >= 0)
    early = tl.proj_start_ns[j] < a.instances.host_start_ns[j] - clk["spread_ns"]
    check(j.sum() > 0 and early.mean() < 0.01, f"{int(early.sum())} of {int(j.sum())} joined stages start on the GPU before their host range")
    lag = (tl.proj_start_ns[j] - a.instances.host_start_ns[j]) / 1e3
    print(f"GPU start - host start: median {np.median(lag):.1f} us, p10 {np.percentile(lag, 10):.1f} us")
print("views checks:", "FAILED" if bad else "ok")
sys.exit(1 if bad else 0)
PY
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
ls -la "$out"
echo "60-views rc=$rc"
exit $rc
