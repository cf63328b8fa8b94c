"""The in-process kernel collector's files in a part folder (docs/kernels.md "Files"):
``activity.bin`` (:data:`ACTIVITY_DTYPE` rows, collector clock), ``activity_names.jsonl``
(``[name_id, "name"]``) and ``activity.json`` (how it went; ``clock_pairs`` to the host clock).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from maxinstr._files import open_write, parse_json, read_regular, real_dirs, replace_atomic
from maxinstr._text import safe_name
from maxinstr.errors import RunDirError
from maxinstr.rundir.format import MAX_TIME_NS
from maxinstr.rundir.reader import (COUNT64, PID, STRING, STRINGS, Fields, Skipped, check_fields, clip, is_int,
                                    keep_rows, missing_name, read_jsonl)
from maxinstr.rundir.writer import write_all

ACTIVITY_FILE = "activity.bin"
ACTIVITY_NAMES_FILE = "activity_names.jsonl"
ACTIVITY_META_FILE = "activity.json"
ACTIVITY_FORMAT = "maxinstr-activity"
ACTIVITY_VERSION = 1

KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, KIND_RUNTIME, KIND_DRIVER, KIND_EXTERNAL = 0, 1, 2, 3, 4, 5

ACTIVITY_DTYPE = np.dtype([
    ("kind", "<i1"), ("copy_kind", "<i1"),  # memcpy: CUpti_ActivityMemcpyKind (1 HtoD, 2 DtoH, 8 DtoD, ...)
    ("flags", "<u2"), ("name_id", "<i4"),  # kernels and API calls: index into activity_names.jsonl; -1 none
    ("start_ns", "<i8"), ("end_ns", "<i8"), ("correlation_id", "<i8"),  # times: the collector's clock
    ("external_id", "<i8"),  # external correlation rows: the stage record id; -1 otherwise
    ("stream_id", "<i8"), ("tid", "<i8"),  # tid: API rows' collector thread id; -1 otherwise
    ("graph_node_id", "<i8"), ("bytes", "<i8"),  # graph_node_id 0 / -1: not replayed from a graph
    ("device_id", "<i4"), ("cbid", "<i4"),  # cbid: API rows' callback id of the function
])
assert ACTIVITY_DTYPE.itemsize == 80


def to_host_clock(ts: np.ndarray, pairs: list[list[int]] | None) -> tuple[np.ndarray, bool]:
    """Collector timestamps -> host-clock ns through ``pairs`` of (host_ns, collector_ns), and
    whether there was a pair. The offset is interpolated in collector time between pairs
    (constant outside); integers around the first pair keep ns precision whatever the epochs."""
    ts = np.asarray(ts, np.int64)
    if not pairs:
        return ts.copy(), False
    p = np.asarray(pairs, np.int64).reshape(-1, 2)
    p = p[np.argsort(p[:, 1], kind="stable")]
    host, coll = p[:, 0], p[:, 1]
    off = coll - host
    off0, c0 = int(off[0]), int(coll[0])
    if len(p) == 1:
        return ts - off0, True
    d_off = np.interp((ts - c0).astype(np.float64), (coll - c0).astype(np.float64), (off - off0).astype(np.float64))
    return ts - off0 - np.rint(d_off).astype(np.int64), True


def to_collector_clock(host_ns: np.ndarray, pairs: list[list[int]] | None) -> np.ndarray:
    """The inverse of :func:`to_host_clock` (the offset interpolated in host time)."""
    swapped = [[c, h] for h, c in pairs] if pairs else None
    return to_host_clock(host_ns, swapped)[0]


class ActivityWriter:
    """Appends activity rows and new names, rewrites activity.json. Thread-safe; a disk error is
    kept in ``error`` (and activity.json when it can be)."""

    def __init__(self, part_dir: Path, info: dict[str, Any]) -> None:
        self.part_dir = Path(part_dir)
        self.meta: dict[str, Any] = {"format": ACTIVITY_FORMAT, "version": ACTIVITY_VERSION, **info}
        self.meta.setdefault("status", "collecting")
        self.meta.setdefault("rows", 0)
        self.lock = threading.Lock()
        self.error: str | None = None
        self._names_written = 0

    def write(self, rows: np.ndarray, names: list[str]) -> None:  # and the names not written yet
        with self.lock:
            if self.error:
                return
            try:
                real_dirs(self.part_dir.parent, self.part_dir)
                new = names[self._names_written :]
                if new:
                    text = "".join(json.dumps([self._names_written + i, n]) + "\n" for i, n in enumerate(new))
                    _append(self.part_dir / ACTIVITY_NAMES_FILE, text.encode())
                    self._names_written += len(new)
                if len(rows):
                    _append(self.part_dir / ACTIVITY_FILE, np.ascontiguousarray(rows, ACTIVITY_DTYPE).tobytes())
                    self.meta["rows"] = int(self.meta.get("rows", 0)) + len(rows)
            except OSError as exc:
                self.error = f"{exc.filename or self.part_dir}: {exc.strerror or exc}"

    def write_meta(self, **updates: Any) -> None:
        with self.lock:
            self.meta.update(updates)
            if self.error:
                self.meta["write_error"] = self.error
            try:
                real_dirs(self.part_dir.parent, self.part_dir)
                replace_atomic(self.part_dir / ACTIVITY_META_FILE, json.dumps(self.meta, indent=1, default=str).encode())
            except OSError as exc:
                self.error = self.error or f"{exc.filename or self.part_dir}: {exc.strerror or exc}"


def _append(path: Path, data: bytes) -> None:
    fd = open_write(path)  # O_NOFOLLOW: never through a link planted in the run directory
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def read_part_activity(part_dir: Path) -> tuple[dict[str, Any], np.ndarray, list[str]] | None:
    """(activity.json, rows, names) of one part folder, or None when it has no activity.json.

    Read by the run directory's rules (:mod:`maxinstr.rundir.reader`): what is not the format is
    left out and said in ``meta["notes"]``, a name id without its line reads as a placeholder; a
    file meaningless as a whole is a RunDirError."""
    part_dir = Path(part_dir)
    meta_path = part_dir / ACTIVITY_META_FILE
    data = read_regular(meta_path, RunDirError)
    if data is None:
        return None
    meta = parse_json(data, meta_path, RunDirError)
    if not isinstance(meta, dict) or meta.get("format") != ACTIVITY_FORMAT:
        raise RunDirError(meta_path, f"not a {ACTIVITY_FORMAT} file")
    version = meta.get("version")
    if is_int(version, ACTIVITY_VERSION + 1, 2**63):
        raise RunDirError(meta_path, f"version {version} is newer than this maxinstr reads ({ACTIVITY_VERSION})")
    if not is_int(version, ACTIVITY_VERSION, ACTIVITY_VERSION + 1):
        raise RunDirError(meta_path, f"version {clip(version)} is not supported (this maxinstr reads {ACTIVITY_VERSION})")
    check_fields(meta, meta_path, _META_FIELDS)
    notes: list[str] = list(meta.get("notes") or [])
    meta["notes"] = notes

    part = part_dir.name
    names_path = part_dir / ACTIVITY_NAMES_FILE
    lines, names_skipped = read_jsonl(names_path)
    # an id at or past the number of lines is not maxinstr's (1e9 in a 17-byte file asked for 8 GB)
    count = names_skipped.total
    named: list[str | None] = [None] * count
    for number, line in lines:
        if not (isinstance(line, list) and len(line) == 2 and is_int(line[0], 0, count) and isinstance(line[1], str)):
            names_skipped.add(number, f'not [id, "name"] with an id from 0 to {count - 1} (one line per id)', line)
            continue
        name = safe_name(line[1])
        if named[line[0]] is None:
            named[line[0]] = name
        elif named[line[0]] != name:  # the writer names an id once: a second name is not one it wrote
            names_skipped.add(number, f"id {line[0]} was named {clip(named[line[0]])} before", line)
    names = [missing_name(i, part) if name is None else name for i, name in enumerate(named)]
    if names_skipped.first is not None:
        names_skipped.also(f"the kernels and API calls of a skipped name show as {missing_name('N', part)}")

    data_path = part_dir / ACTIVITY_FILE
    raw = read_regular(data_path, RunDirError) or b""
    whole = len(raw) - len(raw) % ACTIVITY_DTYPE.itemsize
    rows = np.frombuffer(raw, dtype=ACTIVITY_DTYPE, count=whole // ACTIVITY_DTYPE.itemsize)
    skipped = Skipped(data_path, "row", " that are not activity records")
    skipped.total = len(rows)
    if whole != len(raw):
        skipped.torn = f"last {len(raw) - whole} bytes are a torn row (cut off)"
    kind, name_id = rows["kind"], rows["name_id"]
    # CUPTI's clock (ns since 1970), -1 or 0 when untimed
    untimed = ((rows["start_ns"] < -1) | (rows["start_ns"] >= MAX_TIME_NS)
               | (rows["end_ns"] < -1) | (rows["end_ns"] >= MAX_TIME_NS))
    rows = keep_rows(rows, [
        ((kind < 0) | (kind > KIND_EXTERNAL), lambda i: f"kind {int(kind[i])} is not 0 to {KIND_EXTERNAL}"),
        (name_id < -1, lambda i: f"name id {int(name_id[i])} (below -1)"),
        (untimed, lambda i: "a time outside [-1, 2**62) ns"),
    ], skipped, "an activity record", "an activity.bin")
    skipped.say(notes)

    # a name id with no line: a placeholder numbered on from the lines (never sized by the id)
    past = rows["name_id"] >= len(names)
    if past.any():
        extra = np.unique(rows["name_id"][past])
        rows = rows.copy()
        rows["name_id"][past] = len(names) + np.searchsorted(extra, rows["name_id"][past])
        names += [missing_name(int(i), part) for i in extra]
        names_skipped.also(f"{len(extra)} name id(s) used by activity rows are not defined, shown as "
                           f"{names[-len(extra)]}" + (" ..." if len(extra) > 1 else ""))
    names_skipped.say(notes)
    return meta, rows, names


def _times(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 and all(is_int(t, 0, MAX_TIME_NS) for t in p)
                                       for p in v)


# The activity.json fields the reader and the report interpret
_META_FIELDS: Fields = {
    **dict.fromkeys(("status", "reason", "stage_correlation"), STRING),
    "notes": STRINGS,
    "pid": PID,
    **dict.fromkeys(("rows", "dropped_cupti", "dropped_queue"), COUNT64),
    "external_kind": (lambda v: is_int(v, -(2**31), 2**31), "an int32"),
    "clock_pairs": (_times, "a list of [host_ns, collector_ns] pairs of times in [0, 2**62)"),
}
