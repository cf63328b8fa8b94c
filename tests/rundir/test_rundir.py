"""The run directory format: writer and reader agree with each other and with docs/formats.md,
merge parts, survive torn tails, skip damaged rows and lines with a note, and turn a file that is
meaningless as a whole into a one-line RunDirError."""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from maxinstr.errors import RunDirError
from maxinstr.rundir import RUN_STAGE_DTYPE, load
from maxinstr.rundir import format as fmt
from maxinstr.rundir.samples import SAMPLES_FILE, SAMPLES_LAYOUT_FILE
from maxinstr.rundir.writer import PartWriter, RunDirWarning, write_json_atomic

DOC = Path(__file__).parents[2] / "docs" / "formats.md"


def rows(n: int, *, pid: int = 4242, name_ids=None, start: int = 1_000, tid: int = 77) -> np.ndarray:
    """n well-formed records: a top-level stage every 100 ns, each with one child."""
    r = np.zeros(n, dtype=fmt.STAGE_DTYPE)
    r["id"] = (pid << 32) | np.arange(1, n + 1)
    r["parent_id"] = -1
    r["tid"] = tid
    r["host_start_ns"] = start + 100 * np.arange(n)
    r["host_end_ns"] = r["host_start_ns"] + 50
    r["gpu_start_ns"] = -1
    r["gpu_end_ns"] = -1
    r["step"] = np.arange(n)
    r["name_id"] = 0 if name_ids is None else name_ids
    return r


def new_run(tmp_path: Path, **meta) -> Path:
    root = tmp_path / "run"
    root.mkdir()
    write_json_atomic(root / "meta.json", {"format": "maxinstr-run", "version": 1, "status": "closed", "warmup": 0, **meta})
    return root


def writer(root: Path, part: str, **info) -> PartWriter:
    w = PartWriter(root / "parts" / part, {"part": part, **info})
    w.open()
    return w


# -- the format matches its documentation -------------------------------------------------


def test_stage_dtype_matches_the_documented_table():
    text = DOC.read_text()
    table = text.split("### Stage records")[1].split("### ")[0]
    documented: list[str] = []
    for line in table.splitlines():
        m = re.match(r"\| (`[^|]+`) \| (\w+) \|", line)
        if m:
            names = re.findall(r"`(\w+)`", m.group(1))
            documented += [(n, m.group(2)) for n in names]
    assert [n for n, _ in documented] == list(fmt.STAGE_DTYPE.names)
    for name, typ in documented:
        assert fmt.STAGE_DTYPE[name] == np.dtype(typ).newbyteorder("<"), name
    assert fmt.STAGE_DTYPE.itemsize == 72 and "72-byte" in text


def test_flag_bits_match_the_documentation():
    table = DOC.read_text().split("### Stage records")[1].split("### ")[0]
    flags_row = next(line for line in table.splitlines() if line.startswith("| `flags`"))
    bits = dict((name, int(bit)) for bit, name in re.findall(r"bit (\d) `(\w+)`", flags_row))
    assert bits == {"EXCEPTION": 0, "GPU_TIMED": 1, "MARK": 2, "GPU_DROPPED": 3, "UNCLOSED": 4, "GPU_SAMPLED_OUT": 5}
    for name, bit in bits.items():
        assert getattr(fmt, name) == 1 << bit


