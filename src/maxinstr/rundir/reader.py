"""Read a run directory back into numpy columns (docs/formats.md, "Reading rules").

What the user recorded is never refused for a damaged neighbour: a torn tail and any row or line
that is not the format are left out, counted and said in one note per file (:class:`Skipped`);
only a file meaningless as a whole (meta.json unreadable or of another format or version, a
special file, a stages.bin without one stage record) is a :class:`~maxinstr.errors.RunDirError`
naming the file and the problem, and leaves its part out of a run of several.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from maxinstr import warmup as rule
from maxinstr._files import MAX_JSON_DEPTH, data_extents, open_regular, parse_json, read_at, read_regular
from maxinstr._text import safe_name
from maxinstr.columns import StringTable
from maxinstr.errors import RunDirError
from maxinstr.rundir import format as fmt
from maxinstr.rundir.samples import (HEADER_FIELDS, HW_THROTTLE_MASK, SAMPLES_FILE, SAMPLES_FORMAT,
                                     SAMPLES_LAYOUT_FILE, SAMPLES_VERSION)

RUN_STAGE_DTYPE = np.dtype(list(fmt.STAGE_DTYPE.descr) + [("part", "<i4"), ("pid", "<i8"), ("rank", "<i4")])
""":attr:`Run.stages`: the file's columns (``name_id`` into :attr:`Run.names`), part, pid and rank (-1: none)."""


@dataclass
class Run:
    """A loaded run: ``stages`` (:data:`RUN_STAGE_DTYPE` by ``host_start_ns``, named
    ``names[stages["name_id"]]``), ``attrs`` by record id, ``parts`` (part.json plus ``name``,
    ``path``, ``rows``), ``samples`` by part (:class:`Samples`, or ``{"layout", "raw"}`` unread)."""

    path: Path | None
    meta: dict[str, Any]
    stages: np.ndarray
    names: np.ndarray
    attrs: dict[int, dict[str, Any]] = field(default_factory=dict)
    parts: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    samples: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.stages)

    def __getitem__(self, column: str) -> np.ndarray:
        """A column of :attr:`stages`; also ``"name"``, ``"part_name"`` and ``"warmup"``."""
        if column == "name":
            return self.stage_names()
        if column == "part_name":
            return np.array([p["name"] for p in self.parts] or [""], dtype=object)[self.stages["part"]] if len(self.stages) else np.empty(0, object)
        if column == "warmup":
            return self.warmup_mask()
        return self.stages[column]

    @property
    def warmup(self) -> int:
        """The ``warmup=N`` the session was opened with (0 when none)."""
        return int(self.meta.get("warmup") or 0)

    def stage_names(self) -> np.ndarray:
        return self.names[self.stages["name_id"]] if len(self.stages) else np.empty(0, dtype=object)

    def warmup_mask(self, warmup: int | None = None) -> np.ndarray:
        """True for records the report keeps out as warm-up (:mod:`maxinstr.warmup`'s rule; never
        marks, nor the cold starts the report finds from the timings)."""
        n = self.warmup if warmup is None else int(warmup)
        s = self.stages
        if n <= 0 or len(s) == 0:
            return np.zeros(len(s), dtype=bool)
        parent = rule.parent_rows(s["id"], s["parent_id"])
        return rule.warmup_flags(s["part"], s["name_id"], parent, s["host_start_ns"], (s["flags"] & fmt.MARK) != 0,
                                 n).kept_out

    def to_pandas(self):
        """The stage records as a pandas DataFrame (plus ``name``, ``part_name``, ``warmup``, ``attrs``)."""
        try:
            import pandas as pd  # optional: maxinstr[pandas]
        except ImportError as exc:  # pragma: no cover - pandas is in the test extra
            raise ImportError("Run.to_pandas() needs pandas: pip install 'maxinstr[pandas]'") from exc
        df = pd.DataFrame({name: self.stages[name] for name in self.stages.dtype.names or ()})
        df["name"] = self.stage_names()
        df["part_name"] = self["part_name"]
        df["warmup"] = self.warmup_mask()
        attrs = np.full(len(self.stages), None, dtype=object)
        if self.attrs and len(self.stages):
            ids = np.fromiter(self.attrs.keys(), dtype=np.int64, count=len(self.attrs))
            order = np.argsort(self.stages["id"], kind="stable")
            pos = np.clip(np.searchsorted(self.stages["id"], ids, sorter=order), 0, len(order) - 1)
            hit = self.stages["id"][order[pos]] == ids
            values = np.empty(len(ids), dtype=object)
            values[:] = list(self.attrs.values())
            attrs[order[pos[hit]]] = values[hit]
        df["attrs"] = attrs
        return df


@dataclass
class _Part:  # what one part gave, kept apart until the part is known to be readable
    info: dict[str, Any]
    table: np.ndarray
    attrs: dict[int, dict[str, Any]]
    events: list[dict[str, Any]]
    notes: list[str]


