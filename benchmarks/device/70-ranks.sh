#!/usr/bin/env bash
# Multi-rank runs on the H200 (issues 8 and 10; run from the repo root after run_all.sh built
# maxinstr into PYTHONPATH). torchrun starts NPROC (default 2) ranks of
# benchmarks/scenarios/ranks_collective.py: each step `compute` (bf16 matmuls; the straggler
# rank runs 3x as many) then `allreduce` (torch.distributed all_reduce of a CUDA tensor, waited
# for). Backend: nccl when each rank has its own GPU (the 2-GPU kind), else gloo on CUDA
# tensors (one GPU: NCCL refuses two ranks on one device). Each rank writes its part of one run.
#   1. straggler run (rank 1 slow), no profiler: report names rank 1 (finding straggler_rank),
#      allreduce is a [sync] stage where rank 0 waits
#   2. balanced run: no straggler finding
#   3. straggler run with each rank under its own nsys (torchrun --no-python nsys ... -o r%q{RANK}),
#      then `maxinstr report RUN --trace r0.sqlite --trace r1.sqlite`: every record of both ranks
#      joins its own rank's trace, per-rank GPU time and collective share (NCCL kernels under
#      nccl; gloo reduces on the host, so 0 there), straggler still named
# Results in $OUT/ranks/: *.log, *-run/ (run dirs), *.report.{json,txt,md}, r<N>.sqlite, checks.txt.
# About 60-90 s. Exit status 1 when a check fails. NPROC=N ranks (default 2), STEPS, EXTRA_ARGS
# (more scenario options). CPU dry run (no GPU: gloo on CPU tensors, nsys part skipped):
#   OUT=/tmp/o EXTRA_ARGS="--size 384 --matmuls 6" bash benchmarks/device/70-ranks.sh
set -uo pipefail
out="${OUT:-/tmp/out}/ranks"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} COLUMNS=140
rc=0
NPROC=${NPROC:-2}
SC=benchmarks/scenarios/ranks_collective.py
ARGS="--steps ${STEPS:-30} --warmup 3 --elements 1048576 ${EXTRA_ARGS:-}"
TR="python3 -m torch.distributed.run --standalone --nproc-per-node $NPROC"
nvidia-smi -L | tee "$out/gpus.txt"

report() {  # run-dir name [--trace ...]
  local run=$1 name=$2; shift 2
  python3 -m maxinstr report "$run" "$@" --quiet --format json -o "$out/$name.report.json" || rc=1
  python3 -m maxinstr report "$run" "$@" --quiet --format md -o "$out/$name.report.md" || rc=1
  python3 -m maxinstr report "$run" "$@" --quiet > "$out/$name.report.txt" 2>&1 || rc=1
  sed -n '/^Ranks/,/^Where the time goes/p' "$out/$name.report.txt" | head -40
}

echo "== 1. straggler run (rank 1), no profiler"
rm -rf "$out/straggler-run"
timeout 60 $TR $SC --run-dir "$out/straggler-run" --straggler 1 $ARGS > "$out/straggler.log" 2>&1 || { rc=1; tail -20 "$out/straggler.log"; }
head -3 "$out/straggler.log"
report "$out/straggler-run" straggler

echo "== 2. balanced run"
rm -rf "$out/balanced-run"
timeout 60 $TR $SC --run-dir "$out/balanced-run" --straggler -1 $ARGS > "$out/balanced.log" 2>&1 || { rc=1; tail -20 "$out/balanced.log"; }
report "$out/balanced-run" balanced

echo "== 3. straggler run, each rank under nsys"
[ -f .device/nsys-env.sh ] && source .device/nsys-env.sh
traces=()
if command -v nsys >/dev/null; then
  rm -rf "$out/nsys-run" /tmp/mi-ranks-r*
  timeout 90 $TR --no-python nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none -f true -o "/tmp/mi-ranks-r%q{RANK}" \
    python3 $SC --run-dir "$out/nsys-run" --straggler 1 $ARGS --steps 20 > "$out/nsys.log" 2>&1 || { rc=1; tail -20 "$out/nsys.log"; }
  for ((r = 0; r < NPROC; r++)); do
    nsys export --type sqlite -f true -o "$out/r$r.sqlite" "/tmp/mi-ranks-r$r.nsys-rep" >> "$out/nsys.log" 2>&1 || rc=1
    traces+=(--trace "$out/r$r.sqlite")
  done
  report "$out/nsys-run" nsys "${traces[@]}"
