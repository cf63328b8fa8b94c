"""Whatever a user passes as a stage name or attr is recorded (escaped) or counted, and nothing
raises (issue 20, class 2); attrs are data, not references to the user's objects (class 6).

Property tests run sessions with both writers (the core's native writer and the Python
flusher, ``MAXINSTR_NATIVE_WRITER=0``) and compare what ``load`` reads back with
``maxinstr._attrs.plain`` of what was passed (as JSON writes and reads it)."""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import tempfile
import warnings
import weakref
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import maxinstr
from maxinstr._text import safe_name
from maxinstr._attrs import MAX_STR, plain
from maxinstr.rundir.writer import json_line


class BadStr:
    def __str__(self):
        raise RuntimeError("no str for you")


class Payload:
    """A weak-referenceable stand-in for a big object (a tensor, a model)."""

    def __init__(self, nbytes: int = 1 << 16) -> None:
        self.data = bytearray(nbytes)


def _cycle():
    a: list = [1]
    a.append(a)
    return a


surrogate_text = st.text(alphabet=st.one_of(st.characters(codec="utf-8"), st.sampled_from(["\udcff", "\ud800", "\x00"])),
                         max_size=12)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.builds(lambda: 10**5000), st.floats(allow_nan=True, allow_infinity=True),
    surrogate_text, st.binary(max_size=8), st.builds(BadStr), st.builds(object), st.builds(_cycle),
    st.builds(lambda: os.fsdecode(b"data-\xff\xfe.bin")),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.tuples(inner, inner),
        st.dictionaries(st.one_of(surrogate_text, st.integers(), st.none(), st.tuples(st.integers())), inner, max_size=3),
    ),
    max_leaves=8,
)
attrs_st = st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True).filter(
    lambda k: k not in ("stream", "gpu", "step")), values, min_size=1, max_size=3)


def _expected(attrs: dict) -> dict:
    return json.loads(json_line(plain(attrs)))


def _same(a, b) -> bool:
    # NaN != NaN: compare as JSON text
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


_ROOT = Path(tempfile.mkdtemp(prefix="maxinstr-attrs-"))


def _record(writer: str, names: list[str], attrs_list: list[dict]):
    os.environ["MAXINSTR_NATIVE_WRITER"] = "1" if writer == "native" else "0"
    run_dir = _ROOT / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    ids = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: every value is recordable
        with maxinstr.session(run_dir, sample_hz=0):
            for i, (name, attrs) in enumerate(zip(names, attrs_list)):
                with maxinstr.stage(name, step=i, **attrs) as st_:
                    ids.append(st_.id)
            maxinstr.mark(names[0], **attrs_list[0])
    return maxinstr.load(run_dir), ids


@pytest.fixture(params=["native", "python"])
def writer(request, native, monkeypatch):
    if request.param == "native" and (getattr(native, "__fake__", False) or not hasattr(native, "writer_start")):
        pytest.skip("no native writer in this core")
    monkeypatch.setenv("MAXINSTR_NATIVE_WRITER", "1")  # restored after the test
    return request.param


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None,
          derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1")
@given(names=st.lists(st.one_of(surrogate_text.filter(bool), st.sampled_from(["decode", "[/]"])), min_size=1, max_size=4),
       attrs_list=st.lists(attrs_st, min_size=4, max_size=4))
def test_any_attr_or_name_is_recorded_and_nothing_raises(writer, names, attrs_list):
    names = (names * 4)[:4]
    run, ids = _record(writer, names, attrs_list)
    assert run.notes == [], run.notes
    assert len(run) == 5  # four stages and a mark: none lost to a value
    assert run.parts[0]["writer"]["kind"] == writer
    by_id = dict(zip(run["id"].tolist(), run["name"].tolist()))
    for rid, name, attrs in zip(ids, names, attrs_list):
        assert by_id[rid] == safe_name(name)  # a lone surrogate as \udcff
        assert _same(run.attrs[rid], _expected(attrs)), (run.attrs[rid], attrs)
    assert all(v.encode() for v in run["name"].tolist())  # every name can be printed and written


