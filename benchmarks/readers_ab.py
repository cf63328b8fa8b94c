"""Two builds of the trace readers side by side: ``open_trace`` on the same scaled traces, each read
in a fresh process, the builds interleaved round by round (the order flipped every round), and a
hash of each Trace's whole content, which must be the same for both builds. Timed: importing
``maxinstr.traces`` and the read (wall and CPU seconds of the child, numpy already imported).

    python benchmarks/trace_merge_gen.py tests/data/nsys/h200_decode.sqlite 1000000 /tmp/ab/h200_1M.sqlite
    python benchmarks/readers_ab.py --baseline-src /tmp/main/src --new-src src --inputs /tmp/ab --rounds 5

``--inputs`` is a folder; the rocprofv3 CSV, Kineto, rocprof v1 and RPD-export inputs are made there
by readers_scale.py's generators when missing (``--csv-kernels``, ``--kineto-copies``...), and every
``*.sqlite``/``*.rpd`` file already there is read too. A ``src`` folder without the built native
modules (``_columns``, ``_native``) gets them copied from the installed package first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import readers_scale as rs
from harness import load_average

CHILD = r"""
import hashlib, json, sys, time, resource
from dataclasses import fields
import numpy as np
t0, c0 = time.perf_counter(), time.process_time()
from maxinstr.traces import open_trace  # (timed too: a build may import its readers here or in open_trace)
t = open_trace(sys.argv[1])
t1, c1 = time.perf_counter(), time.process_time()
h = hashlib.sha256()
for tab in (t.ranges, t.calls, t.ops):
    for f in fields(tab):
        a = np.ascontiguousarray(getattr(tab, f.name))
        h.update(f.name.encode() + str(a.dtype).encode() + a.tobytes())
h.update(repr(([str(s) for s in t.strings], t.notes, sorted(t.thread_names.items()), t.format, t.clock,
               t.session_start_utc_ns, sorted(t.meta))).encode())
print("RESULT " + json.dumps(dict(read_s=t1 - t0, cpu_s=c1 - c0, ops=len(t.ops), calls=len(t.calls),
                                  ranges=len(t.ranges), rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                                  hash=h.hexdigest()[:16])))
"""


def with_native(src: Path) -> Path:
    """``src`` with the installed package's native modules beside its Python files."""
    import maxinstr

    installed = Path(maxinstr.__file__).parent
    for so in installed.glob("_*.so"):
        if not (src / "maxinstr" / so.name).exists():
            shutil.copy2(so, src / "maxinstr" / so.name)
    return src


def make_inputs(folder: Path, args: argparse.Namespace) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    made = {"csv": lambda p: (p.mkdir(), rs.scale_csv(p, args.csv_kernels)),
            "kineto.json": lambda p: rs.scale_kineto(p, args.kineto_copies),
            "results.db": lambda p: rs.scale_v1_db(p, args.v1_copies),
            "v1/results.json": lambda p: (p.parent.mkdir(exist_ok=True), rs.scale_v1_json(p, args.v1_json_copies)),
            "rpd.json": lambda p: rs.scale_rpd_json(p, args.rpd_json_copies)}
    for name, make in made.items():
        if not (folder / name).exists():
            make(folder / name)
    return sorted([*folder.glob("*.sqlite"), *folder.glob("*.rpd")]) + [folder / name for name in made]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-src", required=True, type=Path)
    ap.add_argument("--new-src", required=True, type=Path)
    ap.add_argument("--inputs", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--csv-kernels", type=int, default=200_000)
    ap.add_argument("--kineto-copies", type=int, default=60)
    ap.add_argument("--v1-copies", type=int, default=2000)
    ap.add_argument("--v1-json-copies", type=int, default=400)
    ap.add_argument("--rpd-json-copies", type=int, default=5)
    args = ap.parse_args()
    builds = {"baseline": with_native(args.baseline_src.resolve()), "new": with_native(args.new_src.resolve())}
    inputs = make_inputs(args.inputs, args)
    res: dict[tuple[Path, str], list[dict]] = {(i, b): [] for i in inputs for b in builds}
    for r in range(args.rounds):
        for i in inputs:
            for b in (list(builds) if r % 2 == 0 else list(builds)[::-1]):
                p = subprocess.run([sys.executable, "-c", CHILD, str(i)], capture_output=True, text=True,
                                   env=dict(os.environ, PYTHONPATH=str(builds[b])))
                line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    raise SystemExit(f"{b} on {i} failed: {p.stderr[-400:]}")
                res[(i, b)].append(json.loads(line[7:]))
        print(f"round {r + 1}/{args.rounds}, {load_average()}", flush=True)
    for i in inputs:
        hashes = {b: {x["hash"] for x in res[(i, b)]} for b in builds}
        x = res[(i, "baseline")][0]
        same = "same" if hashes["baseline"] == hashes["new"] and len(hashes["new"]) == 1 else f"DIFFERENT {hashes}"
        print(f"{i.name}: {x['ops']} ops, {x['calls']} calls, {x['ranges']} ranges; trace contents {same}")
        for b in builds:
            wall, cpu = [x["read_s"] for x in res[(i, b)]], [x["cpu_s"] for x in res[(i, b)]]
            print(f"  {b:8s} import + read: wall median {statistics.median(wall):.3f} s (min {min(wall):.3f}), CPU median "
                  f"{statistics.median(cpu):.3f} s (min {min(cpu):.3f}), peak RSS {max(x['rss_mb'] for x in res[(i, b)])} MB")


if __name__ == "__main__":
    main()
