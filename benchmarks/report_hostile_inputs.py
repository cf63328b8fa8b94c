"""`maxinstr report` on inputs built to be expensive (issue 29, points 3 and 4): many distinct
stage names in every view, one enormous name, an nsys trace with one 50 MB NVTX text, a growing
number of stages, a 20 GB sparse stages.bin, and a gzip bomb. Time and memory must grow with
the input, linearly, and a name is shown cut to a display length.

    python benchmarks/report_hostile_inputs.py [--cases names,bigname,nvtx,stages,sparse,gzip]
        [--limit-s 120] [--baseline-src /tmp/old/src]

Each case runs `python -m maxinstr report INPUT --format F -o FILE` in a fresh process (imports,
load, analysis, rendering: what a user waits for), under a time limit and a 3 GB address-space
limit (a runaway case fails fast instead of taking the shared machine's memory). Prints wall and
CPU seconds, peak RSS and the output's size. ``--baseline-src`` runs every case a second time
with that source tree first on PYTHONPATH (an older checkout: the numbers before the change).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import sqlite3
import sys
import tempfile
from pathlib import Path

import numpy as np

from harness import load_average, print_table, run_child
from maxinstr.rundir import format as fmt

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
ADDRESS_SPACE_LIMIT = 3 << 30


def write_run(root: Path, names: list[str], n: int, *, nested: bool = False) -> Path:
    """A run directory as a session writes it: ``n`` records cycling over ``names`` (nested:
    every second record inside the one before, as decode > sample)."""
    part = root / "parts" / "p7"
    part.mkdir(parents=True)
    rows = np.zeros(n, dtype=fmt.STAGE_DTYPE)
    rows["id"] = (7 << 32) | np.arange(1, n + 1)
    rows["tid"] = 7
    rows["host_start_ns"] = 10**9 + np.arange(n, dtype=np.int64) * 10_000
    rows["host_end_ns"] = rows["host_start_ns"] + 5_000 + (np.arange(n) % 97) * 10
    rows["parent_id"] = -1
    rows["gpu_start_ns"] = rows["gpu_end_ns"] = -1
    rows["step"] = np.arange(n) // len(names)
    rows["name_id"] = np.arange(n) % len(names)
    if nested:
        inner = np.arange(1, n, 2)
        rows["parent_id"][inner] = rows["id"][inner - 1]
        rows["depth"][inner] = 1
        rows["host_start_ns"][inner] = rows["host_start_ns"][inner - 1] + 100
        rows["host_end_ns"][inner] = rows["host_end_ns"][inner - 1] - 100
        rows["name_id"] = np.arange(n) % 2
    (part / fmt.STAGES_FILE).write_bytes(rows.tobytes())
    (part / fmt.STRINGS_FILE).write_text("".join(json.dumps({"id": i, "s": s}) + "\n" for i, s in enumerate(names)))
    if nested:  # the attrs a decode loop records: a step and a batch size on every outer stage
        with open(part / fmt.ATTRS_FILE, "w") as fh:
            for i in range(0, n, 2):
                fh.write(f'{{"id":{int(rows["id"][i])},"attrs":{{"step":{i // 2},"batch":{i % 8}}}}}\n')
    (part / fmt.PART_FILE).write_text(json.dumps({"pid": 7, "status": "closed", "rows_written": n}))
    (root / fmt.META_FILE).write_text(json.dumps({"format": fmt.FORMAT_NAME, "version": fmt.FORMAT_VERSION,
                                                  "status": "closed", "warmup": 1}))
    return root


def write_nvtx_text(path: Path, mb: int) -> Path:
    """The real H200 nsys fixture with one NVTX range's text made ``mb`` MB long."""
    path.write_bytes((DATA / "nsys" / "h200_decode.sqlite").read_bytes())
    con = sqlite3.connect(path)
    con.execute("UPDATE NVTX_EVENTS SET text = ?, textId = NULL WHERE rowid = 3", ("decode/" + "k" * (mb << 20),))
    con.commit()
    con.close()
    return path