def load(path: str | Path) -> Run:
    """Read the run directory at ``path`` (every part merged); a RunDirError (one line: file
    and problem) when it is not a readable run directory of a known version."""
    root = Path(path)
    if root.name == fmt.META_FILE and root.is_file():
        root = root.parent  # the run's meta.json stands for its directory
    if not root.exists():
        raise RunDirError(root, "no such run directory")
    if not root.is_dir():
        raise RunDirError(root, "not a directory (a run directory holds meta.json and parts/)")
    meta = read_meta(root / fmt.META_FILE)
    notes: list[str] = []
    parts_root = root / fmt.PARTS_DIR
    part_dirs: list[Path] = []
    if parts_root.is_dir():
        part_dirs = sorted(p for p in parts_root.iterdir() if p.is_dir() and not p.name.startswith("."))
    elif parts_root.exists():
        raise RunDirError(parts_root, "not a directory")
    if not [p for p in part_dirs if p.name != fmt.SAMPLER_PART]:
        # a session always makes its part folder: a closed one without it lost them (deleted, not copied)
        notes.append(PARTS_MISSING if meta.get("status") == "closed" and meta.get("session") else
                     "the run has no parts yet: no stage was recorded")

    names = StringTable()
    read: list[_Part] = []
    samples: dict[str, Any] = {}
    refused: list[RunDirError] = []
    for pdir in part_dirs:
        if pdir.name == fmt.SAMPLER_PART:  # maxinstr run's samples: no process part of the program
            samples[pdir.name] = _read_samples(pdir, notes)
            continue
        try:
            part = _read_part(pdir, len(read), names, samples)
        except RunDirError as exc:
            refused.append(exc)
            notes.append(f"{exc}; that part ({pdir.name}) is left out")
            continue
        twin = next((q for q in read if _same_records(q, part)), None)
        if twin is None:
            read.append(part)
            notes += part.notes
            continue
        if part.info.get("part") == part.info["name"] and twin.info.get("part") != twin.info["name"]:
            # the copy was read first: keep the folder part.json names, in the copy's place
            part.table["part"] = twin.table["part"][0]
            read[read.index(twin)] = part
            part, twin = twin, part
        samples.pop(part.info["name"], None)
        notes.append(f"{part.info['path']}: holds the same {len(part.table)} stage record(s) as part "
                     f"{twin.info['name']} (a copy of that part folder?): left out, its records counted once")
    if refused and not read:
        raise refused[0]  # nothing of the run can be read: the first file that says why

    parts = [p.info for p in read]
    stages = np.concatenate([p.table for p in read]) if read else np.empty(0, dtype=RUN_STAGE_DTYPE)
    stages = stages[np.argsort(stages["host_start_ns"], kind="stable")]
    if meta.get("status") == "running":
        notes.append("the run was not closed (still running, or killed): its last records may be missing")
    else:
        unclosed = [p["name"] for p in parts if p.get("status") == "running"]
        if unclosed:
            notes.append(f"{len(unclosed)} process(es) did not close their part (killed?): {', '.join(unclosed[:5])}"
                         + (" ..." if len(unclosed) > 5 else "") + "; their last records may be missing")
    return Run(path=root, meta=meta, stages=stages, names=names.to_array(),
               attrs={k: v for p in read for k, v in p.attrs.items()}, parts=parts,
               events=[e for p in read for e in p.events], samples=samples, notes=notes)


PARTS_MISSING = "the run was closed but its parts folder is missing (deleted, or not copied): its stages are not here"


def _same_records(p: _Part, q: _Part) -> bool:
    """Whether two parts are one copied part folder: the same process in part.json (two ranks made
    from one recording are not a copy) and the same stage records."""
    a, b = p.table, q.table
    return (len(a) == len(b) > 0 and a["id"][0] == b["id"][0]
            and all(p.info.get(k) == q.info.get(k) for k in ("pid", "rank", "host"))
            and all(np.array_equal(a[c], b[c]) for c in fmt.STAGE_DTYPE.names or ()))


def read_meta(path: Path) -> dict[str, Any]:
    """A run's meta.json, checked."""
    data = read_regular(path, RunDirError)
    if data is None:
        try:
            started = any(n.startswith(f".{path.name}.") and n.endswith(".tmp") for n in os.listdir(path.parent))
        except OSError:
            started = False
        if started:  # a session killed while it wrote its first meta.json
            raise RunDirError(path, "missing meta.json: a session was killed while it started (only its temporary "
                                    "file is there); nothing was recorded")
        raise RunDirError(path, "missing meta.json: not a maxinstr run directory")
    meta = parse_json(data, path, RunDirError)
    if not isinstance(meta, dict) or meta.get("format") != fmt.FORMAT_NAME:
        raise RunDirError(path, f"not a maxinstr run (\"format\" is not {fmt.FORMAT_NAME!r})")
    version = meta.get("version")
    if version != fmt.FORMAT_VERSION:
        raise RunDirError(path, f"run directory format version {version!r} is not supported (this maxinstr reads "
                                f"{fmt.FORMAT_VERSION})")
    check_fields(meta, path, _META_FIELDS)
    return meta


LAUNCH_FILE = "launch.json"