def test_part_names(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert fmt.part_name(12) == "p12"
    monkeypatch.setenv("RANK", "2")
    assert fmt.part_name(12) == "r2.p12"
    monkeypatch.setenv("RANK", "not-a-number")
    assert fmt.part_name(12) == "p12"
    assert fmt.part_name(12, 3) == "r3.p12"
    assert fmt.part_name(12, "0") == "r0.p12"


# -- round trip and merge -------------------------------------------------------------------


def test_round_trip_merges_parts_and_renumbers_names(tmp_path):
    root = new_run(tmp_path, warmup=1)
    a = writer(root, "r0.p100", pid=100, rank=0)
    ra = rows(4, pid=100, name_ids=[0, 1, 0, 1])
    a.write(ra[:2], {0: "decode", 1: "prefill"}, [(int(ra["id"][1]), {"layer": 3})])
    a.write(ra[2:], {0: "decode", 1: "prefill"})
    a.close(status="closed")
    b = writer(root, "r1.p200", pid=200, rank=1)
    rb = rows(3, pid=200, name_ids=[5, 5, 9], start=1_050)  # other local ids for the same names
    b.write(rb, {5: "prefill", 9: "sample"})
    b.close(status="closed")

    run = load(root)
    assert run.stages.dtype == RUN_STAGE_DTYPE
    assert len(run) == 7 and run.notes == []
    assert np.all(np.diff(run["host_start_ns"]) >= 0)
    names = run["name"]
    by_id = dict(zip(run["id"].tolist(), names.tolist()))
    assert [by_id[i] for i in ra["id"].tolist()] == ["decode", "prefill", "decode", "prefill"]
    assert [by_id[i] for i in rb["id"].tolist()] == ["prefill", "prefill", "sample"]
    assert sorted(run.names.tolist()) == ["decode", "prefill", "sample"]
    assert set(zip(run["pid"].tolist(), run["rank"].tolist())) == {(100, 0), (200, 1)}
    assert run.attrs == {int(ra["id"][1]): {"layer": 3}}
    assert [p["name"] for p in run.parts] == ["r0.p100", "r1.p200"]
    # warm-up: the first instance of each name in each part
    warm = dict(zip(run["id"].tolist(), run.warmup_mask().tolist()))
    assert [warm[i] for i in ra["id"].tolist()] == [True, True, False, False]
    assert [warm[i] for i in rb["id"].tolist()] == [True, False, True]

    df = run.to_pandas()
    assert list(df["name"]) == names.tolist()
    assert df.loc[df["id"] == ra["id"][1], "attrs"].item() == {"layer": 3}
    assert set(df["part_name"]) == {"r0.p100", "r1.p200"}


def test_names_are_written_once_and_before_their_rows(tmp_path):
    root = new_run(tmp_path)
    w = writer(root, "p1")
    for _ in range(3):
        w.write(rows(2, pid=1), {0: "x"})
    lines = (root / "parts/p1/strings.jsonl").read_text().splitlines()
    assert lines == ['{"id":0,"s":"x"}']


def test_marks_are_never_warmup(tmp_path):
    root = new_run(tmp_path, warmup=5)
    w = writer(root, "p1")
    r = rows(3, pid=1)
    r["flags"] = fmt.MARK
    r["host_end_ns"] = r["host_start_ns"]
    w.write(r, {0: "tick"})
    assert not load(root).warmup_mask().any()


# -- torn tails ----------------------------------------------------------------------------


def test_torn_last_record_and_line_are_ignored_with_a_note(tmp_path):
    root = new_run(tmp_path, status="running")
    w = writer(root, "p1")
    w.write(rows(5, pid=1), {0: "decode"})
    w.close()
    part = root / "parts/p1"
    with open(part / "stages.bin", "ab") as f:
        f.write(rows(1, pid=1).tobytes()[:30])
    with open(part / "strings.jsonl", "ab") as f:
        f.write(b'{"id": 1, "s": "hal')
    with open(part / "attrs.jsonl", "ab") as f:
        f.write(b'{"id": 3')
    run = load(root)
    assert len(run) == 5
    joined = "\n".join(run.notes)
    assert "torn last record (30 of 72 bytes)" in joined
    assert "strings.jsonl: ignored a torn last line" in joined
    assert "attrs.jsonl: ignored a torn last line" in joined
    assert "not closed" in joined


def test_empty_run_directory_loads_with_a_note(tmp_path):
    root = new_run(tmp_path)
    run = load(root)
    assert len(run) == 0 and run.stages.dtype == RUN_STAGE_DTYPE
    assert any("no parts" in n for n in run.notes)
    assert len(run.to_pandas()) == 0


# -- bad input: one line naming the file ---------------------------------------------------


def _error(path) -> str:
    with pytest.raises(RunDirError) as info:
        load(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_bad_directories(tmp_path):
    assert "no such run directory" in _error(tmp_path / "nope")
    f = tmp_path / "file"
    f.write_text("x")
    assert "not a directory" in _error(f)
    (tmp_path / "empty").mkdir()
    assert _error(tmp_path / "empty") == f"{tmp_path / 'empty' / 'meta.json'}: missing meta.json: not a maxinstr run directory"


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"", "not valid JSON"),
        (b"{\"format\": \"maxinstr-run\", \"vers", "not valid JSON"),
        (b"[1, 2]", "not a maxinstr run"),
        (b'{"format": "other", "version": 1}', "not a maxinstr run"),
        (b'{"format": "maxinstr-run", "version": 2}', "version 2 is not supported"),
        (b'{"format": "maxinstr-run"}', "version None is not supported"),
        (b"\xff\xfe garbage", "not valid JSON"),
    ],
)
def test_bad_meta(tmp_path, content, problem):
    root = tmp_path / "run"
    root.mkdir()
    (root / "meta.json").write_bytes(content)
    message = _error(root)
    assert message.startswith(str(root / "meta.json") + ": ")
    assert problem in message


def test_garbage_stages_file(tmp_path):
    """A stages.bin in which no row is a stage record (random bytes) is meaningless as a whole:
    one line naming it, the first row and what is wrong with it."""
    root = new_run(tmp_path)
    part = root / "parts" / "p1"
    part.mkdir(parents=True)
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 72 * 10, dtype=np.uint8).tobytes()
    (part / "stages.bin").write_bytes(data)
    flags = int(np.frombuffer(data, fmt.STAGE_DTYPE)["flags"][0])
    assert _error(root) == (f"{part / 'stages.bin'}: none of its 10 row(s) is a stage record (row 0: flags 0x{flags:04x} "
                            "has bits maxinstr does not write): file damaged or not a stages.bin")