def write_sparse(root: Path, gb: int) -> Path:
    """100 real rows, a hole of ``gb`` GB, 100 more: a stages.bin of ``gb`` GB holding 200 records."""
    write_run(root, ["step"], 200)
    path = root / "parts" / "p7" / fmt.STAGES_FILE
    data = path.read_bytes()
    with open(path, "wb") as fh:
        fh.write(data[: 100 * 72])
        fh.seek(100 * 72 + ((gb << 30) // 72) * 72)
        fh.write(data[100 * 72:])
    return root


def write_gzip_bomb(path: Path, inflated_gb: float) -> Path:
    """A Kineto-looking .json.gz of a few MB that inflates to ``inflated_gb`` GB of spaces."""
    chunk = b" " * (1 << 24)
    with gzip.open(path, "wb", compresslevel=9) as fh:
        fh.write(b'{"traceEvents": [')
        for _ in range(int(inflated_gb * 64)):
            fh.write(chunk)
        fh.write(b"]}")
    return path


def cases(tmp: Path, which: set[str]) -> list[tuple[str, Path, str]]:
    out: list[tuple[str, Path, str]] = []
    if "names" in which:
        for n in (5_000, 20_000, 50_000):
            run = write_run(tmp / f"names{n}", [f"request/{i:06d}" for i in range(n)], 2 * n)
            out += [(f"{n:,} names, {2 * n:,} records", run, f) for f in ("text", "json", "html")]
    if "bigname" in which:
        for mb in (3, 10):
            run = write_run(tmp / f"name{mb}mb", ["decode", "ab/" * ((mb << 20) // 3), "prefill"], 60)
            out += [(f"one {mb} MB stage name", run, f) for f in ("text", "json", "html", "perfetto")]
    if "nvtx" in which:
        out.append(("nsys, one 50 MB NVTX text", write_nvtx_text(tmp / "nvtx50.sqlite", 50), "text"))
    if "stages" in which:
        for n in (350_000, 700_000, 1_400_000):
            out.append((f"{n:,} stages (decode > sample, attrs)",
                        write_run(tmp / f"stages{n}", ["decode", "sample"], n, nested=True), "text"))
    if "sparse" in which:
        out.append(("20 GB sparse stages.bin, 200 records", write_sparse(tmp / "sparse", 20), "text"))
    if "gzip" in which:
        bomb = write_gzip_bomb(tmp / "bomb.pt.trace.json.gz", 1.0)
        out.append((f"gzip bomb: {bomb.stat().st_size / 1e6:.1f} MB inflating to 1.1 GB", bomb, "text"))
    return out


def limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


def measure(target: Path, fmt_name: str, out: Path, limit_s: float, src: str | None) -> list[object]:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    run = run_child([sys.executable, "-m", "maxinstr", "report", str(target), "--format", fmt_name, "-o", str(out)],
                    limit_s=limit_s, env=env, preexec_fn=limit_memory)
    size = out.stat().st_size if out.exists() and run.rc == 0 else None
    if run.timed_out:
        status = f"killed at {limit_s:g} s"
    elif run.rc != 0:
        status = f"exit {run.rc}: " + (run.stderr.strip().splitlines() or ["?"])[-1][:90]
    else:
        status = "ok"
    out.unlink(missing_ok=True)
    return [run.wall_s, run.cpu_s, run.peak_rss_mb, None if size is None else size / 1e6, status]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="names,bigname,nvtx,stages,sparse,gzip")
    ap.add_argument("--limit-s", type=float, default=120.0)
    ap.add_argument("--baseline-src", default=None, help="an older source tree to run every case with too")
    a = ap.parse_args()
    print(load_average())
    with tempfile.TemporaryDirectory(prefix="maxinstr-hostile-") as tmp:
        rows = []
        for label, target, fmt_name in cases(Path(tmp), set(a.cases.split(","))):
            for tag, src in (("this", None), ("baseline", a.baseline_src)):
                if tag == "baseline" and not src:
                    continue
                result = measure(target, fmt_name, Path(tmp) / f"report.{fmt_name}", a.limit_s, src)
                rows.append([label, fmt_name, tag, *result])
                print_table(["input", "format", "code", "wall s", "CPU s", "peak RSS MB", "output MB", "status"], [rows[-1]],
                            [None, None, None, ".2f", ".2f", ".0f", ".2f", None])
        print()
        print_table(["input", "format", "code", "wall s", "CPU s", "peak RSS MB", "output MB", "status"], rows,
                    [None, None, None, ".2f", ".2f", ".0f", ".2f", None])


if __name__ == "__main__":
    main()
