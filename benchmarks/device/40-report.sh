#!/usr/bin/env bash
# Report on the H200 (run from the repo root after run_all.sh built maxinstr into PYTHONPATH).
# Captures the pattern the fixtures lack, a decode loop that re-runs the whole prompt every
# step (benchmarks/scenarios/reprefill_decode.py --mode reprefill), and its healthy contrast
# (--mode kvcache), each under nsys with maxinstr stages; exports SQLite + nsys's own stats
# (the same reports as tests/data/nsys/*.stats) so the coordinator can add them as fixtures,
# then checks the report:
#   - reprefill: the rule `reprefill_quadratic` fires on `decode` (the GPU op time and the matmul
#     time of a step grow with the index: stages[].step_work), and the matmul time grows >= 2x
#     (the scenario is sized for ~3x)
#   - kvcache:   it does not, its matmul time per step is flat; an unprofiled kvcache run gives
#     the headline (--unprofiled)
#   - maxinstr compare kvcache vs reprefill: decode slower beyond the noise bound
# Also captures an MoE decode (benchmarks/scenarios/moe_decode.py: router, top-k, grouped expert
# matmuls), prints its kernel names with their families and checks an MoE rule fires on decode.
# Results land in $OUT/report/: <mode>.sqlite, <mode>.stats/*.csv, <mode>-run/ (run dirs),
# <mode>.report.{json,md,txt}, compare.{json,txt}, checks.txt.
# Took 103 s on 2026-12-03 beside five other GPU steps with cuDNN SDPA (~13 s of graph builds per
# capture); now on flash SDPA and 16 x 32-token sequences it should take less.
set -uo pipefail
out="${OUT:-/tmp/out}/report"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
rc=0
[ -f .device/nsys-env.sh ] && source .device/nsys-env.sh
if ! command -v nsys >/dev/null; then
  echo "nsys not found (carry .device, see /work/shared/device/README.md)"; exit 1
fi
scenario=benchmarks/scenarios/reprefill_decode.py
# 16 sequences of a 32-token prompt: a re-prefilling step multiplies 528 -> 3,072 rows (compute-bound
# throughout on the H200), so its matmul time should grow ~3x over the steps; the cached step 16 rows
sargs="--batch 16 --prompt 32 --d-model 4096 --heads 32 --steps 160"
for mode in reprefill kvcache; do
  echo "== capture $mode"
  rm -rf "$out/$mode-run" /tmp/mi-$mode.*
  nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none --cuda-graph-trace=node -f true -o /tmp/mi-$mode \
    python3 $scenario --mode $mode $sargs --run-dir "$out/$mode-run" > "$out/$mode.nsys.log" 2>&1 || rc=1
  grep -v "^Collecting\|^Generating\|^Processing\|^\s*$" "$out/$mode.nsys.log" | tail -5
  if [ ! -f /tmp/mi-$mode.nsys-rep ] && [ -f /tmp/mi-$mode.qdstrm ]; then
    QdstrmImporter -i /tmp/mi-$mode.qdstrm >> "$out/$mode.nsys.log" 2>&1
  fi
  nsys export --type sqlite -f true -o "$out/$mode.sqlite" /tmp/mi-$mode.nsys-rep >> "$out/$mode.nsys.log" 2>&1 || rc=1
  mkdir -p "$out/$mode.stats"
  nsys stats --force-export=false -r nvtx_gpu_proj_sum,nvtx_sum,cuda_gpu_kern_sum -f csv \
    -o "$out/$mode.stats/x" "$out/$mode.sqlite" >> "$out/$mode.nsys.log" 2>&1
  for f in "$out/$mode.stats"/x_*.csv; do [ -f "$f" ] && mv "$f" "$out/$mode.stats/${f##*/x_}"; done
  ls -la "$out/$mode.sqlite" "$out/$mode.stats" 2>&1 | tail -5
done

echo "== capture moe (grouped expert matmuls + routing)"
rm -rf "$out/moe-run" /tmp/mi-moe.*
nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none -f true -o /tmp/mi-moe \
  python3 benchmarks/scenarios/moe_decode.py --run-dir "$out/moe-run" > "$out/moe.nsys.log" 2>&1 || rc=1
grep -v "^Collecting\|^Generating\|^Processing\|^\s*$" "$out/moe.nsys.log" | tail -4
[ ! -f /tmp/mi-moe.nsys-rep ] && [ -f /tmp/mi-moe.qdstrm ] && QdstrmImporter -i /tmp/mi-moe.qdstrm >> "$out/moe.nsys.log" 2>&1
nsys export --type sqlite -f true -o "$out/moe.sqlite" /tmp/mi-moe.nsys-rep >> "$out/moe.nsys.log" 2>&1 || rc=1
mkdir -p "$out/moe.stats"
nsys stats --force-export=false -r nvtx_gpu_proj_sum,nvtx_sum,cuda_gpu_kern_sum -f csv \
  -o "$out/moe.stats/x" "$out/moe.sqlite" >> "$out/moe.nsys.log" 2>&1
for f in "$out/moe.stats"/x_*.csv; do [ -f "$f" ] && mv "$f" "$out/moe.stats/${f##*/x_}"; done
python3 -m maxinstr report "$out/moe-run" --trace "$out/moe.sqlite" --quiet --format json -o "$out/moe.report.json" || rc=1
python3 -m maxinstr report "$out/moe.report.json" --format text -o "$out/moe.report.txt" || rc=1
head -40 "$out/moe.report.txt"
# kernel names and families of the MoE decode (to refine the families table from real names)
python3 - "$out/moe.report.json" <<'PY' | tee "$out/moe.families.txt"
import json, sys
r = json.load(open(sys.argv[1]))
dec = next(s for s in r["stages"] if s["name"] == "decode")
print("decode families:", [(f["family"], round(f["share"], 3)) for f in dec["mix"]["families"]])
for k in dec["mix"]["top_kernels"]:
    print(f"  {k['family']:15s} {k['share']:.3f}  {k['name'][:150]}")
