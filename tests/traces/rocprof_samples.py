"""Re-encode REAL profiler rows as rocprofv3 JSON and as rocpd SQLite databases.

No real rocprofv3 JSON output nor rocpd database was found in public repositories (see
tests/data/PROVENANCE-extra.md), so the JSON and rocpd readers are tested on real rows other
readers read, written out in the layout the writers use: ``source/docs/rocprofv3-schema.json``
(JSON) and, for rocpd, ``rocprofiler-sdk-rocpd/rocpd_tables.sql`` + ``data_views.sql`` (tables
``<table><uuid>``, plain-named views, ids local to a guid) as ``generateRocpd.cpp`` fills them
(the internal correlation id in ``rocpd_event.stack_id``; marker regions named
``roctxThreadRangeA``/``roctxProcessRangeA`` with the message in ``extdata``; marks in
``rocpd_sample``), and rocprof-sys's writer (``rocpd_<table>_<md5>``, ``rocm_*_api`` categories).
Only the columns the readers use are written; every value comes from the real rows: the
rocprofv3 CSV fixtures (``write_rocpd``, ``rocprof_json``) and rocprof v1's Kokkos run
(``write_rocpd_from_v1``).
"""

from __future__ import annotations

import csv
import json
import re
import sqlite3
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "rocprof"
LLAMA = DATA / "rocprofv3_llamacpp_decode"
DOCS = DATA / "rocprofv3_docs"

MARKER_OPS = ["roctxMarkA", "roctxRangePushA", "roctxRangePop", "roctxRangeStartA", "roctxRangeStop"]


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def agent_number(value: str) -> int:
    return int(re.findall(r"\d+", value)[-1])


def marker_op(row: dict[str, str]) -> str:
    """The roctx call a paired marker row came from (rocprofv3 CSV rows hold only the message)."""
    if row["Start_Timestamp"] == row["End_Timestamp"]:
        return "roctxMarkA"
    if row["Thread_Id"] == "0":
        return "roctxRangeStartA"
    return "roctxRangePushA"


def rocprof_json(pid: int = 2684120) -> dict:
    """llama.cpp kernels + HIP calls, and the docs marker rows, as rocprofv3 JSON."""
    kernels = rows(LLAMA / "decode_kernel_trace.csv")
    hip = rows(LLAMA / "decode_hip_api_trace.csv")
    markers = rows(DOCS / "marker_api_trace.csv")
    copies = rows(DOCS / "memory_copy_trace.csv")
    hip_ops = sorted({r["Function"] for r in hip})
    directions = sorted({r["Direction"] for r in copies})
    kinds = [
        {"kind": "NONE", "operations": []},
        {"kind": "HIP_RUNTIME_API_EXT", "operations": hip_ops},
        {"kind": "KERNEL_DISPATCH", "operations": ["KERNEL_DISPATCH_NONE", "KERNEL_DISPATCH_COMPLETE"]},
        {"kind": "MARKER_CORE_API", "operations": MARKER_OPS},
        {"kind": "MEMORY_COPY", "operations": directions},
    ]
    symbols = {}
    for r in kernels:
        symbols.setdefault(int(r["Kernel_Id"]), r["Kernel_Name"])
    # agent handles are opaque in JSON: CPU agent 0 and GPU agent 1 of the CSV
    handle = {0: 9001, 1: 9002}
    return {
        "rocprofiler-sdk-tool": [
            {
                "metadata": {"pid": pid, "init_time": 0, "fini_time": 1},
                "agents": [{"id": {"handle": handle[0]}, "type": 1}, {"id": {"handle": handle[1]}, "type": 2}],
                "strings": {
                    "buffer_records": kinds,
                    "marker_api": [{"key": 50_000 + i, "value": m["Function"]} for i, m in enumerate(markers)],
                },
                "kernel_symbols": [
                    {"kernel_id": k, "formatted_kernel_name": n, "kernel_name": n} for k, n in symbols.items()
                ],
                "buffer_records": {
                    "kernel_dispatch": [
                        {
                            "kind": 2,
                            "operation": 1,
                            "thread_id": int(r["Thread_Id"]),
                            "correlation_id": {"internal": int(r["Correlation_Id"]), "external": 0},
                            "start_timestamp": int(r["Start_Timestamp"]),
                            "end_timestamp": int(r["End_Timestamp"]),
                            "dispatch_info": {
                                "agent_id": {"handle": handle[agent_number(r["Agent_Id"])]},
                                "queue_id": {"handle": int(r["Queue_Id"])},
                                "kernel_id": int(r["Kernel_Id"]),
                                "dispatch_id": int(r["Dispatch_Id"]),
                            },
                            "stream_id": {"handle": int(r["Stream_Id"])},
                        }
                        for r in kernels
                    ],
                    "hip_api": [
                        {
                            "kind": 1,
                            "operation": hip_ops.index(r["Function"]),
                            "correlation_id": {"internal": int(r["Correlation_Id"]), "external": 0},
                            "start_timestamp": int(r["Start_Timestamp"]),
                            "end_timestamp": int(r["End_Timestamp"]),
                            "thread_id": int(r["Thread_Id"]),
                        }
                        for r in hip
                    ],
                    "marker_api": [
                        {
                            "kind": 3,
                            "operation": MARKER_OPS.index(marker_op(m)),
                            "correlation_id": {"internal": 50_000 + i, "external": 0},
                            "start_timestamp": int(m["Start_Timestamp"]),
                            "end_timestamp": int(m["End_Timestamp"]),
                            "thread_id": int(m["Thread_Id"]),
                        }
                        for i, m in enumerate(markers)
                    ],
                    "memory_copy": [
                        {
                            "kind": 4,
                            "operation": directions.index(c["Direction"]),
                            "correlation_id": {"internal": int(c["Correlation_Id"]), "external": 0},
                            "start_timestamp": int(c["Start_Timestamp"]),
                            "end_timestamp": int(c["End_Timestamp"]),
                            "thread_id": 0,
                            "src_agent_id": {"handle": handle[int(c["Source_Agent_Id"])]},
                            "dst_agent_id": {"handle": handle[int(c["Destination_Agent_Id"])]},
                            "bytes": 0,
                        }
                        for c in copies
                    ],
                },
            }
        ]
    }


