#!/usr/bin/env bash
# Two trees of maxinstr on one machine, in turn (old, new, old, new, ...): the tree in OLD_TREE
# (default .old/, e.g. `git archive 8f7e610 pyproject.toml CMakeLists.txt src csrc README.md | tar
# -x -C .old`, carried) built into /tmp/site_old, against the checkout run_all.sh built into
# /tmp/site. Each round runs, for each tree, benchmarks/decoder_ab.py (the PyTorch decode step:
# bare, nvtx, default, kernels=True, CUPTI's floor; TREE_AB=0 skips it) and
# benchmarks/stage_overhead.py --quick; with TREE_SAMPLER=1 also benchmarks/sampler_cost.py on the
# machine's GPU (the sampler in its child process). The benchmark scripts are this checkout's for
# both. Results in $OUT/trees-ab/.
set -uo pipefail
out="${OUT:-/tmp/out}/trees-ab"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
old=${OLD_TREE:-.old}
[ -f "$old/pyproject.toml" ] || { echo "no tree in $old (carry it)"; exit 2; }
t0=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps --no-compile --target /tmp/site_old "./$old" > "$out/build-old.log" 2>&1
echo "old build rc=$? in $(( $(date +%s) - t0 )) s"
python3 -m compileall -q /tmp/site_old/maxinstr > /dev/null 2>&1
modes=${AB_MODES:-bare,nvtx,default,kernels,cupti_floor}
for r in $(seq "${TREE_ROUNDS:-2}"); do
  for tree in old new; do
    if [ $tree = old ]; then pp=/tmp/site_old:/tmp/site; else pp=/tmp/site; fi
    echo "=== round $r, $tree ($(PYTHONPATH=$pp python3 -c 'import maxinstr; print(maxinstr.__file__)'))"
    [ "${TREE_AB:-1}" = 1 ] && PYTHONPATH=$pp timeout -k 5 "${AB_TIMEOUT:-120}" python3 benchmarks/decoder_ab.py --rounds "${AB_ROUNDS:-6}" \
      --steps "${AB_STEPS:-128}" --modes "$modes" --json "$out/ab-$tree-$r.json" 2>&1 | tee "$out/ab-$tree-$r.txt" | sed -n '/^mode/,/^$/p'
    PYTHONPATH=$pp timeout -k 5 60 python3 benchmarks/stage_overhead.py --quick 2>&1 | tee "$out/stage-$tree-$r.txt" | tail -n 12
    [ "${TREE_SAMPLER:-0}" = 1 ] && PYTHONPATH=$pp timeout -k 5 90 python3 benchmarks/sampler_cost.py --device real \
      --modes process --rounds 4 --seconds 0.5 --json "$out/sampler-$tree-$r.json" 2>&1 | tee "$out/sampler-$tree-$r.txt" | tail -n 12
  done
done
exit 0
