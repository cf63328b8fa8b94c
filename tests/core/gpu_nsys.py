"""nsys proof: `probe OUT.json` runs instrumented stages (to be run under nsys) and writes the
drained records; `check OUT.json REPORT.sqlite` asserts that the exported trace holds NVTX domain
"maxinstr" push/pop ranges whose int64 payloads are exactly the run's record ids, with the
records' names and thread ids. Used by benchmarks/device/10-core.sh."""

from __future__ import annotations

import json
import sqlite3
import sys
import threading


def probe(out_path: str) -> None:
    import numpy as np

    from maxinstr import _native as n
    from maxinstr.rundir.format import STAGE_DTYPE

    try:
        import cupy as cp

        x = cp.zeros(1024)
        cp.cuda.Device().synchronize()
    except Exception:  # noqa: BLE001 - host-only probe still checks ranges
        cp = x = None

    def work(k: int) -> None:
        for step in range(20):
            with n.stage("decode", step=step, worker=k):
                with n.stage("attn"):
                    if cp is not None:
                        cp.add(x, 1, out=x)
                with n.stage("mlp"):
                    if cp is not None:
                        cp.multiply(x, 1.0001, out=x)
                n.mark("token")

    work(0)
    t = threading.Thread(target=work, args=(1,))
    t.start()
    t.join()
    n.resolve(block=True)
    raw, names, _ = n.drain()
    r = np.frombuffer(raw, STAGE_DTYPE)
    nm = dict(names)
    json.dump(
        {
            "ids": r["id"].tolist(),
            "names": [nm[int(i)] for i in r["name_id"]],
            "tids": r["tid"].tolist(),
            "marks": ((r["flags"] & 4) != 0).tolist(),
            "gpu_timed": int(((r["flags"] & 2) != 0).sum()),
            "stats": n.stats(),
        },
        open(out_path, "w"),
    )


def check(out_path: str, sqlite_path: str) -> int:
    want = json.load(open(out_path))
    db = sqlite3.connect(sqlite_path)
    cols = {r[1] for r in db.execute("PRAGMA table_info(NVTX_EVENTS)")}
    strings = dict(db.execute("SELECT id, value FROM StringIds")) if db.execute(
        "SELECT name FROM sqlite_master WHERE name='StringIds'").fetchone() else {}
    # domain id of "maxinstr" (eventType 75 = NvtxDomainCreate)
    dom = [d for d, text, tid in db.execute("SELECT domainId, text, textId FROM NVTX_EVENTS WHERE eventType = 75")
           if (text or strings.get(tid)) == "maxinstr"]
    if not dom:
        print("FAIL: no NVTX domain 'maxinstr' in the trace")
        return 1
    payload = "int64Value" if "int64Value" in cols else None
    rows = db.execute(
        f"SELECT eventType, text, textId, globalTid, {payload} FROM NVTX_EVENTS WHERE domainId = ? "
        "AND eventType IN (59, 34)", (dom[0],)
    ).fetchall()
    ranges = {int(p): ((t or strings.get(tid)), g) for et, t, tid, g, p in rows if et == 59 and p is not None}
    marks = {int(p): ((t or strings.get(tid)), g) for et, t, tid, g, p in rows if et == 34 and p is not None}
    ok = True
    stage_ids = {i for i, m in zip(want["ids"], want["marks"]) if not m}
    mark_ids = {i for i, m in zip(want["ids"], want["marks"]) if m}
    if set(ranges) != stage_ids:
        print(f"FAIL: range payloads != record ids: missing {len(stage_ids - set(ranges))}, extra {len(set(ranges) - stage_ids)}")
        ok = False
    if set(marks) != mark_ids:
        print(f"FAIL: mark payloads != mark record ids ({len(marks)} vs {len(mark_ids)})")
        ok = False
    bad_name = bad_tid = 0
    for i, name, tid in zip(want["ids"], want["names"], want["tids"]):
        got = ranges.get(i) or marks.get(i)
        if got is None:
            continue
        bad_name += got[0] != name
        bad_tid += (int(got[1]) & 0xFFFFFF) != (tid & 0xFFFFFF)
    if bad_name or bad_tid:
        print(f"FAIL: {bad_name} name mismatches, {bad_tid} thread-id mismatches")
        ok = False
    print(f"{'OK' if ok else 'FAIL'}: {len(ranges)} maxinstr ranges + {len(marks)} marks in the trace; "
          f"{len(want['ids'])} records ({want['gpu_timed']} GPU-timed); payload == record id for all")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1] == "probe":
        probe(sys.argv[2])
    else:
        sys.exit(check(sys.argv[2], sys.argv[3]))
