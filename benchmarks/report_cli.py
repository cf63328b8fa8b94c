"""`maxinstr report --trace` as a whole process, start to exit, beside `nsys stats` in one run.

The target (issue 17, point 10): on the H200 host, the whole command on the 1M-kernel /
~93k-range nsys trace in <= 1.0 s and <= 400 MB peak RSS. Each configuration runs as a fresh
process, interleaved round by round; wall time from spawn to exit and the child's peak RSS
(``os.wait4``). `nsys stats` (the three reports the fixtures' .stats folders hold) runs beside it
when nsys is on PATH, and the ratios are printed.

    python benchmarks/trace_merge_gen.py tests/data/nsys/h200_decode.sqlite 1000000 /tmp/h200_1M.sqlite
    python benchmarks/report_cli.py /tmp/h200_1M.sqlite --rounds 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time


def run_once(cmd: list[str]) -> tuple[float, float]:
    """(wall s, peak RSS MB) of one process."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}")
    return wall, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--maxinstr", action="append", default=[], metavar="[LABEL=]EXE",
                    help="a maxinstr executable to time (repeat to compare builds, e.g. main=... new=...); "
                         "default: this Python's -m maxinstr")
    args = ap.parse_args()
    builds = [(x.partition("=")[0], x.partition("=")[2]) if "=" in x else ("", x) for x in args.maxinstr]
    builds = builds or [("", f"{sys.executable} -m maxinstr")]
    configs = {}
    for label, exe in builds:
        mx = exe.split()
        pre = f"{label} " if label else ""
        configs[f"{pre}report json"] = mx + ["report", "--trace", args.trace, "--format", "json", "--quiet", "-o",
                                            os.devnull]
        configs[f"{pre}report text"] = mx + ["report", "--trace", args.trace, "--quiet"]
    nsys = shutil.which("nsys")
    if nsys:
        configs["nsys stats"] = [nsys, "stats", "--force-export=false", "-r", "nvtx_gpu_proj_sum,nvtx_sum,cuda_gpu_kern_sum",
                                 "-f", "csv", "-o", os.path.join(os.environ.get("TMPDIR", "/tmp"), "report_cli_stats"),
                                 "--force-overwrite=true", args.trace]
    else:
        print("nsys not on PATH: no nsys stats column (run on the H200 host for the ratio)")
    times: dict[str, list[float]] = {k: [] for k in configs}
    rss: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(args.rounds):
        for name, cmd in configs.items():
            w, m = run_once(cmd)
            times[name].append(w)
            rss[name].append(m)
    print(f"{args.trace}: {args.rounds} rounds, fresh processes, interleaved; load average {os.getloadavg()[0]:.1f}")
    for name in configs:
        line = (f"  {name:16s} wall median {statistics.median(times[name]):.2f} s (min {min(times[name]):.2f}, "
                f"max {max(times[name]):.2f}); peak RSS {max(rss[name]):.0f} MB")
        if nsys and name != "nsys stats":
            line += f"; {statistics.median(times[name]) / statistics.median(times['nsys stats']):.2f}x nsys stats"
        print(line)
    for label, _ in builds:
        mine = [n for n in configs if n.startswith(f"{label} report" if label else "report")]
        ok = all(statistics.median(times[n]) <= 1.0 and max(rss[n]) <= 400 for n in mine)
        print(f"target (<= 1.0 s and <= 400 MB, whole command){' for ' + label if label else ''}:",
              "met" if ok else "NOT met")


if __name__ == "__main__":
    main()