_UUID = "_0000a1b2"
_GUID = "g-0001"
_DDL = """
CREATE TABLE rocpd_string{u} (id INTEGER PRIMARY KEY, guid TEXT, string TEXT);
CREATE TABLE rocpd_info_process{u} (id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, pid INTEGER);
CREATE TABLE rocpd_info_thread{u} (id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, pid INTEGER, tid INTEGER,
    name TEXT);
CREATE TABLE rocpd_info_agent{u} (id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, pid INTEGER, type TEXT,
    absolute_index INTEGER, logical_index INTEGER, type_index INTEGER);
CREATE TABLE rocpd_info_kernel_symbol{u} (id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, pid INTEGER,
    code_object_id INTEGER, kernel_name TEXT, display_name TEXT);
CREATE TABLE rocpd_event{u} (id INTEGER PRIMARY KEY, guid TEXT, category_id INTEGER, stack_id INTEGER,
    parent_stack_id INTEGER, correlation_id INTEGER, extdata JSONB DEFAULT "{{}}" NOT NULL);
CREATE TABLE rocpd_track{u} (id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, pid INTEGER, tid INTEGER,
    name_id INTEGER);
CREATE TABLE rocpd_sample{u} (id INTEGER PRIMARY KEY, guid TEXT, track_id INTEGER, timestamp BIGINT,
    event_id INTEGER);
CREATE TABLE rocpd_region{u} (id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, pid INTEGER, tid INTEGER,
    start BIGINT, "end" BIGINT, name_id INTEGER, event_id INTEGER);
CREATE TABLE rocpd_kernel_dispatch{u} (id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, pid INTEGER, tid INTEGER,
    agent_id INTEGER, kernel_id INTEGER, dispatch_id INTEGER, queue_id INTEGER, stream_id INTEGER,
    start BIGINT, "end" BIGINT, region_name_id INTEGER, event_id INTEGER);
CREATE TABLE rocpd_memory_copy{u} (id INTEGER PRIMARY KEY, guid TEXT, nid INTEGER, pid INTEGER, tid INTEGER,
    start BIGINT, "end" BIGINT, name_id INTEGER, dst_agent_id INTEGER, src_agent_id INTEGER, size INTEGER,
    queue_id INTEGER, stream_id INTEGER, event_id INTEGER);
"""
_TABLES = ("rocpd_string", "rocpd_info_process", "rocpd_info_thread", "rocpd_info_agent",
           "rocpd_info_kernel_symbol", "rocpd_event", "rocpd_region", "rocpd_kernel_dispatch", "rocpd_memory_copy",
           "rocpd_track", "rocpd_sample")


