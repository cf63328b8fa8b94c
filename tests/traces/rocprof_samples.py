"""Re-encode the REAL rocprofv3 CSV fixtures as rocprofv3 JSON and as a rocpd SQLite database.

No real rocprofv3 JSON output nor rocpd database was found in public repositories (see
tests/data/PROVENANCE-extra.md), so the JSON and rocpd readers are tested on the same real
rows the CSV reader reads, written out in the layout the rocprofiler-sdk documents:
``source/docs/rocprofv3-schema.json`` (JSON) and ``rocprofiler-sdk-rocpd/rocpd_tables.sql`` +
``data_views.sql`` (rocpd: ``<table><uuid>`` tables, plain-named views, ids local to a guid).
Only the columns the readers use are written; every value comes from the CSV rows.
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
CREATE TABLE rocpd_event{u} (id INTEGER PRIMARY KEY, guid TEXT, category_id INTEGER, correlation_id INTEGER);
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
           "rocpd_info_kernel_symbol", "rocpd_event", "rocpd_region", "rocpd_kernel_dispatch", "rocpd_memory_copy")


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

    def ev(category: str, corr: int) -> int:
        nonlocal event
        event += 1
        con.execute(f"INSERT INTO rocpd_event{_UUID} VALUES (?,?,?,?)", (event, _GUID, sid(category), corr))
        return event

    for i, r in enumerate(hip, 1):
        con.execute(
            f"INSERT INTO rocpd_region{_UUID} VALUES (?,?,1,1,?,?,?,?,?)",
            (i, _GUID, thread(int(r["Thread_Id"])), int(r["Start_Timestamp"]), int(r["End_Timestamp"]),
             sid(r["Function"]), ev(r["Domain"], int(r["Correlation_Id"]))),
        )
    for j, m in enumerate(markers, len(hip) + 1):
        category = "MARKER_CORE_RANGE_API" if marker_op(m) == "roctxRangeStartA" else "MARKER_CORE_API"
        con.execute(
            f"INSERT INTO rocpd_region{_UUID} VALUES (?,?,1,1,?,?,?,?,?)",
            (j, _GUID, thread(int(m["Thread_Id"])), int(m["Start_Timestamp"]), int(m["End_Timestamp"]),
             sid(m["Function"]), ev(category, int(m["Correlation_Id"]))),
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