def test_a_corrupt_line_in_the_middle_is_skipped_and_counted_not_a_torn_tail(tmp_path):
    """A damaged line loses that line only: the run loads, the note names the file, how many
    lines were skipped of how many, the first one's number and why."""
    root = new_run(tmp_path)
    w = writer(root, "p1")
    w.write(rows(2, pid=1), {0: "x"})
    w.close(status="closed")
    path = root / "parts/p1/strings.jsonl"
    path.write_bytes(b"not json\n" + path.read_bytes())
    run = load(root)
    assert run["name"].tolist() == ["x", "x"]
    assert run.notes == [f"{path}: skipped 1 of 2 line(s) (first: line 1, not JSON (Expecting value: line 1 column 1 "
                         "(char 0)))"]
    path.write_bytes(b'{"id": "x"}\n')
    run = load(root)
    assert run["name"].tolist() == ["<name 0 missing in p1>"] * 2
    assert run.notes == [f'{path}: skipped 1 of 1 line(s) (first: line 1, not {{"id": int in [0, 2**31), "s": str}}: '
                         '{"id": "x"}); 1 name id(s) used by stages are not defined, shown as <name 0 missing in p1>']


def test_missing_names_become_placeholders_naming_their_part_with_a_note(tmp_path):
    """A name id with no line reads as a placeholder that says so and names its part: name 0 of
    two parts whose names are both missing are two stages, never one."""
    root = new_run(tmp_path)
    for pid in (1, 2):
        w = writer(root, f"p{pid}")
        w.write(rows(2, pid=pid), {0: "x"})
        w.close(status="closed")
        (root / f"parts/p{pid}/strings.jsonl").write_bytes(b"")
    run = load(root)
    assert sorted(set(run["name"].tolist())) == ["<name 0 missing in p1>", "<name 0 missing in p2>"]
    assert len(run.names) == 2 and len(run) == 4
    assert sum("not defined" in n for n in run.notes) == 2, run.notes


# -- the writer under disk errors ----------------------------------------------------------


def test_disk_full_warns_once_and_keeps_going(tmp_path, monkeypatch):
    """Every write of stages.bin answered with ENOSPC, as /dev/full does (a link to /dev/full
    was this test's full disk until links in a run directory were refused, issue 29)."""
    part = tmp_path / "run" / "parts" / "p1"
    w = PartWriter(part, {"part": "p1"})
    real_write = os.write
    full: set[int] = set()

    def write(fd, data):
        if fd in full:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w.open()
        full.add(w._files["stages.bin"].fd)
        for _ in range(5):
            w.write(rows(10, pid=1), {0: "x"})
        w.close()
    ours = [c for c in caught if issubclass(c.category, RunDirWarning)]
    assert len(ours) == 1
    assert "No space left on device" in str(ours[0].message)
    assert w.rows_written == 0 and w.rows_dropped == 50


def test_short_write_is_cut_back_to_whole_records(tmp_path, monkeypatch):
    part = tmp_path / "p1"
    w = PartWriter(part, {"part": "p1"})
    w.open()
    w.write(rows(3, pid=1), {0: "x"})
    real_write = os.write
    calls = {"n": 0}

    def failing_write(fd, data):
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data)[:100])  # partial
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.warns(RunDirWarning):
        w.write(rows(4, pid=1, start=9_000), {0: "x"})
    monkeypatch.undo()
    assert (part / "stages.bin").stat().st_size == 3 * 72
    assert w.rows_written == 3 and w.rows_dropped == 4


def test_write_json_atomic_exclusive(tmp_path):
    path = tmp_path / "meta.json"
    assert write_json_atomic(path, {"a": 1}, exclusive=True)
    assert not write_json_atomic(path, {"a": 2}, exclusive=True)
    assert json.loads(path.read_text()) == {"a": 1}
    assert write_json_atomic(path, {"a": 3})
    assert json.loads(path.read_text()) == {"a": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["meta.json"]


def test_load_accepts_the_meta_json_path(tmp_path):
    root = new_run(tmp_path)
    writer(root, "p1").write(rows(2, pid=1), {0: "x"})
    assert len(load(root / "meta.json")) == 2


def test_samples_the_sampler_reader_refuses_keep_their_raw_bytes(tmp_path):
    """The raw-samples fallback (rundir/reader.py _read_samples): samples of a newer format
    than this maxinstr reads leave the run's stages readable; the layout and bytes are kept,
    and a note says why."""
    root = new_run(tmp_path)
    w = writer(root, "p1")
    w.write(rows(3), {0: "step"})
    w.close(status="closed")
    layout = {"format": "maxinstr-samples", "version": 99, "row": {}}
    (root / "parts" / "p1" / SAMPLES_LAYOUT_FILE).write_text(json.dumps(layout))
    (root / "parts" / "p1" / SAMPLES_FILE).write_bytes(b"\x01" * 24)
    run = load(root)
    assert len(run) == 3
    assert run.samples["p1"] == {"layout": layout, "raw": b"\x01" * 24}
    assert any("samples not read (RunDirError" in n and n.endswith("raw bytes kept") for n in run.notes), run.notes
