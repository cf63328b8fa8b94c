"""``open_trace``: sniff a trace's format from its bytes, name and folder contents, and read it
(docs/traces.md has the table of formats and how each is recognised). Anything else is a one-line
TraceError naming the file and what it looked like; so is a Chrome trace none of the readers
knows in which Kineto finds nothing while it holds duration events (an empty report of a file
full of events would be silently wrong).
"""

from __future__ import annotations

import gzip
import re
import sqlite3
import zlib
from collections import Counter
from pathlib import Path

from maxinstr.errors import TraceError
from maxinstr.traces import _util
from maxinstr.traces._util import GZIP_MAGIC, SQLITE_MAGIC, Progress
from maxinstr.traces.model import Trace

# The readers are imported where a trace of their kind is read: all of them (and what they import:
# kernels.store, subprocess...) take ~40 ms to import, which reading one format need not pay.

_NSYS_TABLES = ("StringIds", "NVTX_EVENTS", "TARGET_INFO_SESSION_START_TIME", "CUPTI_ACTIVITY_KIND_KERNEL",
                "CUPTI_ACTIVITY_KIND_RUNTIME", "ThreadNames", "TARGET_INFO_GPU")


def open_trace(path: str | Path, *, progress: Progress | None = None) -> Trace:
    """Read any supported vendor trace into a :class:`~maxinstr.traces.model.Trace`.

    ``progress`` (optional) is called with short status lines while a large trace is read.
    Raises :class:`~maxinstr.errors.TraceError` (one line: the file and the problem) for a
    missing, unreadable, unrecognised, truncated or malformed input.
    """
    path = Path(path)
    if not path.exists():
        raise TraceError(path, "no such file or folder")
    if path.is_dir():
        return _open_folder(path, progress)
    if not path.is_file():
        raise TraceError(path, "not a regular file")
    name = path.name.lower()
    if name.endswith(".nsys-rep") or name.endswith(".qdrep"):
        from maxinstr.traces.nsys import read_nsys

        return read_nsys(path, progress=progress)
    head = _util.read_head(path, 64)
    if not head:
        raise TraceError(path, "empty file")
    if head.startswith(SQLITE_MAGIC):
        return _open_sqlite(path, progress)
    if head.startswith(GZIP_MAGIC):
        inner = _gunzip_head(path)
        if inner.startswith(SQLITE_MAGIC):
            return _open_sqlite(path, progress)
        return _open_json(path, progress)
    if name.endswith(".csv"):
        if _is_rocprofv2_csv(path, head):
            raise TraceError(path, _ROCPROFV2)
        from maxinstr.traces.rocprof import read_rocprof_csv

        return read_rocprof_csv(path, progress=progress)
    stripped = head.lstrip()
    if stripped[:1] in (b"{", b"[") or name.endswith(".json"):
        return _open_json(path, progress)
    if name.endswith((".sqlite", ".db", ".rpd")):
        raise TraceError(path, "not a SQLite database (bad header: truncated or corrupt?)")
    raise TraceError(path, "unrecognised trace format (expected nsys SQLite/.nsys-rep, rocprofv3, rocprof v1, RPD or Kineto JSON)")


def _gunzip_head(path: Path) -> bytes:
    try:
        with gzip.open(path, "rb") as fh:
            return fh.read(64)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(path, f"corrupt or truncated gzip data ({exc})") from None


def _open_sqlite(path: Path, progress: Progress | None) -> Trace:
    from maxinstr.traces import rocprof, rocprof_v1, rpd

    with _util.sqlite_db(path) as (con, _):
        try:
            tables = _util.sqlite_tables(con)
            v1 = rocprof_v1.is_rocprof_v1(con, tables)
        except sqlite3.Error as exc:
            raise TraceError(path, f"SQLite error: {exc}") from None

    if rpd.is_rpd(tables):
        return rpd.read_rpd(path, progress=progress)
    if rocprof.is_rocpd(tables):
        return rocprof.read_rocpd(path, progress=progress)
    if v1:
        return rocprof_v1.read_rocprof_v1_db(path, progress=progress)
    if any(t in tables for t in _NSYS_TABLES) or any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in tables):
        if path.name.endswith(".gz"):
            raise TraceError(path, "gzip-compressed nsys SQLite: decompress it first")
        from maxinstr.traces.nsys import read_nsys

        return read_nsys(path, progress=progress)
    if not tables:
        raise TraceError(path, "SQLite database with no tables (empty or truncated)")
    raise TraceError(path, f"SQLite database of an unknown kind (tables: {', '.join(sorted(tables)[:6])})")


