"""Scale a real nsys SQLite export up by time-shifted copies (for the trace-merge benchmark).

Every copy k of the source's NVTX, kernel, memcpy, memset and CUDA API rows is shifted by
k * (source time span + gap) and its correlation ids by k * (max correlation id + 1), so the
copies never overlap and each launch still joins its own ops. NVTX int64 payloads (maxinstr
record ids) are shifted the same way so they stay unique. All columns are copied, so the file
has the real export's row width. Done inside SQLite (INSERT ... SELECT over a copy counter).

    python benchmarks/trace_merge_gen.py tests/data/nsys/h200_decode.sqlite 1000000 /tmp/h200_1M.sqlite
"""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path

SHIFTED = {
    "NVTX_EVENTS": {"start", "end"},
    "CUPTI_ACTIVITY_KIND_KERNEL": {"start", "end"},
    "CUPTI_ACTIVITY_KIND_MEMCPY": {"start", "end"},
    "CUPTI_ACTIVITY_KIND_MEMSET": {"start", "end"},
    "CUPTI_ACTIVITY_KIND_RUNTIME": {"start", "end"},
}
COPIED_ONCE = ("StringIds", "ThreadNames", "TARGET_INFO_SESSION_START_TIME", "ENUM_NSYS_EVENT_TYPE",
               "ENUM_NSYS_EVENT_CLASS", "ENUM_CUDA_MEMCPY_OPER", "META_DATA_EXPORT", "PROCESSES")  # fmt: skip


def generate(source: Path, kernels: int, out: Path) -> dict[str, int]:
    """Write ``out`` with at least ``kernels`` kernel rows; returns row counts per table."""
    out.unlink(missing_ok=True)
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    n_kernels = src.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    copies = max(1, -(-kernels // n_kernels))
    lo, hi = src.execute(
        "SELECT min(start), max(coalesce(end, start)) FROM (SELECT start, end FROM NVTX_EVENTS "
        "UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_RUNTIME)"
    ).fetchone()
    span = (hi - lo) + 1_000_000  # 1 ms gap between copies
    max_corr = src.execute(
        "SELECT max(c) FROM (SELECT max(correlationId) c FROM CUPTI_ACTIVITY_KIND_RUNTIME "
        "UNION ALL SELECT max(correlationId) FROM CUPTI_ACTIVITY_KIND_KERNEL)"
    ).fetchone()[0]
    corr_step = max_corr + 1
    max_payload = src.execute("SELECT ifnull(max(int64Value), 0) FROM NVTX_EVENTS").fetchone()[0] + 1
    tables = {name: sql for name, sql in src.execute("SELECT name, sql FROM sqlite_master WHERE type='table'")}
    src.close()

    dst = sqlite3.connect(out)
    dst.execute("PRAGMA journal_mode=OFF")
    dst.execute("PRAGMA synchronous=OFF")
    dst.execute(f"ATTACH DATABASE 'file:{source}?mode=ro' AS src")
    counts: dict[str, int] = {}
    for name in (*COPIED_ONCE, *SHIFTED):
        if name not in tables:
            continue
        dst.execute(tables[name])
        if name in SHIFTED:
            cols = [r[1] for r in dst.execute(f"PRAGMA src.table_info('{name}')")]
            exprs = []
            for c in cols:
                if c in SHIFTED[name]:
                    exprs.append(f'"{c}" + k * {span}')
                elif c == "correlationId":
                    exprs.append(f'"{c}" + k * {corr_step}')
                elif c == "int64Value" and name == "NVTX_EVENTS":
                    exprs.append(f'"{c}" + k * {max_payload}')
                else:
                    exprs.append(f'"{c}"')
            # Domain-create rows are per process, not per copy: keep them once.
            once = " WHERE eventType != 75 OR k = 0" if name == "NVTX_EVENTS" else ""
            dst.execute(
                f"WITH RECURSIVE c(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM c WHERE k + 1 < {copies}) "
                f'INSERT INTO main."{name}" SELECT {", ".join(exprs)} FROM c, src."{name}"{once} ORDER BY k'
            )
        else:
            dst.execute(f'INSERT INTO main."{name}" SELECT * FROM src."{name}"')
        counts[name] = dst.execute(f'SELECT count(*) FROM main."{name}"').fetchone()[0]
    dst.commit()
    dst.execute("DETACH DATABASE src")
    dst.close()
    return counts


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    t0 = time.perf_counter()
    result = generate(Path(sys.argv[1]), int(float(sys.argv[2])), Path(sys.argv[3]))
    print({k: v for k, v in result.items() if k in SHIFTED}, f"{time.perf_counter() - t0:.1f} s")
