"""Property test: whatever bytes the files of a run directory hold, ``load`` returns a Run or
raises a one-line RunDirError naming a file of that directory. Nothing else. And the reading
rule (docs/formats.md "Reading rules"): only a file meaningless as a whole is an error (meta.json,
part.json, a stages.bin with no stage record); damaged rows and lines are skipped and counted in
one note per file, every other stage record is read."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import re

from maxinstr.errors import RunDirError
from maxinstr.rundir import Run, load
from maxinstr.rundir import format as fmt

GOOD_META = json.dumps({"format": "maxinstr-run", "version": 1, "status": "closed", "warmup": 1}).encode()


def _good_rows(n: int) -> bytes:
    r = np.zeros(n, dtype=fmt.STAGE_DTYPE)
    r["id"] = (7 << 32) | np.arange(1, n + 1)
    r["parent_id"] = -1
    r["host_start_ns"] = np.arange(n) * 10
    r["host_end_ns"] = r["host_start_ns"] + 5
    return r.tobytes()


def _mutate(data: bytes, cut: int, flips: list[tuple[int, int]]) -> bytes:
    b = bytearray(data[: max(0, len(data) - cut)] if cut >= 0 else data)
    for pos, val in flips:
        if b:
            b[pos % len(b)] = val
    return bytes(b)


def _with_rows_replaced(n: int, rows: list[tuple[int, bytes]]) -> bytes:
    b = bytearray(_good_rows(n))
    for index, row in rows:
        at = (index % n) * 72
        b[at:at + 72] = row
    return bytes(b)


file_bytes = st.one_of(
    st.binary(max_size=300),
    # some rows of a good stages.bin replaced by random bytes (the new user's damage)
    st.tuples(st.integers(2, 8), st.lists(st.tuples(st.integers(0, 100), st.binary(min_size=72, max_size=72)),
                                          min_size=1, max_size=3)).map(lambda t: _with_rows_replaced(*t)),
    st.tuples(st.integers(0, 6), st.integers(-1, 80), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4)).map(
        lambda t: _mutate(_good_rows(t[0]), t[1], t[2])
    ),
)
# ids that are no int of their column (int32 name ids, int64 record ids): huge, negative, float,
# infinite, not a number; written as JSON text (json.dumps cannot write 1e400)
ODD_IDS = st.sampled_from(["1e400", "-1e400", "NaN", "Infinity", "1.5", "2.0", "-5", str(2**31), str(2**63), str(2**70),
                           f"-{2**63 + 1}", "true", "null", '"3"', "[1]", "{}"])
odd_id_lines = st.lists(
    st.tuples(ODD_IDS, st.sampled_from(['"s": "x"', '"attrs": {"k": 1}'])).map(lambda t: f'{{"id": {t[0]}, {t[1]}}}\n'),
    min_size=1, max_size=3,
).map(lambda xs: "".join(xs).encode())
json_lines = st.one_of(
    st.binary(max_size=200),
    odd_id_lines,
    st.lists(
        st.one_of(
            st.fixed_dictionaries({"id": st.integers(-3, 8), "s": st.text(max_size=5)}),
            st.fixed_dictionaries({"id": st.integers(-3, 8), "attrs": st.dictionaries(st.text(max_size=3), st.integers())}),
            st.just({"id": "x"}),
            st.just([1]),
        ),
        max_size=4,
    ).map(lambda xs: "".join(json.dumps(x) + "\n" for x in xs).encode()),
)
meta_bytes = st.one_of(st.just(GOOD_META), st.binary(max_size=80), st.just(b'{"format": "maxinstr-run", "version": 3}'))


_ROOT = Path(tempfile.mkdtemp(prefix="fuzzrun"))  # one directory, rewritten per example


def _put(path: Path, data: bytes | None) -> None:
    if data is None:
        path.unlink(missing_ok=True)
    else:
        path.write_bytes(data)


def _check(meta, stages, strings, attrs, part_json, events) -> None:
    root = _ROOT
    part = root / "parts" / "p7"
    part.mkdir(parents=True, exist_ok=True)
    _put(root / "meta.json", meta)
    for name, data in (("stages.bin", stages), ("strings.jsonl", strings), ("attrs.jsonl", attrs), ("part.json", part_json), ("events.jsonl", events)):
        _put(part / name, data)
    try:
        run = load(root)
    except RunDirError as exc:
        assert "\n" not in str(exc)
        assert str(exc).startswith(str(root))
        # a whole file is meaningless: never a JSON lines file (a damaged line is skipped), and a
        # stages.bin only when none of its rows is a stage record
        said = str(exc)
        assert said.startswith((f"{root / 'meta.json'}: ", f"{part / 'part.json'}: ", f"{part / 'stages.bin'}: ")), said
        if said.startswith(f"{part / 'stages.bin'}: "):
            assert stages is not None and re.match(rf".*: none of its {len(stages) // 72} row\(s\) is a stage record", said)
        return
    assert isinstance(run, Run)
    assert len(run.stage_names()) == len(run)
    run.warmup_mask()
    for name, data in (("stages.bin", stages), ("strings.jsonl", strings), ("attrs.jsonl", attrs), ("events.jsonl", events)):
        said = [n for n in run.notes if n.startswith(f"{part / name}: ")]
        assert len(said) <= 1, said  # one note per file
        skipped = re.search(r": skipped (\d+) of (\d+) (row|line)\(s\)", said[0]) if said else None
        if name == "stages.bin":
            # every row is read or counted as skipped: none lost silently, none twice
            total = len(stages or b"") // 72
            assert len(run) + (int(skipped[1]) if skipped else 0) == total, (len(run), said)
            assert not skipped or int(skipped[2]) == total
        elif skipped:
            lines = (data or b"").split(b"\n")[:-1]  # the last piece is a torn line, or b""
            assert int(skipped[2]) == sum(1 for line in lines if line.strip()) >= int(skipped[1]) > 0, said


ARGS = dict(
    meta=st.one_of(st.none(), meta_bytes),
    stages=st.one_of(st.none(), file_bytes),
    strings=st.one_of(st.none(), json_lines),
    attrs=st.one_of(st.none(), json_lines),
    part_json=st.one_of(st.none(), st.binary(max_size=40), st.just(b'{"pid": 7}'), st.just(b"[]"), st.just(b'{"pid": "x", "rank": 1e400}'), st.just(b'{"rank": true, "pid": 99999999999999999999999}')),
    events=st.one_of(st.none(), json_lines),
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None,
          derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1")
@given(**ARGS)
def test_load_never_fails_otherwise(meta, stages, strings, attrs, part_json, events):
    _check(meta, stages, strings, attrs, part_json, events)


@pytest.mark.slow
@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck), database=None,
          derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1")
@given(**ARGS)
def test_load_never_fails_otherwise_10k(meta, stages, strings, attrs, part_json, events):
    _check(meta, stages, strings, attrs, part_json, events)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None,
          derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1")
@given(stages=ARGS["stages"], strings=ARGS["strings"], attrs=ARGS["attrs"], events=ARGS["events"])
def test_damaged_part_files_of_a_good_run_are_skipped_and_counted(stages, strings, attrs, events):
    """The same with meta.json and part.json good (most examples above stop at a meta.json that
    is not one): the files with rows and lines, where the skip-and-count rule applies."""
    _check(GOOD_META, stages, strings, attrs, b'{"pid": 7}', events)