def write_rocpd(path: Path, *, views: bool = True) -> Path:
    """llama.cpp kernels + HIP calls and the docs markers/copies as a rocpd database."""
    kernels = rows(LLAMA / "decode_kernel_trace.csv")
    hip = rows(LLAMA / "decode_hip_api_trace.csv")
    markers = rows(DOCS / "marker_api_trace.csv")
    copies = rows(DOCS / "memory_copy_trace.csv")
    con = sqlite3.connect(path)
    con.executescript(_DDL.format(u=_UUID))
    if views:
        for t in _TABLES:
            con.execute(f"CREATE VIEW {t} AS SELECT * FROM {t}{_UUID}")
    strings: dict[str, int] = {}

    def sid(s: str) -> int:
        if s not in strings:
            strings[s] = len(strings) + 1
            con.execute(f"INSERT INTO rocpd_string{_UUID} VALUES (?,?,?)", (strings[s], _GUID, s))
        return strings[s]

    pid = int(hip[0]["Process_Id"])
    con.execute(f"INSERT INTO rocpd_info_process{_UUID} VALUES (1,?,1,?)", (_GUID, pid))
    threads: dict[int, int] = {}

    def thread(tid: int) -> int:
        if tid not in threads:
            threads[tid] = len(threads) + 1
            con.execute(f"INSERT INTO rocpd_info_thread{_UUID} VALUES (?,?,1,1,?,?)",
                        (threads[tid], _GUID, tid, f"thread {tid}"))
        return threads[tid]

    con.execute(f"INSERT INTO rocpd_info_agent{_UUID} VALUES (1,?,1,1,'CPU',0,0,0)", (_GUID,))
    con.execute(f"INSERT INTO rocpd_info_agent{_UUID} VALUES (2,?,1,1,'GPU',1,1,0)", (_GUID,))
    event = 0

    def ev(category: str, corr: int, extdata: str = "{}") -> int:
        # as generateRocpd.cpp writes an event: the internal correlation id is stack_id;
        # correlation_id holds the external id (0: the program set none)
        nonlocal event
        event += 1
        con.execute(f"INSERT INTO rocpd_event{_UUID} VALUES (?,?,?,?,?,0,?)",
                    (event, _GUID, sid(category), corr, corr, extdata))
        return event

    for i, r in enumerate(hip, 1):
        con.execute(
            f"INSERT INTO rocpd_region{_UUID} VALUES (?,?,1,1,?,?,?,?,?)",
            (i, _GUID, thread(int(r["Thread_Id"])), int(r["Start_Timestamp"]), int(r["End_Timestamp"]),
             sid(r["Function"]), ev(r["Domain"], int(r["Correlation_Id"]))),
        )
    # markers as rocprofv3 (ROCm 7) writes them: one MARKER_CORE_RANGE_API region per range, named
    # after the pairing operation, the message in the event's extdata; marks go to rocpd_sample
    for j, m in enumerate(markers, len(hip) + 1):
        op = marker_op(m)
        e = ev("MARKER_CORE_RANGE_API", int(m["Correlation_Id"]), json.dumps({"message": m["Function"]}))
        if op == "roctxMarkA":
            con.execute(f"INSERT OR IGNORE INTO rocpd_track{_UUID} VALUES (1,?,1,1,?,?)",
                        (_GUID, thread(int(m["Thread_Id"])), sid("MARKER_CORE_RANGE_API")))
            con.execute(f"INSERT INTO rocpd_sample{_UUID} VALUES (?,?,1,?,?)",
                        (j, _GUID, int(m["Start_Timestamp"]), e))
            continue
        name = "roctxProcessRangeA" if op == "roctxRangeStartA" else "roctxThreadRangeA"
        con.execute(
            f"INSERT INTO rocpd_region{_UUID} VALUES (?,?,1,1,?,?,?,?,?)",
            (j, _GUID, thread(int(m["Thread_Id"])), int(m["Start_Timestamp"]), int(m["End_Timestamp"]),
             sid(name), e),
        )
    symbols: dict[int, str] = {}
    for r in kernels:
        symbols.setdefault(int(r["Kernel_Id"]), r["Kernel_Name"])
    for k, n in symbols.items():
        con.execute(f"INSERT INTO rocpd_info_kernel_symbol{_UUID} VALUES (?,?,1,1,0,?,?)", (k, _GUID, n, n))
    for i, r in enumerate(kernels, 1):
        con.execute(
            f"INSERT INTO rocpd_kernel_dispatch{_UUID} VALUES (?,?,1,1,?,2,?,?,?,?,?,?,NULL,?)",
            (i, _GUID, thread(int(r["Thread_Id"])), int(r["Kernel_Id"]), int(r["Dispatch_Id"]), int(r["Queue_Id"]),
             int(r["Stream_Id"]), int(r["Start_Timestamp"]), int(r["End_Timestamp"]),
             ev("KERNEL_DISPATCH", int(r["Correlation_Id"]))),
        )
    for i, c in enumerate(copies, 1):
        con.execute(
            f"INSERT INTO rocpd_memory_copy{_UUID} VALUES (?,?,1,1,?,?,?,?,?,?,0,NULL,NULL,?)",
            (i, _GUID, thread(pid), int(c["Start_Timestamp"]), int(c["End_Timestamp"]), sid(c["Direction"]),
             int(c["Destination_Agent_Id"]) + 1, int(c["Source_Agent_Id"]) + 1,
             ev("MEMORY_COPY", int(c["Correlation_Id"]))),
        )
    con.commit()
    con.close()
    return path


