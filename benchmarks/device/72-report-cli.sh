#!/usr/bin/env bash
# `maxinstr report --trace` on the 1M-kernel nsys trace as a whole process beside `nsys stats`
# (issue 17, point 10: <= 1.0 s and <= 400 MB on the H200 host): benchmarks/report_cli.py, then
# one profiled run (cProfile, cumulative) to show where the time goes. Run from the repo root
# after run_all.sh installed maxinstr (carry .device for nsys). Results in $OUT/report-cli/.
set -uo pipefail
out="${OUT:-/tmp/out}/report-cli"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
[ -f .device/nsys-env.sh ] && source .device/nsys-env.sh
trace=/tmp/h200_1M.sqlite
[ -f "$trace" ] || python3 benchmarks/trace_merge_gen.py tests/data/nsys/h200_decode.sqlite 1000000 "$trace" > "$out/gen.txt" 2>&1
nproc > "$out/host.txt"; uptime >> "$out/host.txt"
# bytecode for what the report imports, as a user's pip install leaves it: the image sets
# PYTHONDONTWRITEBYTECODE and ships numpy, click and rich without .pyc, so every process compiled
# numpy's sources again (0.19 s of a 1.17 s report on an H100 host, 2026-12-05)
python3 - <<'PY' >> "$out/host.txt" 2>&1
import compileall, importlib, os
for name in ("numpy", "click", "rich", "maxinstr"):
    mod = importlib.import_module(name)
    ok = compileall.compile_dir(os.path.dirname(mod.__file__), quiet=1, workers=1)
    print("bytecode", name, ok)
PY
python3 benchmarks/report_cli.py "$trace" --rounds "${REPORT_ROUNDS:-3}" ${REPORT_CLI_ARGS:-} 2>&1 | tee "$out/table.txt"
rc=${PIPESTATUS[0]}
python3 -c "import cProfile, pstats, sys; from maxinstr.cli import main; sys.argv=['maxinstr']
cProfile.run('main([\"report\", \"--trace\", \"$trace\", \"--format\", \"json\", \"--quiet\", \"-o\", \"/dev/null\"])', '/tmp/report.prof')" > /dev/null 2>&1
python3 -c "import pstats; pstats.Stats('/tmp/report.prof').sort_stats('cumulative').print_stats(45)" > "$out/profile.txt" 2>&1
head -80 "$out/profile.txt"
exit $rc