def test_fsdecoded_file_names_in_a_big_batch(writer, native):
    """The issue's case: one attr with a lone surrogate among 2,001 stages: nothing dropped."""
    bad = os.fsdecode(b"weights-\xff.bin")
    run_dir = _ROOT / "batch"
    shutil.rmtree(run_dir, ignore_errors=True)
    with maxinstr.session(run_dir, sample_hz=0):
        for i in range(2001):
            with maxinstr.stage("load", step=i, file=bad if i == 1000 else f"w{i}.bin"):
                pass
        with maxinstr.stage(bad):  # the last batch, at close: close() must not raise
            pass
    run = maxinstr.load(run_dir)
    assert len(run) == 2002 and run.notes == []
    assert len(run.attrs) == 2001
    assert run.attrs[int(run["id"][run["step"] == 1000][0])] == {"file": bad}  # read back exactly
    assert "load" in set(run["name"].tolist()) and "weights-\\udcff.bin" in set(run["name"].tolist())


def test_plain_rules():
    out = plain({"a": (1, 2), "b": {(1, 2): 3, None: 1, 2: 2}, "c": BadStr(), "d": "x" * 10, "e": _cycle(),
                 "f": 10**5000, "g": Payload(10)})
    assert out["a"] == [1, 2] and out["b"] == {"(1, 2)": 3, "null": 1, "2": 2}
    assert out["c"] == "<BadStr: str() raised RuntimeError>" and out["d"] == "x" * 10
    assert out["f"].startswith("<int of ")
    assert out["g"].startswith("<") and len(plain({"h": "y" * 5000})["h"]) == 5000  # str data is kept whole
    assert len(plain({"i": Payload(1)})["i"]) <= MAX_STR
    json.dumps(out)  # JSON can hold all of it


# -- class 6: attrs keep no object alive -------------------------------------------------------


def _alive_after(stage, mark, in_session: Path | None) -> int:
    refs = []

    def work():
        for i in range(20):
            obj = Payload()
            refs.append(weakref.ref(obj))
            with stage("load", step=i, tensor=obj, parts=[obj, {"inner": obj}]):
                pass
            mark("loaded", obj=obj)

    if in_session is None:
        work()
    else:
        with maxinstr.session(in_session, sample_hz=0, flush_interval_s=3600):  # no drain while we look
            work()
            gc.collect()
            alive = sum(r() is not None for r in refs)
        return alive
    gc.collect()
    return sum(r() is not None for r in refs)


def test_attrs_keep_no_object_alive_outside_a_session(native, stage, mark):
    if getattr(native, "__fake__", False):
        pytest.skip("the stand-in core keeps attrs as given")
    assert _alive_after(stage, mark, None) == 0
    run = maxinstr.current_session().records()
    assert len(run) == 40
    kept = [a for a in run.attrs.values() if "tensor" in a]
    assert len(kept) == 20 and all(isinstance(a["tensor"], str) and isinstance(a["parts"], list) for a in kept)


def test_attrs_keep_no_object_alive_in_a_session(native, stage, mark, tmp_path):
    if getattr(native, "__fake__", False):
        pytest.skip("the stand-in core keeps attrs as given")
    assert _alive_after(stage, mark, tmp_path / "run") == 0
    run = maxinstr.load(tmp_path / "run")
    assert sum("tensor" in a for a in run.attrs.values()) == 20


def test_a_failing_attrs_hook_drops_and_counts(native, stage, monkeypatch):
    if getattr(native, "__fake__", False):
        pytest.skip("the real core's hook")
    from maxinstr._attrs import plain as real_plain

    def broken(attrs):
        raise RuntimeError("hook bug")

    before = native.stats()["attrs_unconverted"]
    native._set_attrs_hook(broken)
    try:
        with stage("x", obj=object()):
            pass
        with stage("y", n=1):  # simple values never reach the hook
            pass
    finally:
        native._set_attrs_hook(real_plain)
    assert native.stats()["attrs_unconverted"] - before == 1
    _, _, attrs = native.drain(-1)
    assert [a for _, a in attrs] == [{"n": 1}]
    assert sys.exc_info() == (None, None, None)
