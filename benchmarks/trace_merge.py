"""Trace-merge benchmark: full per-range attribution of a large nsys export, against peers.

Builds nsys SQLite files of 10k ... 10M kernels by time-shifted copies of a real fixture
(benchmarks/trace_merge_gen.py, default tests/data/nsys/h200_decode.sqlite), then measures in
one run, each case in a fresh process (wall time and peak RSS of that process):

  ours-native   read_nsys (maxinstr._columns) + attribute()            the product path
  ours-python   read_nsys (Python sqlite3 backend) + attribute()       the fallback path
  sqlite3-fetch Python sqlite3 fetching the kernel and API rows into numpy (no attribution)
  sql-join      a plain SQL join attributing kernels to NVTX ranges (with a time limit)
  nsys-stats    `nsys stats -r nvtx_gpu_proj_sum,nvtx_sum,cuda_gpu_kern_sum` (when nsys is on PATH)

With nsys present, the per-range totals of ours-native are also checked against nsys's CSV.

    python benchmarks/trace_merge.py --sizes 10k,100k,1M [--nsys-stats] [--json out.json]
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import emit_result, run_child

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_SOURCE = ROOT / "tests" / "data" / "nsys" / "h200_decode.sqlite"


def parse_size(text: str) -> int:
    t = text.strip().lower()
    mult = {"k": 1_000, "m": 1_000_000}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


# --- cases (run in a child process) ----------------------------------------------------------
def case_ours(path: str, backend: str) -> dict:
    t0 = time.perf_counter()
    from maxinstr.attribute import attribute
    from maxinstr.traces.nsys import read_nsys

    t1 = time.perf_counter()
    trace = read_nsys(path, backend=backend)
    t2 = time.perf_counter()
    att = attribute(trace)
    t3 = time.perf_counter()
    return {"import_s": t1 - t0, "read_s": t2 - t1, "attribute_s": t3 - t2, "time_s": t3 - t1,
            "ops": len(trace.ops), "calls": len(trace.calls), "ranges": len(trace.ranges),
            "attributed_ops": int((att.op_range >= 0).sum())}  # fmt: skip


def case_sqlite3_fetch(path: str) -> dict:
    import sqlite3

    import numpy as np

    t0 = time.perf_counter()
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    k = con.execute('SELECT start, "end", correlationId, globalPid, demangledName, streamId FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchall()
    kc = [np.array(c, dtype=np.int64) for c in zip(*k)]
    del k
    r = con.execute('SELECT start, "end", globalTid, correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME').fetchall()
    rc = [np.array(c, dtype=np.int64) for c in zip(*r)]
    del r
    return {"time_s": time.perf_counter() - t0, "kernels": len(kc[0]), "runtime_rows": len(rc[0])}


SQL_JOIN = """
SELECT n.rowid, count(*), min(k.start), max(k."end")
FROM CUPTI_ACTIVITY_KIND_KERNEL AS k
JOIN CUPTI_ACTIVITY_KIND_RUNTIME AS r ON r.correlationId = k.correlationId
JOIN NVTX_EVENTS AS n ON n.globalTid = r.globalTid AND n.start <= r.start AND n."end" >= r."end"
WHERE n.eventType = 59
GROUP BY n.rowid
"""


def case_sql_join(path: str) -> dict:
    import sqlite3

    t0 = time.perf_counter()
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute(SQL_JOIN).fetchall()
    return {"time_s": time.perf_counter() - t0, "ranges": len(rows)}


CASES = {
    "ours-native": lambda p: case_ours(p, "native"),
    "ours-python": lambda p: case_ours(p, "python"),
    "sqlite3-fetch": case_sqlite3_fetch,
    "sql-join": case_sql_join,
}


# --- parent: run a command, measure wall time and peak RSS -----------------------------------
def measure(cmd: list[str], limit_s: float, env: dict | None = None) -> dict:
    """The process's wall time, peak RSS and CPU time (benchmarks/harness.run_child), with the
    case's RESULT merged in; killed (with its children) past ``limit_s``."""
    run = run_child(cmd, limit_s=limit_s, env=env)
    result: dict[str, Any] = {"wall_s": run.wall_s, "peak_rss_mb": run.peak_rss_mb, "timed_out": run.timed_out,
              "cpu_s": run.cpu_s, "rc": run.rc}  # fmt: skip
    if run.result is not None:
        result.update(run.result)
    elif run.rc not in (0, None):
        result["error"] = (run.stderr.strip().splitlines() or ["?"])[-1][:300]
    return result


def run_case(name: str, path: Path, limit_s: float) -> dict:
    env = dict(os.environ)
    # the children use the installed package (its native modules); src/ only where none is installed
    if importlib.util.find_spec("maxinstr") is None and (ROOT / "src" / "maxinstr").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH", "")]))
    return measure([sys.executable, __file__, "--case", name, "--file", str(path)], limit_s, env)


def run_nsys_stats(path: Path, out_dir: Path, limit_s: float) -> dict:
    nsys = shutil.which("nsys")
    if nsys is None:
        return {"skipped": "nsys not on PATH"}
    prefix = out_dir / path.stem
    cmd = [nsys, "stats", "--force-export=false", "-r", "nvtx_gpu_proj_sum,nvtx_sum,cuda_gpu_kern_sum",
           "-f", "csv", "--force-overwrite=true", "-o", str(prefix), str(path)]  # fmt: skip
    result = measure(cmd, limit_s)
    result["time_s"] = result["wall_s"]
    result["csv_prefix"] = str(prefix)
    return result