def read_launch(run_dir: str | Path) -> dict[str, Any] | None:
    """The record `maxinstr run` left in ``run_dir`` (launch.json), None when there is none; read
    as data (a regular file, JSON of at most 64 levels, the fields maxinstr interprets checked)."""
    return _read_object(Path(run_dir) / LAUNCH_FILE, _LAUNCH_FIELDS)


def _read_object(path: Path, fields: Fields) -> dict[str, Any] | None:
    data = read_regular(path, RunDirError)
    if data is None:
        return None
    doc = parse_json(data, path, RunDirError)
    if not isinstance(doc, dict):
        raise RunDirError(path, "not a JSON object")
    check_fields(doc, path, fields)
    return doc


def is_int(v: Any, lo: int, hi: int) -> bool:
    """Whether the JSON value ``v`` is an integer in ``[lo, hi)`` (not a bool, a float or digits).
    Every JSON number a reader turns into an int, an index or a numpy value goes through this."""
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v < hi


def _time(v: Any) -> bool:
    return is_int(v, 0, fmt.MAX_TIME_NS)


def _times_in(*keys: str) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, dict) and all(v.get(k) is None or _time(v.get(k)) for k in keys)


Fields = dict[str, tuple[Callable[[Any], bool], str]]
"""field -> (test, what it must be), for the fields a reader interprets (None or absent allowed):
another type is a RunDirError naming it, never a TypeError three calls later."""
STRING = (lambda v: isinstance(v, str), "a string")
OBJECT = (lambda v: isinstance(v, dict), "an object")
OBJECTS = (lambda v: isinstance(v, list) and all(isinstance(d, dict) for d in v), "a list of objects")
STRINGS = (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings")
STR_MAP = (lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()), "an object of strings")
COUNT = (lambda v: is_int(v, 0, 2**31), "a count (an integer from 0)")
PID = (lambda v: is_int(v, 0, 2**31), "a process id")
COUNT64 = (lambda v: is_int(v, 0, 2**63), "a count (an integer from 0)")

_META_FIELDS: Fields = {
    "warmup": COUNT,
    "status": STRING,
    **dict.fromkeys(("command", "argv", "frameworks_loaded"), STRINGS),
    "pid": PID,
    "session": (_times_in("start_ns", "end_ns"), "an object with times in ns"),
    "steady_state": (_times_in("start_ns", "detected_ns"), "an object with times in ns"),
    "gpus": OBJECTS,
    **dict.fromkeys(("profiler", "user", "env", "frameworks", "git"), OBJECT),
}
# launch.json (docs/cli.md "Files of a run")
_LAUNCH_FIELDS: Fields = {
    **dict.fromkeys(("command", "profiled_command", "stage_specs"), STRINGS),
    **dict.fromkeys(("env", "sweep"), STR_MAP),
    "label": STRING,
    "maxinstr_command": STRINGS,
    "profiler": (lambda v: isinstance(v, dict) and all(v.get(k) is None or isinstance(v.get(k), str)
                                                       for k in ("name", "capture", "flags")), "an object"),
    "artifact": (lambda v: isinstance(v, dict) and (v.get("files") is None or STR_MAP[0](v.get("files"))), "an object"),
    **dict.fromkeys(("run", "startup", "environment"), OBJECT),
    "stage_specs_unapplied": STR_MAP,
}
# part.json: the fields maxinstr writes itself (not pid, rank, local_rank and world_size: see _read_part)
_PART_FIELDS: Fields = {
    **dict.fromkeys(("status", "host"), STRING),
    **dict.fromkeys(("started_ns", "closed_ns"), (_time, "a time in ns")),
    "started_unix_ns": (lambda v: is_int(v, 0, 2**63), "a time in ns"),
    "ppid": PID,
    **dict.fromkeys(("rows_written", "dropped_records", "rows_dropped_disk", "attrs_dropped_disk", "attrs_dropped_close",
                     "attrs_unconverted", "depth_refused"), COUNT64),
}


def check_fields(doc: dict[str, Any], path: Path, fields: Fields) -> None:
    """RunDirError for the first field of ``doc`` that is not null and not what ``fields`` says."""
    for key, (ok, what) in fields.items():
        value = doc.get(key)
        if value is not None and not ok(value):
            raise RunDirError(path, f'"{key}" is not {what}: {clip(value)}')


