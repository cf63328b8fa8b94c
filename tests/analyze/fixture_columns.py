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
from functools import lru_cache
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


@lru_cache(maxsize=None)
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
