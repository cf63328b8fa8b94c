"""Property test: whatever bytes the files of a run directory hold, ``load`` returns a Run or
raises a one-line RunDirError naming a file of that directory. Nothing else."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


file_bytes = st.one_of(
    st.binary(max_size=300),
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
        return
    assert isinstance(run, Run)
    assert len(run.stage_names()) == len(run)
    run.warmup_mask()


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