def _read_part(pdir: Path, index: int, names: StringTable, samples: dict[str, Any]) -> _Part:
    info: dict[str, Any] = {}
    notes: list[str] = []
    part = pdir.name
    try:
        info.update(_read_object(pdir / fmt.PART_FILE, _PART_FIELDS) or {})
    except RunDirError as exc:
        # part.json only describes the part: a torn or damaged one never refuses the part's records
        notes.append(f"{exc}: the part is read without it (pid and rank from its folder name, "
                     "its status and counts unknown)")
    pid, rank = _pid_rank_from_name(part)
    for key, fallback in (("pid", pid), ("rank", rank)):
        if not is_int(info.get(key), 0, 2**31):
            info[key] = fallback  # the folder name says it too; never trust a damaged value
    for key in ("local_rank", "world_size"):
        if not is_int(info.get(key), -(2**31), 2**31):
            info[key] = None
    info.update(name=part, path=str(pdir))

    lines, names_skipped = read_jsonl(pdir / fmt.STRINGS_FILE)
    local_names: dict[int, str] = {}
    for number, rec in lines:
        # a name id indexes the int32 name_id column of stages.bin
        if not (isinstance(rec, dict) and is_int(rec.get("id"), 0, 2**31) and isinstance(rec.get("s"), str)):
            names_skipped.add(number, 'not {"id": int in [0, 2**31), "s": str}', rec)
            continue
        name = safe_name(rec["s"])
        first = local_names.setdefault(rec["id"], name)
        if first != name:  # a writer names an id once: a second name is not one it wrote
            names_skipped.add(number, f"id {rec['id']} was named {clip(first)} before", rec)
    attrs: dict[int, dict[str, Any]] = {}
    lines, skipped = read_jsonl(pdir / fmt.ATTRS_FILE)
    for number, rec in lines:
        # a record id is an int64 of stages.bin's id column
        if not (isinstance(rec, dict) and is_int(rec.get("id"), -(2**63), 2**63) and isinstance(rec.get("attrs"), dict)):
            skipped.add(number, 'not {"id": int64, "attrs": {...}}', rec)
            continue
        attrs[rec["id"]] = rec["attrs"]
    skipped.say(notes, "those records' attrs are not shown")
    events: list[dict[str, Any]] = []
    lines, skipped = read_jsonl(pdir / fmt.EVENTS_FILE)
    for number, rec in lines:
        if not isinstance(rec, dict):
            skipped.add(number, "not a JSON object", rec)
            continue
        events.append({"part": part, **rec})
    skipped.say(notes)

    notes += _loss_notes(part, info)
    rows, numbers, skipped = _read_stages(pdir / fmt.STAGES_FILE)
    said = info.get("rows_written")
    if info.get("status") not in (None, "running") and said is not None and said > skipped.total:
        # a closed part says how many rows it wrote: fewer on disk (skipped ones aside) is a cut file
        skipped.also(f"{said - skipped.total} of the {said} stage record(s) part.json says were written are missing "
                     "(the file was cut or damaged)")
    table = np.zeros(len(rows), dtype=RUN_STAGE_DTYPE)
    for col in fmt.STAGE_DTYPE.names or ():
        table[col] = rows[col]
    if len(rows):
        used = np.unique(rows["name_id"])
        missing = [i for i in used.tolist() if i not in local_names]
        if missing:
            names_skipped.also(f"{len(missing)} name id(s) used by stages are not defined, shown as "
                               f"{missing_name(missing[0], part)}" + (" ..." if len(missing) > 1 else ""))
        # a placeholder names its part: name 17 of two parts are two stages, never merged
        mapping = np.array([names.intern(local_names[i] if i in local_names else missing_name(i, part))
                            for i in used.tolist()], dtype=np.int32)
        table["name_id"] = mapping[np.searchsorted(used, rows["name_id"])]
    names_skipped.say(notes)
    table = _check_records(table, numbers, info, skipped)
    info["rows"] = len(table)
    skipped.say(notes)
    table["part"] = index
    table["pid"] = -1 if info["pid"] is None else info["pid"]
    table["rank"] = -1 if info["rank"] is None else info["rank"]

    if os.path.lexists(pdir / SAMPLES_FILE) or os.path.lexists(pdir / SAMPLES_LAYOUT_FILE):
        samples[part] = _read_samples(pdir, notes)
    return _Part(info, table, attrs, events, notes)


# What part.json counts as lost: each count above zero is a note of the report (issue 29).
_LOSSES = (
    (None, "dropped_records", "{n} stage record(s) dropped while recording (the record buffer was full)"),
    (None, "rows_dropped_disk", "{n} stage record(s) dropped while recording (the disk write failed)"),
    (None, "attrs_dropped_disk", "the attrs of {n} stage record(s) were not written (a disk error, or a file of the "
                                 "run directory refused)"),
    (None, "attrs_dropped_close", "the attrs of {n} stage record(s) were still unwritten when the session closed "
                                  "(close writes attrs for at most 1 s, whatever other threads record): not kept"),
    ("writer", "dropped_attrs", "the attrs of {n} stage record(s) were dropped while recording (the Python flusher "
                                "fell a whole buffer behind the native writer)"),
    (None, "attrs_unconverted", "the attrs of {n} stage record(s) could not be made data: not kept"),
    (None, "depth_refused", "{n} stage(s) and mark(s) nested deeper than 32767 levels were not recorded"),
)


def _loss_notes(part: str, info: dict[str, Any]) -> list[str]:
    out = []
    for section, key, text in _LOSSES:
        holder = info if section is None else info.get(section)
        value = holder.get(key) if isinstance(holder, dict) else None
        if is_int(value, 1, 2**63):
            out.append(f"{part}: " + text.format(n=value))
    return out


def missing_name(name_id: int | str, part: str) -> str:
    """A name id with no valid line: a placeholder naming its part (ids are numbered per part)."""
    return safe_name(f"<name {name_id} missing in {part}>")


