#!/usr/bin/env bash
# Issue 26, what watching costs on a launch-bound decode step (run from the repo root after
# run_all.sh installed maxinstr and the .whl wheels: nvtx, cupti-python):
#  1. benchmarks/decoder_ab.py: bare, NVTX, the default session and each of its parts taken away,
#     kernels=True and CUPTI's floor with each part the collector adds, rotated blocks in one
#     process, AB_ROUNDS rounds (default 6); the verdicts against the targets; one run directory
#     of each session mode kept (their part.json counters feed the report's footprint estimate);
#  2. the start-up hook as a program sees it on this machine (numpy imported before line 1?);
#  3. benchmarks/decoder_sources.py: the PyTorch decoder's tok/s in fresh processes, bare,
#     default, kernels=True, `maxinstr run --profiler none` and nsys, SRC_ROUNDS rounds (default 3).
# Results in $OUT/footprint/.
set -uo pipefail
out="${OUT:-/tmp/out}/footprint"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
[ -f .device/nsys-env.sh ] && source .device/nsys-env.sh
modes=${AB_MODES:-bare,nvtx,default,default_noattrs,default_hostonly,default_nosampler,memory,kernels,kernels_records,cupti_floor,floor_tags,floor_flush,kernels_noflush}
AB_KEEP="$out/ab-runs" timeout -k 5 "${AB_TIMEOUT:-300}" python3 benchmarks/decoder_ab.py --rounds "${AB_ROUNDS:-6}" \
  --steps "${AB_STEPS:-128}" --modes "$modes" --json "$out/decoder_ab.json" 2>&1 | tee "$out/decoder_ab.txt"
echo "--- the report's footprint estimate on the kept run directories (measured above: x bare - 1)"
for d in "$out"/ab-runs/*; do
  python3 -m maxinstr report "$d" --format json 2>/dev/null | python3 -c "
import json, sys
fp = json.load(sys.stdin).get('footprint') or {}
print('$(basename "$d")', 'estimate', None if fp.get('overall_share') is None else round(100 * fp['overall_share'], 2), '%',
      {k: round(v / 1e3) for k, v in (fp.get('overall_ns_by_source') or {}).items()}, 'us;', 'stage_ns', fp.get('stage_ns'),
      'event_ns', fp.get('event_ns'), 'timed', fp.get('gpu_timed_instances'))"
done
echo "--- start-up hook"
python3 -m maxinstr run -y -q --no-report --profiler none -o /tmp/hookrun -- python3 -c \
  "import sys; print('numpy before line 1:', 'numpy' in sys.modules, '| maxinstr:', any(m.startswith('maxinstr') for m in sys.modules))"
cat /tmp/hookrun/child.log
if [ "${SRC_ROUNDS:-3}" -gt 0 ]; then
  timeout -k 5 "${SRC_TIMEOUT:-300}" python3 benchmarks/decoder_sources.py --rounds "${SRC_ROUNDS:-3}" \
    --configs "${SRC_CONFIGS:-bare,default,kernels,run,nsys}" --out /tmp/decoder-sources --timeout 120 2>&1 | tee "$out/sources.txt"
  cp /tmp/decoder-sources/sources.json "$out/" 2>/dev/null
fi
( cd "$out" && tar czf ab-runs.tgz ab-runs 2>/dev/null && rm -rf ab-runs )
exit 0
