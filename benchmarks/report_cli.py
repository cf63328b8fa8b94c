"""`maxinstr report --trace` as a whole process, start to exit, beside `nsys stats` in one run.

The target (issue 17, point 10): on the H200 host, the whole command on the 1M-kernel /
~93k-range nsys trace in <= 1.0 s and <= 400 MB peak RSS. Each configuration runs as a fresh
process, interleaved round by round in a rotated order; wall time from spawn to exit and the
child's peak RSS (``os.wait4``; benchmarks/harness.py). `nsys stats` (the three reports the fixtures' .stats folders hold) runs beside it
when nsys is on PATH, and the ratios are printed.

    python benchmarks/trace_merge_gen.py tests/data/nsys/h200_decode.sqlite 1000000 /tmp/h200_1M.sqlite
    python benchmarks/report_cli.py /tmp/h200_1M.sqlite --rounds 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from harness import ChildRun, Stats, interleave, load_average, run_child


def run_once(cmd: list[str]) -> ChildRun:
    """One process, spawn to exit, its output discarded; a failing command stops the benchmark."""
    run = run_child(cmd, capture=False)
    if run.rc != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {run.rc}")
    return run


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
    runs = interleave(list(configs), args.rounds, lambda name, _r: run_once(configs[name]))
    wall = {name: Stats.of(r.wall_s for r in rs) for name, rs in runs.items()}
    rss = {name: max(r.peak_rss_mb for r in rs) for name, rs in runs.items()}
    print(f"{args.trace}: {args.rounds} rounds, fresh processes, interleaved (rotated); {load_average()}")
    for name in configs:
        line = (f"  {name:16s} wall median {wall[name].median:.2f} s (min {wall[name].min:.2f}, "
                f"max {wall[name].max:.2f}); peak RSS {rss[name]:.0f} MB")
        if nsys and name != "nsys stats":
            line += f"; {wall[name].median / wall['nsys stats'].median:.2f}x nsys stats"
        print(line)
    for label, _ in builds:
        mine = [n for n in configs if n.startswith(f"{label} report" if label else "report")]
        ok = all(wall[n].median <= 1.0 and rss[n] <= 400 for n in mine)
        print(f"target (<= 1.0 s and <= 400 MB, whole command){' for ' + label if label else ''}:",
              "met" if ok else "NOT met")


if __name__ == "__main__":
    main()