class Skipped:
    """The rows or lines of one file left out (not the format), and its torn tail, said in one
    note: how many of how many, and the first one's number (rows from 0, lines from 1) and fault."""

    def __init__(self, path: Path, unit: str, what: str = "") -> None:
        self.path = path
        self.unit = unit  # "row" or "line"
        self.what = what  # e.g. " that are not stage records"
        self.total = 0  # complete rows or (non-blank) lines in the file, skipped ones included
        self.count = 0
        self.first: tuple[int, str] | None = None
        self.torn: str | None = None
        self._also: list[str] = []

    def add(self, number: int, problem: str, value: Any = None, count: int = 1) -> None:
        self.count += count
        # lines are added not in file order (not JSON first, then not of the file's shape)
        if self.first is None or number < self.first[0]:
            self.first = (number, problem if value is None else f"{problem}: {clip(value)}")

    def also(self, text: str) -> None:  # more for the file's note (what the skipped lines cost)
        self._also.append(text)

    def say(self, notes: list[str], consequence: str = "") -> None:
        said = []
        if self.first is not None:
            number, why = self.first
            said.append(f"skipped {self.count} of {self.total} {self.unit}(s){self.what} "
                        f"(first: {self.unit} {number}, {why})" + (f"; {consequence}" if consequence else ""))
        if self.torn:
            said.append(self.torn)
        said += self._also
        if said:
            notes.append(f"{self.path}: " + "; ".join(said))


Checks = list[tuple[np.ndarray, Callable[[int], str]]]


def _bad_rows(n: int, checks: Checks) -> tuple[np.ndarray, int, str] | None:
    """The rows any check (a mask, and what is wrong with a row of it) marks bad, the first and its fault."""
    bad = np.zeros(n, dtype=bool)
    for mask, _ in checks:
        bad |= mask
    if not bad.any():
        return None
    first = int(np.argmax(bad))
    return bad, first, next(describe(first) for mask, describe in checks if mask[first])


def keep_rows(rows: np.ndarray, checks: Checks, skipped: Skipped, record: str, whole: str) -> np.ndarray:
    """``rows`` without those ``checks`` marks bad (counted in ``skipped``); a RunDirError when all
    are: the file holds no ``record`` and is damaged or not ``whole`` (e.g. "a stages.bin")."""
    found = _bad_rows(len(rows), checks)
    if found is None:
        return rows
    bad, first, why = found
    count = int(bad.sum())
    if count == len(rows):
        raise RunDirError(skipped.path, f"none of its {len(rows)} row(s) is {record} (row {first}: {why}): "
                                        f"file damaged or not {whole}")
    skipped.add(first, why, count=count)
    return rows[~bad]


STAGE_CHUNK_ROWS = 1 << 20
"""stages.bin is read and checked this many rows (72 MB) at a time: memory is the rows kept plus
one chunk, whatever the file's size (a 20 GB sparse stages.bin was read whole, then MemoryError)."""
_ZERO_ROW = "record id 0 has sequence 0 (a zero-filled row?)"