def check_against_nsys(path: Path, prefix: str) -> str:
    """Compare ours-native per-range totals with nsys's nvtx_gpu_proj_sum CSV for the file."""
    from maxinstr.attribute import NSYS_RULES, attribute
    from maxinstr.attribute.summary import gpu_proj_sum
    from maxinstr.traces.nsys import read_nsys

    csv_path = Path(f"{prefix}_nvtx_gpu_proj_sum.csv")
    if not csv_path.exists():
        return f"no {csv_path.name}"
    ref = {r["Range"]: r for r in csv.DictReader(csv_path.open())}
    ours = {r["Range"]: r for r in gpu_proj_sum(attribute(read_nsys(path), rules=NSYS_RULES))}
    bad = []
    for name, row in ref.items():
        o = ours.get(name)
        for col in ("Total Proj Time (ns)", "Range Instances", "Total GPU Ops", "Proj Min (ns)", "Proj Max (ns)"):
            if o is None or abs(float(o[col]) - float(row[col])) > 1e-3 * max(1.0, abs(float(row[col]))):
                bad.append(f"{name}:{col}")
    return "equal to nsys (%d ranges)" % len(ref) if not bad and set(ours) == set(ref) else f"DIFFERS: {bad[:5]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10k,100k,1M", help="kernel counts, e.g. 10k,100k,1M,10M")
    ap.add_argument("--source", default=str(DEFAULT_SOURCE))
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "maxinstr-trace-merge"))
    ap.add_argument("--cases", default="ours-native,ours-python,sqlite3-fetch,sql-join")
    ap.add_argument("--limit", type=float, default=300.0, help="seconds per case before it is killed")
    ap.add_argument("--sql-limit", type=float, default=120.0, help="seconds for the SQL join")
    ap.add_argument("--python-max", default="1M", help="largest size for ours-python and sqlite3-fetch")
    ap.add_argument("--sql-max", default="1M", help="largest size for the SQL join")
    ap.add_argument("--nsys-stats", action="store_true", help="also time `nsys stats` (needs nsys on PATH)")
    ap.add_argument("--nsys-max", default="10M", help="largest size for nsys stats")
    ap.add_argument("--keep", action="store_true", help="keep generated files")
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        emit_result(CASES[args.case](args.file))
        return

    from trace_merge_gen import generate  # beside this script (its folder is on the path)

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    cases = [c for c in args.cases.split(",") if c]
    results = []
    print(f"source {args.source}; python {sys.version.split()[0]}; cpus {len(os.sched_getaffinity(0))}")
    for size_text in args.sizes.split(","):
        size = parse_size(size_text)
        path = work / f"{Path(args.source).stem}_{size_text}.sqlite"
        t0 = time.perf_counter()
        if not path.exists():
            counts = generate(Path(args.source), size, path)
        else:
            counts = {}
        gen_s = time.perf_counter() - t0
        row = {"size": size_text, "file": str(path), "file_mb": path.stat().st_size / 2**20, "generate_s": gen_s,
               "counts": counts, "cases": {}}  # fmt: skip
        shown = {k.replace("CUPTI_ACTIVITY_KIND_", ""): v for k, v in counts.items() if k.startswith(("CUPTI", "NVTX"))}
        print(f"\n== {size_text} kernels: {path.name} {row['file_mb']:.0f} MB {shown or ''}", flush=True)
        for case in cases:
            if case in ("ours-python", "sqlite3-fetch") and size > parse_size(args.python_max):
                continue
            if case == "sql-join" and size > parse_size(args.sql_max):
                continue
            limit = args.sql_limit if case == "sql-join" else args.limit
            res = run_case(case, path, limit)
            row["cases"][case] = res
            print(f"  {case:14s} {_fmt(res, limit)}", flush=True)
        if args.nsys_stats and size <= parse_size(args.nsys_max):
            res = run_nsys_stats(path, work, args.limit)
            row["cases"]["nsys-stats"] = res
            print(f"  {'nsys-stats':14s} {_fmt(res, args.limit)}", flush=True)
            if "csv_prefix" in res and not res.get("timed_out"):
                row["nsys_check"] = check_against_nsys(path, res["csv_prefix"])
                print(f"  check vs nsys: {row['nsys_check']}", flush=True)
        ours = row["cases"].get("ours-native", {})
        if ours.get("time_s"):
            for other in ("ours-python", "sqlite3-fetch", "sql-join", "nsys-stats"):
                o = row["cases"].get(other, {})
                if o.get("time_s"):
                    print(f"  ratio {other} / ours-native = {o['time_s'] / ours['time_s']:.1f}x")
                elif o.get("timed_out"):
                    print(f"  ratio {other} / ours-native > {o['wall_s'] / ours['time_s']:.0f}x (did not finish)")
        results.append(row)
        if not args.keep and path.stat().st_size > 2**30:
            path.unlink()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def _fmt(res: dict, limit: float) -> str:
    if res.get("skipped"):
        return f"skipped: {res['skipped']}"
    if res.get("timed_out"):
        return f"did not finish in {limit:.0f} s (peak RSS {res['peak_rss_mb']:.0f} MB)"
    if res.get("error"):
        return f"failed: {res['error']}"
    extra = ""
    if "read_s" in res:
        extra = f" (read {res['read_s']:.3f} s + attribute {res['attribute_s']:.3f} s; {res['ops']} ops, {res['calls']} calls, {res['ranges']} ranges)"
    return (f"{res.get('time_s', res['wall_s']):8.3f} s  peak RSS {res['peak_rss_mb']:6.0f} MB"
            f"  (process: wall {res['wall_s']:.2f} s, cpu {res['cpu_s']:.2f} s){extra}")


if __name__ == "__main__":
    main()
