"""Columns read straight from the real fixtures in tests/data, for testing analysis functions
independently of the trace readers: kernel names and durations from nsys SQLite (sqlite3),
rocprofv3 CSVs, RPD databases and Kineto JSON. Nothing here is invented."""

from __future__ import annotations

import csv
import gzip
import json
import shutil
import sqlite3
import tempfile
from functools import cache
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[1] / "data"


def _nsys_kernels(path: Path) -> tuple[np.ndarray, np.ndarray]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT s.value, k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            "JOIN StringIds s ON s.id = COALESCE(k.demangledName, k.shortName)"
        ).fetchall()
    finally:
        con.close()
    names = np.array([r[0] for r in rows], dtype=object)
    return names, np.array([r[1] for r in rows], dtype=np.int64)


def _rocprof_kernels(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    names = np.array([r["Kernel_Name"] for r in rows], dtype=object)
    dur = np.array([int(r["End_Timestamp"]) - int(r["Start_Timestamp"]) for r in rows], dtype=np.int64)
    return names, dur


def _rpd_kernels(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if path.suffix == ".gz":
        tmp = Path(tempfile.mkdtemp()) / path.stem
        with gzip.open(path, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
        path = tmp
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT s.string, o.end - o.start FROM rocpd_op o "
            "JOIN rocpd_string s ON s.id = o.description_id "
            "JOIN rocpd_string t ON t.id = o.opType_id WHERE t.string = 'KernelExecution'"
        ).fetchall()
    finally:
        con.close()
    names = np.array([r[0] for r in rows], dtype=object)
    return names, np.array([r[1] for r in rows], dtype=np.int64)


def _kineto_kernels(path: Path) -> tuple[np.ndarray, np.ndarray]:
    doc = json.load(gzip.open(path))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    gpu = [e for e in events if e.get("cat") in ("kernel", "Kernel", "gpu_memcpy", "gpu_memset")]
    names = np.array([e["name"] for e in gpu], dtype=object)
    dur = np.array([int(round(float(e.get("dur", 0)) * 1000)) for e in gpu], dtype=np.int64)
    return names, dur


@cache
def kernel_columns(relpath: str) -> tuple[np.ndarray, np.ndarray]:
    """(names, durations_ns) of every kernel in one fixture, read directly from the file."""
    path = DATA / relpath
    if relpath.endswith(".sqlite"):
        return _nsys_kernels(path)
    if relpath.endswith(".csv"):
        return _rocprof_kernels(path)
    if ".rpd" in relpath:
        return _rpd_kernels(path)
    return _kineto_kernels(path)


KERNEL_FIXTURES = sorted(
    [str(p.relative_to(DATA)) for p in DATA.glob("nsys/*.sqlite")]
    + [str(p.relative_to(DATA)) for p in DATA.glob("rocprof/**/*kernel_trace.csv")]
    + [str(p.relative_to(DATA)) for p in DATA.glob("rocprof/rpd/*.rpd*")]
    + [str(p.relative_to(DATA)) for p in DATA.glob("kineto/*.json.gz")]
)


def nvtx_proj_csv(stem: str) -> dict[str, dict[str, float]]:
    """nsys's own nvtx_gpu_proj_sum for a fixture, keyed by range name ('domain:text')."""
    path = DATA / "nsys" / f"{stem}.stats" / "nvtx_gpu_proj_sum.csv"
    with open(path, newline="") as fh:
        return {r["Range"]: {k: float(v) for k, v in r.items() if k not in ("Range", "Style")} for r in csv.DictReader(fh)}


def nvtx_sum_csv(stem: str) -> dict[str, dict[str, float]]:
    """nsys's own nvtx_sum (host range times) for a fixture, keyed by range name."""
    path = DATA / "nsys" / f"{stem}.stats" / "nvtx_sum.csv"
    with open(path, newline="") as fh:
        return {r["Range"]: {k: float(v) for k, v in r.items() if k not in ("Range", "Style")} for r in csv.DictReader(fh)}


def nvtx_host_durations(stem: str) -> dict[str, np.ndarray]:
    """Host durations (end - start) of every NVTX push/pop range of a fixture, by nsys's range
    name ('domain:text'), read with sqlite3 straight from NVTX_EVENTS (eventType 59 = PushPop)."""
    path = DATA / "nsys" / f"{stem}.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        domains = dict(con.execute(
            "SELECT domainId, COALESCE(text, '') FROM NVTX_EVENTS WHERE eventType = 75").fetchall())
        rows = con.execute(
            "SELECT COALESCE(e.text, s.value), e.domainId, e.end - e.start FROM NVTX_EVENTS e "
            "LEFT JOIN StringIds s ON s.id = e.textId WHERE e.eventType = 59 AND e.end IS NOT NULL"
        ).fetchall()
    finally:
        con.close()
    out: dict[str, list[int]] = {}
    for text, dom, dur in rows:
        out.setdefault(f"{domains.get(dom, '')}:{text}", []).append(dur)
    return {k: np.array(v, dtype=np.int64) for k, v in out.items()}