print("findings:", [(f["id"], f["stage"]) for f in r["diagnosis"]])
PY

echo "== unprofiled kvcache run (headline timings)"
rm -rf "$out/kvcache-plain-run" "$out/reprefill-plain-run"
python3 $scenario --mode kvcache $sargs --run-dir "$out/kvcache-plain-run" 2>&1 | tail -2 || rc=1
python3 $scenario --mode reprefill $sargs --run-dir "$out/reprefill-plain-run" 2>&1 | tail -2 || rc=1

echo "== reports"
for mode in reprefill kvcache; do
  extra=""
  [ -d "$out/$mode-plain-run" ] && extra="--unprofiled $out/$mode-plain-run"
  python3 -m maxinstr report "$out/$mode-run" --trace "$out/$mode.sqlite" $extra --quiet --format json \
    -o "$out/$mode.report.json" || rc=1
  # the other views re-render the saved JSON (no second read of the trace)
  python3 -m maxinstr report "$out/$mode.report.json" --format md -o "$out/$mode.report.md" || rc=1
  python3 -m maxinstr report "$out/$mode.report.json" --format text -o "$out/$mode.report.txt" || rc=1
  head -60 "$out/$mode.report.txt"
done

echo "== compare"
python3 -m maxinstr compare "$out/kvcache-plain-run" "$out/reprefill-plain-run" --format json -o "$out/compare.json" || rc=1
python3 -m maxinstr compare "$out/kvcache-plain-run" "$out/reprefill-plain-run" --format text -o "$out/compare.txt" || rc=1
cat "$out/compare.txt" | head -40

echo "== GPU tests of the report (samples and GPU events per stage)"
python3 -m pytest -q -m gpu tests/analyze -p no:cacheprovider -s -rs 2>&1 | tee "$out/pytest-gpu.txt" | tail -40
[ "${PIPESTATUS[0]}" = 0 ] || rc=1

echo "== checks"
python3 - "$out" <<'PY' 2>&1 | tee "$out/checks.txt"
import json, sys
out = sys.argv[1]
ok = True
def check(cond, what):
    global ok
    ok &= bool(cond)
    print(("PASS " if cond else "FAIL ") + what)
for mode in ("reprefill", "kvcache"):
    r = json.load(open(f"{out}/{mode}.report.json"))
    ids = [(f["id"], f["stage"]) for f in r["diagnosis"]]
    dec = next(s for s in r["stages"] if s["name"] == "decode")
    print(mode, "join", r["sources"]["join"], r["sources"]["records_joined"], "decode steps", dec.get("steps"))
    print(mode, "findings", ids)
    work = dec.get("step_work") or {}
    print(mode, "decode step work", {k: {x: round(v[x], 3) for x in ("spearman", "last_over_first", "first_quarter_median_ns",
                                                                      "last_quarter_median_ns")} for k, v in work.items()})
    rp = [f for f in r["diagnosis"] if f["id"] == "reprefill_quadratic"]
    if rp:
        print(mode, "reprefill_quadratic:", rp[0]["title"], rp[0]["evidence"])
    check(r["sources"]["join"] == "payload" and r["sources"]["records_joined"] > 0, f"{mode}: records joined by payload")
    check(dec["gpu_proj_ns"]["n"] > 0, f"{mode}: decode has projected GPU time")
    check((dec.get("samples") or {}).get("samples", 0) > 0, f"{mode}: decode has sampler rows")
    print(mode, "decode samples", {k: v for k, v in (dec.get("samples") or {}).items() if k != "devices"})
    fired = ("reprefill_quadratic", "decode") in ids
    check(fired if mode == "reprefill" else not fired, f"{mode}: reprefill_quadratic {'fires' if mode == 'reprefill' else 'does not fire'}")
    if mode == "kvcache":
        check(r["headline_source"] == "unprofiled_run", "kvcache: headline from the unprofiled run")
        check(work and work["matmul_ns"]["last_over_first"] < 1.1, "kvcache: matmul time per step flat (< 1.1x)")
    else:  # the scenario is sized for a clear pattern: ~3x expected from 528 -> 3,072 rows
        check(work and work["matmul_ns"]["last_over_first"] >= 2.0, "reprefill: matmul time per step grows >= 2x")
m = json.load(open(f"{out}/moe.report.json"))
moe = [(f["id"], f["stage"], f["evidence"].get("routing_over_grouped")) for f in m["diagnosis"] if f["id"].startswith("moe_")]
print("moe findings", moe)
check(any(s == "decode" for _, s, _ in moe), "moe: an MoE rule fires on decode")
c = json.load(open(f"{out}/compare.json"))["comparisons"][0]
dec = next(x for x in c["stages"] if x["stage"] == "decode")
print("compare decode", {k: dec.get(k) for k in ("median_delta_ns", "noise_bound_ns", "verdict")})
check(dec["verdict"] == "slower", "compare: re-prefill decode slower than kvcache beyond noise")
print("ALL PASS" if ok else "SOME CHECKS FAILED")
sys.exit(0 if ok else 1)
PY
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
du -sh "$out"/* 2>/dev/null | sort -h | tail -12
echo "40-report rc=$rc"
exit $rc