def _read_stages(path: Path) -> tuple[np.ndarray, np.ndarray | None, Skipped]:
    """The stage records of ``path``, their row numbers in the file (None: rows 0, 1, ...)."""
    skipped = Skipped(path, "row", " that are not stage records")
    opened = open_regular(path, RunDirError)
    if opened is None:
        return np.empty(0, dtype=fmt.STAGE_DTYPE), None, skipped
    fd, size = opened
    width = fmt.STAGE_DTYPE.itemsize
    count = size // width
    skipped.total = count
    torn = size - count * width
    if torn:
        skipped.torn = f"ignored a torn last record ({torn} of {width} bytes)"
    kept: list[np.ndarray] = []
    kept_at: list[tuple[int, int, np.ndarray | None]] = []  # (first row, rows, which kept) per chunk read
    first_bad: tuple[int, str] | None = None
    try:
        row = 0
        # rows wholly inside a hole of a sparse file are zero rows (sequence 0), counted unread
        for start, end in data_extents(fd, count * width) + [(count * width, count * width)]:
            lo, hi = start // width, min(-(-end // width), count)
            if lo > row:
                skipped.add(row, _ZERO_ROW, count=lo - row)
                first_bad = first_bad or (row, _ZERO_ROW)
            row = max(row, lo)
            while row < hi:
                n = min(STAGE_CHUNK_ROWS, hi - row)
                data = read_at(fd, row * width, n * width)
                rows = np.frombuffer(data, dtype=fmt.STAGE_DTYPE, count=len(data) // width)
                good, bad = _check_stage_rows(rows, skipped, row)
                first_bad = first_bad or bad
                kept.append(rows if good is None else rows[good])
                kept_at.append((row, len(rows), good))
                row += len(rows)
                if len(rows) < n:  # the file was cut while being read: what was read is all
                    skipped.total = row
                    break
            if row < hi:
                break
    except OSError as exc:
        raise RunDirError(path, f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    kept = [k for k in kept if len(k)]
    if count and not kept:
        number, why = first_bad or (0, "unreadable")
        raise RunDirError(path, f"none of its {count} row(s) is a stage record (row {number}: {why}): "
                                "file damaged or not a stages.bin")
    if not kept:
        return np.empty(0, dtype=fmt.STAGE_DTYPE), None, skipped
    numbers = None if skipped.first is None else np.concatenate(
        [np.arange(at, at + n) if good is None else np.flatnonzero(good) + at for at, n, good in kept_at])
    return (kept[0] if len(kept) == 1 else np.concatenate(kept)), numbers, skipped


def _check_stage_rows(rows: np.ndarray, skipped: Skipped, offset: int) -> tuple[np.ndarray | None, tuple[int, str] | None]:
    """Which of ``rows`` (from row ``offset``) are stage records (None: all), and the first bad one's (number, why)."""
    if len(rows) and not rows.dtype.isnative:
        rows = rows.astype(rows.dtype.newbyteorder("="))
    timed = (rows["flags"] & fmt.GPU_TIMED) != 0

    def outside(col: str) -> np.ndarray:
        # CLOCK_MONOTONIC times: below 2**62 any difference of two is a valid int64 (a start
        # near -2**63 once made a duration wrap around to -20 ns)
        return (rows[col] < 0) | (rows[col] >= fmt.MAX_TIME_NS)

    found = _bad_rows(len(rows), [
        ((rows["flags"] & ~np.uint16(fmt.KNOWN_FLAGS)) != 0,
         lambda i: f"flags 0x{int(rows['flags'][i]):04x} has bits maxinstr does not write"),
        # ids are (pid << 32) | seq with seq from 1: a zero-filled row (crash, preallocation) has seq 0
        ((rows["id"] & 0xFFFFFFFF) == 0, lambda i: f"record id {int(rows['id'][i])} has sequence 0 (a zero-filled row?)"),
        (rows["depth"] < 0, lambda i: f"a negative depth ({int(rows['depth'][i])})"),
        (rows["name_id"] < 0, lambda i: f"a negative name id ({int(rows['name_id'][i])})"),
        (outside("host_start_ns") | outside("host_end_ns"), lambda i: "a host time outside [0, 2**62) ns"),
        (rows["host_end_ns"] < rows["host_start_ns"], lambda i: "it ends before it starts"),
        (timed & (outside("gpu_start_ns") | outside("gpu_end_ns")), lambda i: "a GPU time outside [0, 2**62) ns"),
    ])
    if found is None:
        return None, None
    bad, first, why = found
    skipped.add(offset + first, why, count=int(bad.sum()))
    return ~bad, (offset + first, why)


FAR_NS = 86_400 * 10**9
"""A time further than this (or 10 times the part's window, if more) outside the part's window
(part.json ``started_ns`` to ``closed_ns``, else the median host start and end) is damage."""


def _check_records(table: np.ndarray, numbers: np.ndarray | None, info: dict[str, Any], skipped: Skipped) -> np.ndarray:
    """The checks no single row can fail (docs/formats.md, "Reading rules"): a record id seen
    before and times far outside the part's window skip the row (``numbers``: the rows' numbers in
    the file, None for 0, 1, ...); GPU times that cannot be and a parent that cannot enclose are
    read as none, said in the note."""
    if not len(table):
        return table
    ids = np.ascontiguousarray(table["id"])
    order = np.argsort(ids, kind="stable")
    again = np.flatnonzero(ids[order[1:]] == ids[order[:-1]])
    drop = np.zeros(len(table), bool)
    if len(again):  # ids are unique in a part: the first in the file is kept
        later, earlier = order[again + 1], order[again]
        same = np.ones(len(later), bool)
        for col in fmt.STAGE_DTYPE.names or ():
            same &= table[col][later] == table[col][earlier]
        numbers = np.arange(len(table)) if numbers is None else numbers
        i = int(np.argmin(numbers[later]))
        skipped.add(int(numbers[later[i]]), ("it repeats row {} (same record id and content)" if same[i] else
                                             "it reuses the record id of row {} (the earlier is kept)").format(
                                                 int(numbers[earlier[i]])), count=len(later))
        drop[later] = True
    lo, hi = info.get("started_ns"), info.get("closed_ns")
    lo = int(np.median(table["host_start_ns"])) if lo is None else lo
    hi = max(lo, int(np.median(table["host_end_ns"])) if hi is None else hi)
    slack = max(10 * (hi - lo), FAR_NS)

    def far(start: str, end: str) -> np.ndarray:  # for rows that end after they start
        return (table[start] < lo - slack) | (table[end] > hi + slack)

    host = far("host_start_ns", "host_end_ns")
    if host.any() and not (host | drop).all():  # all of them: the window is what is wrong
        numbers = np.arange(len(table)) if numbers is None else numbers
        i = int(np.argmax(host))
        skipped.add(int(numbers[i]), f"a host time more than {slack / 3.6e12:.0f} h outside the part's window",
                    count=int((host & ~drop).sum()))
        drop |= host
    if drop.any():
        table, ids = table[~drop], ids[~drop]
        order = np.argsort(ids, kind="stable")
    gpu = ((table["flags"] & fmt.GPU_TIMED) != 0) & (
        (table["gpu_end_ns"] < table["gpu_start_ns"]) | far("gpu_start_ns", "gpu_end_ns"))
    if gpu.any():
        skipped.also(f"{int(gpu.sum())} row(s) have GPU times that cannot be (end before start, or far outside the "
                     "part's window): read without GPU times")
        table["flags"][gpu] &= ~np.uint16(fmt.GPU_TIMED)
        table["gpu_start_ns"][gpu] = table["gpu_end_ns"][gpu] = -1
    # a parent entered first on the same thread, one level up: its id is smaller (ids count
    # entries), so a chain of them never cycles
    parent = rule.parent_rows(ids, table["parent_id"], order)
    child = np.flatnonzero(parent >= 0)
    parent = parent[child]
    tid, depth, start = (np.ascontiguousarray(table[c]) for c in ("tid", "depth", "host_start_ns"))
    bad = child[(ids[parent] >= ids[child]) | (tid[parent] != tid[child])
                | (depth[parent].astype(np.int32) + 1 != depth[child]) | (start[parent] > start[child])]
    if len(bad):
        skipped.also(f"{len(bad)} row(s) name a parent that cannot enclose them (not entered before them on their "
                     "thread one level up: a cycle or damage): read as top-level")
        table["parent_id"][bad] = -1
    return table


def read_jsonl(path: Path) -> tuple[list[tuple[int, Any]], Skipped]:
    """The values of the JSON lines file ``path`` with their line numbers (from 1), and the lines
    skipped (not JSON, too deep, a torn last line); the caller adds those not of the file's shape
    and says the note. No file: nothing; a special file (a FIFO) is a RunDirError."""
    skipped = Skipped(path, "line")
    data = read_regular(path, RunDirError)
    if data is None:
        return [], skipped
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    if tail.strip():
        skipped.torn = f"ignored a torn last line ({len(tail)} bytes without a newline)"
    numbered = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    skipped.total = len(numbered)
    values = _parse_lines([line for _, line in numbered])
    if values is not None:
        return [(number, value) for (number, _), value in zip(numbered, values, strict=True)], skipped
    out = []  # one of them is not JSON (or too deep): line by line, to skip just those
    for number, line in numbered:
        try:
            if line.count(b"[") + line.count(b"{") < MAX_JSON_DEPTH:
                out.append((number, json.loads(line)))  # cannot nest past the bound
                continue
        except ValueError:
            pass  # said below, in parse_json's words
        try:
            out.append((number, parse_json(line, path, _LineRefused)))
        except _LineRefused as exc:
            skipped.add(number, str(exc).replace("not valid JSON", "not JSON", 1))
    return out, skipped


class _LineRefused(Exception):  # parse_json's refusal of one line (skipped, not raised)
    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(problem)


def _parse_lines(lines: list[bytes]) -> list[Any] | None:
    """Every line parsed in one ``json.loads`` as an array (30 ms for 50,000 names, 80 ms line by
    line), or None when that cannot be trusted: a line not JSON on its own (``[1`` and ``2]`` join
    into one value: the count differs), or one with more brackets than MAX_JSON_DEPTH."""
    if any(line.count(b"[") + line.count(b"{") >= MAX_JSON_DEPTH for line in lines):
        return None
    try:
        values = json.loads(b"[" + b",\n".join(lines) + b"]")
    except (ValueError, RecursionError):
        return None
    return values if len(values) == len(lines) else None


def _read_samples(pdir: Path, notes: list[str]) -> Any:
    """The part's :class:`Samples`, or (a newer format, a damaged layout) its layout and raw bytes,
    said in ``notes``: samples must not make the stages unreadable."""
    try:
        result = read_samples(pdir)
        if result.torn_bytes:
            notes.append(f"{pdir / SAMPLES_FILE}: ignored a torn last sample row ({result.torn_bytes} bytes)")
        return result
    except Exception as exc:  # noqa: BLE001 - any refusal: the rest of the run still loads
        text = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        notes.append(f"{pdir}: samples not read ({type(exc).__name__}: {text}); raw bytes kept")
    layout = None
    layout_path = pdir / SAMPLES_LAYOUT_FILE
    raw = b""
    try:
        data = read_regular(layout_path, RunDirError)
        layout = None if data is None else parse_json(data, layout_path, RunDirError)
        raw = read_regular(pdir / SAMPLES_FILE, RunDirError) or b""
    except RunDirError as exc:
        notes.append(f"not read: {exc}")
    return {"layout": layout, "raw": raw}


def _pid_rank_from_name(name: str) -> tuple[int | None, int | None]:
    found: dict[str, int] = {}
    for piece in name.split("."):
        # at most 9 ASCII digits ("²".isdigit() is True, int() refuses it): an int32 column
        if piece[:1] in ("p", "r") and piece[1:].isascii() and piece[1:].isdigit() and len(piece) <= 10:
            found[piece[0]] = int(piece[1:])
    return found.get("p"), found.get("r")


def clip(obj: Any) -> str:  # a value quoted in a one-line error: JSON cut to 80 characters
    text = json.dumps(obj, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(repr=False)
class Samples:
    """Sampler rows of one part, one per (tick, device), in time order per device (float metrics
    NaN where not read), and samples.json as ``meta``, whose ``devices`` the ``device`` column indexes."""

    rows: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    torn_bytes: int = 0

    t_ns = property(lambda self: self.rows["t_ns"])
    device = property(lambda self: self.rows["device"])
    flags = property(lambda self: self.rows["flags"])
    throttle = property(lambda self: self.rows["throttle"])

    @property
    def devices(self) -> list[dict[str, Any]]:
        return list(self.meta.get("devices", []))

    @property
    def metric_names(self) -> list[str]:
        return [f["name"] for f in self.meta.get("row", {}).get("fields", []) if f["name"] not in HEADER_FIELDS]

    @property
    def units(self) -> dict[str, str]:
        return {f["name"]: f.get("unit", "") for f in self.meta.get("row", {}).get("fields", [])}

    errors = property(lambda self: list(self.meta.get("errors", [])))
    unavailable = property(lambda self: self.meta.get("unavailable"))

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        names = [f"{d.get('visible_index')}:{d.get('name')}" for d in self.devices]
        why = f", unavailable={self.unavailable!r}" if self.unavailable else ""
        return f"Samples({len(self)} rows, devices={names}, backend={self.meta.get('backend')!r}{why})"

    def column(self, name: str) -> np.ndarray:
        return self.rows[name]

    def for_device(self, device: int) -> Samples:
        rows = self.rows[self.rows["device"] == device]
        return Samples(rows[np.argsort(rows["t_ns"], kind="stable")], self.meta, 0)

    def hw_throttled(self) -> np.ndarray:  # per row: clocks held down by a limit (not idle, not a setting)
        return (self.rows["throttle"] & HW_THROTTLE_MASK) != 0


def dtype_from_layout(layout: dict[str, Any], where: Path) -> np.dtype:
    try:
        dtype = np.dtype([(f["name"], f["type"]) for f in layout["fields"]])
        size = int(layout["size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise RunDirError(where, f"bad row layout in {SAMPLES_LAYOUT_FILE}: {exc}") from None
    if dtype.itemsize != size:
        raise RunDirError(where, f"{SAMPLES_LAYOUT_FILE} says rows are {size} bytes but its fields add up to {dtype.itemsize}")
    # the columns every reader uses (a t_ns as text was a ValueError inside the HTML view)
    for name, kind in (("t_ns", "i"), ("device", "iu"), ("flags", "iu"), ("throttle", "iu")):
        if name not in (dtype.names or ()) or dtype[name].kind not in kind:
            raise RunDirError(where, f"bad row layout in {SAMPLES_LAYOUT_FILE}: no integer field {name!r}")
    metrics = [n for n in dtype.names or () if n not in HEADER_FIELDS]
    bad = next((n for n in metrics if dtype[n].kind not in "fiu" or dtype[n].shape), None)
    if bad is not None:
        raise RunDirError(where, f"bad row layout in {SAMPLES_LAYOUT_FILE}: field {bad!r} is not a number")
    return dtype


def read_samples(part_dir: Path | str) -> Samples:
    """The samples in ``part_dir``; empty when neither file is there. A samples.bin without
    samples.json, or a malformed samples.json, is a RunDirError."""
    part = Path(part_dir)
    meta_path, bin_path = part / SAMPLES_LAYOUT_FILE, part / SAMPLES_FILE
    text = read_regular(meta_path, RunDirError)
    data = read_regular(bin_path, RunDirError)
    if text is None:
        if data:
            raise RunDirError(bin_path, f"has no {SAMPLES_LAYOUT_FILE} beside it: the row layout is unknown")
        return Samples(np.empty(0, dtype=[("t_ns", "<i8"), ("device", "<u2"), ("flags", "<u2"), ("throttle", "<u4")]))
    meta = parse_json(text, meta_path, RunDirError)
    if not isinstance(meta, dict) or meta.get("format") != SAMPLES_FORMAT:
        raise RunDirError(meta_path, "is not a maxinstr samples description")
    version = meta.get("version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise RunDirError(meta_path, f"samples format version {_clip40(version)} is not a number")
    if version > SAMPLES_VERSION:
        raise RunDirError(meta_path, f"samples format version {version} is newer than this maxinstr reads (1)")
    for key, (ok, what) in {"devices": OBJECTS, "errors": OBJECTS, "unavailable": STRING, "row": OBJECT}.items():
        if meta.get(key) is not None and not ok(meta[key]):
            raise RunDirError(meta_path, f'"{key}" is not {what}: {_clip40(meta[key])}')
    dtype = dtype_from_layout(meta.get("row") or {}, meta_path)
    raw = np.frombuffer(bytearray(data or b""), dtype=np.uint8)  # writable, as the rows were from np.fromfile
    n = len(raw) // dtype.itemsize
    rows = raw[: n * dtype.itemsize].view(dtype) if n else np.empty(0, dtype=dtype)
    return Samples(rows, meta, len(raw) - n * dtype.itemsize)


def _clip40(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