else
  echo "nsys not found: part 3 skipped (carry .device)"
fi

echo "== checks"
python3 - "$out" "$NPROC" <<'PY' 2>&1 | tee "$out/checks.txt"
import json, os, sys
out, nproc = sys.argv[1], int(sys.argv[2])
bad = 0


def check(ok, what):
    global bad
    bad += not ok
    print(("PASS " if ok else "FAIL ") + what)


def load(name):
    p = os.path.join(out, name + ".report.json")
    return json.load(open(p)) if os.path.exists(p) else None


def stage(rep, name):
    return next((s for s in rep["ranks"]["stages"] if s["stage"] == name), None)


def medians(rep, name, key="host_ns"):
    st = stage(rep, name)
    return {r["rank"]: round((r.get(key) or {}).get("median", 0) / 1e6, 3) for r in st["per_rank"]} if st else {}


for name, want in (("straggler", [1]), ("balanced", []), ("nsys", [1])):
    rep = load(name)
    if rep is None:
        check(name == "nsys" and not os.path.exists(os.path.join(out, "nsys.log")), f"{name}: report written")
        continue
    sec = rep.get("ranks") or {}
    check(sec.get("world_size") == nproc, f"{name}: {sec.get('world_size')} ranks merged (want {nproc})")
    got = [s["rank"] for s in sec.get("stragglers") or []]
    finding = [f for f in rep["diagnosis"] if f["id"] == "straggler_rank"]
    check(got == want and len(finding) == len(want), f"{name}: stragglers {got} (want {want}); findings {[f['title'] for f in finding]}")
    print(f"   compute host median ms per rank: {medians(rep, 'compute')}; allreduce: {medians(rep, 'allreduce')}")
    st = stage(rep, "allreduce")
    if st:
        print(f"   allreduce sync={st.get('sync')} wait median ms: "
              f"{ {r['rank']: round((r.get('wait_median_ns') or 0) / 1e6, 3) for r in st['per_rank']} }")
    if want:
        check(bool(st and st.get("sync")), f"{name}: allreduce is a synchronising stage")
        waits = {r["rank"]: r.get("wait_median_ns") or 0 for r in st["per_rank"]} if st else {}
        check(all(waits.get(r, 0) > 2 * waits.get(1, 0) for r in range(nproc) if r != 1),
              f"{name}: the other ranks wait longer than rank 1 in allreduce")
    if name == "nsys":
        n_rec = sum(r.get("records", 0) for r in sec["ranks"])
        src = rep["sources"]
        check(src.get("join") == "payload" and src.get("records_joined") == n_rec,
              f"nsys: {src.get('records_joined')} of {n_rec} records joined their rank's trace ({src.get('join')})")
        gpu = {g["rank"]: g for g in sec.get("gpu") or []}
        check(sorted(gpu) == list(range(nproc)) and all(g["ops"] > 0 for g in gpu.values()),
              f"nsys: GPU ops per rank {[(r, g['ops']) for r, g in sorted(gpu.items())]}")
        for r, g in sorted(gpu.items()):
            print(f"   rank {r}: GPU {g['gpu_ns'] / 1e6:.2f} ms, collective {g['collective_ns'] / 1e6:.2f} ms "
                  f"({g['collective_share']}), top family {g['top_family']}")
        print(f"   GPU compute median ms (projected) per rank: {medians(rep, 'compute', 'gpu_proj_ns')}")
        backend = (rep.get("environment", {}).get("user") or {}).get("backend")
        fams = {f["family"]: round(f["share"], 3) for f in (rep.get("gpu") or {}).get("families", [])}
        print(f"   backend {backend}; GPU families over all ranks: {fams}")
        if backend == "nccl":
            check(all((g["collective_share"] or 0) > 0 for g in gpu.values()), "nsys: NCCL kernels classified as collective on every rank")
            check(all(gpu[r]["collective_ns"] > gpu[1]["collective_ns"] for r in gpu if r != 1),
                  "nsys: the fast ranks spend longer in collective kernels (waiting for rank 1)")
print(f"{bad} check(s) failed")
sys.exit(1 if bad else 0)
PY
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
exit $rc