def run_from_nsys_fixture(dest: Path, stem: str, *, warmup: int = 0, profiler: bool = True,
                          mark_steps: str | None = "decode") -> Path:
    """A run directory holding the stage records behind a real nsys fixture's NVTX ranges.

    Every push/pop range of the fixture becomes a record with the range's int64 payload as
    its id (what maxinstr's NVTX ranges carry), its thread, host times, nesting (parent and
    depth on the same thread) and, for ``mark_steps`` records, ``step`` = position under the
    parent. Written through the real :class:`~maxinstr.rundir.writer.PartWriter`. No GPU event
    times: the fixture's script took none.
    """
    from maxinstr.rundir import format as fmt
    from maxinstr.rundir.writer import PartWriter, write_json_atomic

    path = DATA / "nsys" / f"{stem}.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT COALESCE(e.text, s.value), e.start, e.end, e.globalTid, e.int64Value FROM NVTX_EVENTS e "
            "LEFT JOIN StringIds s ON s.id = e.textId WHERE e.eventType = 59 AND e.end IS NOT NULL ORDER BY e.start"
        ).fetchall()
    finally:
        con.close()
    names = sorted({r[0] for r in rows})
    name_id = {n: i for i, n in enumerate(names)}
    rec = np.zeros(len(rows), dtype=fmt.STAGE_DTYPE)
    stack: dict[int, list[int]] = {}
    seen_under: dict[tuple[int, str], int] = {}
    for i, (text, start, end, gtid, payload) in enumerate(rows):
        tid = int(gtid) & 0xFFFFFF
        st = stack.setdefault(tid, [])
        while st and rows[st[-1]][2] < start:
            st.pop()
        parent = st[-1] if st else -1
        rec[i]["id"] = int(payload) if payload is not None else i + 1
        rec[i]["parent_id"] = rec[parent]["id"] if parent >= 0 else -1
        rec[i]["tid"] = tid
        rec[i]["host_start_ns"], rec[i]["host_end_ns"] = start, end
        rec[i]["gpu_start_ns"] = rec[i]["gpu_end_ns"] = -1
        key = (parent, text)
        pos = seen_under.get(key, 0)
        seen_under[key] = pos + 1
        rec[i]["step"] = pos if text == mark_steps else -1
        rec[i]["name_id"] = name_id[text]
        rec[i]["depth"] = len(st)
        st.append(i)
    dest.mkdir(parents=True, exist_ok=True)
    meta = {"format": fmt.FORMAT_NAME, "version": fmt.FORMAT_VERSION, "status": "closed", "warmup": warmup,
            "command": ["python3", f"tests/data/scenarios/{'decode_loop.py' if 'decode' in stem else 'small_nvtx.py'}"],
            "gpus": [{"index": 0, "name": "NVIDIA H200"}], "driver": "580.159", "cuda": "13.0",
            "frameworks": {"torch": "2.11"},
            "profiler": {"name": "nsys", "command": ["nsys", "profile", "-t", "cuda,nvtx"]} if profiler else None}
    write_json_atomic(dest / fmt.META_FILE, meta)
    w = PartWriter(dest / fmt.PARTS_DIR / "p1", {"pid": 1})
    w.write(rec, {i: n for n, i in name_id.items()})
    w.close(status="closed")
    return dest