def write_json(path: Path) -> Path:
    path.write_text(json.dumps(rocprof_json()))
    return path


# ---- rocprof v1's real Kokkos run (rocprof_v1_kokkos/results.db) as a rocpd database ----------

KOKKOS_DB = DATA / "rocprof_v1_kokkos" / "results.db"
WRITERS = ("rocprofv3", "rocprof-sys", "rocprof-sys-pre-2793")


def write_rocpd_from_v1(path: Path, writer: str = "rocprofv3") -> Path:
    """The real rocTX ranges, HIP calls, kernels and copies of the Kokkos run, as a rocpd file of
    ``writer``: rocprofv3 (ROCm 7: categories HIP_RUNTIME_API / MARKER_CORE_RANGE_API, the
    correlation id in rocpd_event.stack_id, marker messages in extdata, marks in rocpd_sample) or
    rocprof-sys (``rocpd_<table>_<md5>`` tables, ``rocm_*_api`` categories, regions named by the
    message, correlation_id). ``rocprof-sys-pre-2793`` stores each range as rocprof-sys did before
    ROCm/rocm-systems PR #2793: from its Pop call's entry to its exit (here: EndNs to EndNs + 700 ns)."""
    assert writer in WRITERS
    src = sqlite3.connect(f"file:{KOKKOS_DB}?mode=ro", uri=True)
    tx = src.execute('SELECT BeginNs, EndNs, tid, Name FROM rocTX ORDER BY "Index"').fetchall()
    hip = src.execute('SELECT BeginNs, EndNs, tid, Name, "Index" FROM HIP ORDER BY rowid').fetchall()
    ops = src.execute("SELECT BeginNs, EndNs, tid, Name, \"Index\" FROM OPS WHERE Name != 'Unknown command type'"
                      " ORDER BY rowid").fetchall()
    copies = src.execute('SELECT BeginNs, EndNs, tid, Name, "Index" FROM COPY ORDER BY rowid').fetchall()
    (pid,), = src.execute('SELECT DISTINCT "proc-id" FROM OPS').fetchall()
    src.close()
    sys_ = writer.startswith("rocprof-sys")
    u = "_9f2c4e0d1a7b3c5e8f6a2b4c6d8e0f1a" if sys_ else _UUID
    con = sqlite3.connect(path)
    con.executescript(_DDL.format(u=u))
    for t in _TABLES:
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM {t}{u}")
    strings: dict[str, int] = {}

    def sid(s: str) -> int:
        if s not in strings:
            strings[s] = len(strings) + 1
            con.execute(f"INSERT INTO rocpd_string{u} VALUES (?,?,?)", (strings[s], _GUID, s))
        return strings[s]

    con.execute(f"INSERT INTO rocpd_info_process{u} VALUES (1,?,1,?)", (_GUID, pid))
    con.execute(f"INSERT INTO rocpd_info_thread{u} VALUES (1,?,1,1,?,NULL)", (_GUID, tx[0][2]))
    con.execute(f"INSERT INTO rocpd_info_agent{u} VALUES (1,?,1,1,'GPU',0,0,0)", (_GUID,))
    event = 0

    def ev(category: str, corr: int, extdata: str = "{}") -> int:
        nonlocal event
        event += 1
        stack, ext_corr = (0, corr) if sys_ else (corr, 0)
        con.execute(f"INSERT INTO rocpd_event{u} VALUES (?,?,?,?,?,?,?)",
                    (event, _GUID, sid(category), stack, stack, ext_corr, extdata))
        return event

    hip_cat, marker_cat = ("rocm_hip_api", "rocm_marker_api") if sys_ else ("HIP_RUNTIME_API", "MARKER_CORE_RANGE_API")
    for i, (b, e, _tid, name, index) in enumerate(hip, 1):
        con.execute(f"INSERT INTO rocpd_region{u} VALUES (?,?,1,1,1,?,?,?,?)", (i, _GUID, b, e, sid(name), ev(hip_cat, index)))
    for j, (b, e, _tid, name) in enumerate(tx, len(hip) + 1):
        message = name.strip('"')
        if e - b <= 1:  # a roctxMark: rocprofv3 writes a sample, rocprof-sys a region of its call
            if sys_:
                con.execute(f"INSERT INTO rocpd_region{u} VALUES (?,?,1,1,1,?,?,?,?)",
                            (j, _GUID, b, b, sid(message), ev(marker_cat, 0)))
            else:
                con.execute(f"INSERT OR IGNORE INTO rocpd_track{u} VALUES (1,?,1,1,1,?)", (_GUID, sid(marker_cat)))
                con.execute(f"INSERT INTO rocpd_sample{u} VALUES (?,?,1,?,?)",
                            (j, _GUID, b, ev(marker_cat, 0, json.dumps({"message": message}))))
            continue
        if writer == "rocprof-sys-pre-2793":
            b, e = e, e + 700
        name_id = sid(message) if sys_ else sid("roctxThreadRangeA")
        extdata = "{}" if sys_ else json.dumps({"message": message})
        con.execute(f"INSERT INTO rocpd_region{u} VALUES (?,?,1,1,1,?,?,?,?)",
                    (j, _GUID, b, e, name_id, ev(marker_cat, 0, extdata)))
    symbols: dict[str, int] = {}
    for i, (b, e, queue, name, index) in enumerate(ops, 1):
        k = symbols.setdefault(name, len(symbols) + 1)
        con.execute(f"INSERT OR IGNORE INTO rocpd_info_kernel_symbol{u} VALUES (?,?,1,1,0,?,?)", (k, _GUID, name, name))
        con.execute(f"INSERT INTO rocpd_kernel_dispatch{u} VALUES (?,?,1,1,1,1,?,?,?,?,?,?,NULL,?)",
                    (i, _GUID, k, i, queue, queue, b, e, ev("rocm_kernel_dispatch" if sys_ else "KERNEL_DISPATCH", index)))
    for i, (b, e, queue, name, index) in enumerate(copies, 1):
        con.execute(f"INSERT INTO rocpd_memory_copy{u} VALUES (?,?,1,1,1,?,?,?,1,1,0,NULL,?,?)",
                    (i, _GUID, b, e, sid(name), queue, ev("rocm_memory_copy" if sys_ else "MEMORY_COPY", index)))
    con.commit()
    con.close()
    return path