def _open_json(path: Path, progress: Progress | None) -> Trace:
    _util.report(progress, f"parsing {path.name}")
    data = _util.read_bytes(path)
    try:
        document = _util.load_json(data, path)
    except TraceError:
        if b'"process_name"' in data[:4096] and any(s in data[:4096] for s in _V1_LABELS):
            # rocprof v1 opens its sections before it writes any event: with no trace it stops there
            beside = " (results.db beside it has the tables)" if path.with_suffix(".db").is_file() else ""
            raise TraceError(path, "rocprof v1 results.json without trace events: it holds only section labels, "
                                   "not a JSON document (rocprof traced nothing: run it with --hip-trace or "
                                   f"--sys-trace){beside}") from None
        raise
    from maxinstr.traces import rocprof, rocprof_v1, rpd
    from maxinstr.traces.kineto import read_kineto

    if isinstance(document, dict) and "rocprofiler-sdk-tool" in document:
        return rocprof.read_rocprof_json(path, progress=progress, document=document)
    events = document.get("traceEvents") if isinstance(document, dict) else document
    if isinstance(events, list):
        if rocprof_v1.is_rocprof_v1_json(events):
            return rocprof_v1.read_rocprof_v1_json(path, progress=progress, document=document)
        if rpd.is_rpd_json(events):
            return rpd.read_rpd_json(path, progress=progress, document=document)
        trace = read_kineto(path, progress=progress, document=document)
        if not len(trace.ops) and not len(trace.ranges) and not len(trace.calls):
            _not_kineto(path, events)
        return trace
    if isinstance(document, dict) and "traceEvents" in document:
        return read_kineto(path, progress=progress, document=document)  # (its one-line error)
    raise TraceError(path, "JSON of an unknown kind (no 'traceEvents' nor 'rocprofiler-sdk-tool' key)")


# rocprofv2's file plugin: <name>_<pid>.csv, headers "Domain,Function,..." / "Domain,ROCTX_ID,..."
_ROCPROFV2_NAME = re.compile(r"(hip_api_trace|hsa_api_trace|roctx_trace|hcc_ops_trace|async_copy_trace)_\d*.*\.csv$")
_ROCPROFV2_HEADS = (b"Domain,Function,", b"Domain,ROCTX_ID,", b"Domain,Operation,")
_ROCPROFV2 = ("rocprofv2 file-plugin CSV: not read (its API and roctx rows carry no thread id, so ranges cannot be "
              "tied to the kernels they launched); capture with rocprofv3, or rocprof v1 --hip-trace --roctx-trace")


def _is_rocprofv2_csv(path: Path, head: bytes) -> bool:
    return head.startswith(_ROCPROFV2_HEADS) or bool(_ROCPROFV2_NAME.search(path.name))


_V1_LABELS = (b'"Markers and Ranges"', b'"CPU HIP API"', b'"CPU HSA API"', b'"COPY"')


def _not_kineto(path: Path, events: list) -> None:
    """Raise, naming what the file holds, when a Chrome trace of duration events gave Kineto
    nothing: reporting 0 ops for it would be silently wrong."""
    spans = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    if not spans:
        return  # an empty trace: an empty report says so
    cats = Counter(str(e.get("cat")) for e in spans if "cat" in e)
    sections = sorted({str((e.get("args") or {}).get("name")) for e in events if isinstance(e, dict)
                       and e.get("ph") == "M" and e.get("name") == "process_name"
                       and isinstance(e.get("args"), dict)})
    seen = ", ".join(f"{c} ({n})" for c, n in cats.most_common(4)) or "none"
    where = f"; sections: {', '.join(sections[:4])}" if sections else ""
    raise TraceError(path, f"Chrome trace of an unknown producer: {len(spans)} duration events, none a Kineto "
                           f"GPU op, runtime call or annotation (categories: {seen}{where}); known: Kineto, "
                           "rocprof v1 results.json, RPD's rpd2tracing export")


def _open_folder(path: Path, progress: Progress | None) -> Trace:
    from maxinstr.traces import rocprof

    if (path / "meta.json").is_file() and (path / "parts").is_dir():
        from maxinstr.traces.inprocess import has_activity, read_run

        if has_activity(path):  # a run directory whose session collected kernels (kernels=True)
            trace, notes = read_run(path)
            if trace is None:
                raise TraceError(path, "run directory without in-process kernels: " + "; ".join(notes or ["none collected"]))
            return trace

    files = sorted(p for p in path.rglob("*") if p.is_file())
    if any(rocprof.csv_kind(p.name) for p in files):
        return rocprof.read_rocprof_csv(path, progress=progress)
    candidates = [p for p in files if p.name.endswith(("_results.json", "_results.db", ".rpd", ".rpd.gz", ".pt.trace.json",
                                                       ".pt.trace.json.gz"))
                  or p.suffix in (".nsys-rep", ".sqlite") or p.name in ("results.db", "results.json")]
    # rocprof v1 writes results.db and results.json from the same tables: the database has more
    # (the calls' Index and arguments), so it stands for the pair
    dbs = {p.with_suffix("") for p in candidates if p.name.endswith("results.db")}
    candidates = [p for p in candidates if not (p.name.endswith("results.json") and p.with_suffix("") in dbs)]
    if len(candidates) == 1:
        return open_trace(candidates[0], progress=progress)
    if len(candidates) > 1:
        raise TraceError(path, f"folder holds several traces ({', '.join(p.name for p in candidates[:4])}...): name one")
    if any(p.suffix == ".csv" and _is_rocprofv2_csv(p, _util.read_head(p, 32)) for p in files):
        raise TraceError(path, _ROCPROFV2)
    raise TraceError(path, "no trace found in folder (rocprofv3 CSV/JSON/db, rocprof v1 results.db, RPD, Kineto or nsys)")
