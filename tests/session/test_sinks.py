"""The sinks a session hands drained records to (maxinstr/record/sinks.py), and their fallbacks:
the native writer that cannot start (the Python writer takes over, said once), a batch a sink
raises on (counted as dropped), the in-memory sink's bound."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import maxinstr
from maxinstr.record import process
from maxinstr.record import session as sess
from maxinstr.record.sinks import MemorySink, NativeSink, PythonSink
from maxinstr.rundir import format as fmt


def _rows(n: int) -> np.ndarray:
    r = np.zeros(n, dtype=fmt.STAGE_DTYPE)
    r["id"] = np.arange(1, n + 1)
    r["parent_id"] = -1
    r["host_start_ns"] = 100 * np.arange(n)
    r["host_end_ns"] = r["host_start_ns"] + 50
    return r


def test_memory_sink_keeps_up_to_its_bound_and_plain_attrs():
    sink = MemorySink(3)
    sink.write(_rows(2), {0: "a"}, [(1, {"x": np.int64(4)})])
    sink.write(_rows(2), {0: "a"}, [])
    sink.count_unwritten(5)
    assert sink.rows == 3 and sink.dropped == 1 + 5
    assert sink.attrs == {1: {"x": 4}} and type(sink.attrs[1]["x"]) is int
    run = sink.to_run({0: "a"}, warmup=1, user={"k": "v"}, native_dropped=0)
    assert len(run) == 3 and run.meta["status"] == "memory" and run.meta["user"] == {"k": "v"}
    assert run.names.tolist() == ["a"] and any("6 record(s) dropped" in n for n in run.notes)
    assert sink.settle(wait=True) is None  # nothing to wait for


def test_a_native_writer_that_cannot_start_leaves_the_python_writer(tmp_path, native, stage, monkeypatch):
    """The fallback of Session._start_native_writer: a writer thread or file that cannot be
    created must not lose the run; the Python flusher writes the records, said once."""
    if not hasattr(native, "writer_start"):
        pytest.skip("this core has no native writer")

    def refuse(*args, **kwargs):
        raise OSError(24, "Too many open files")

    monkeypatch.delenv("MAXINSTR_NATIVE_WRITER", raising=False)
    monkeypatch.setattr(native, "writer_start", refuse)
    monkeypatch.setattr(sess, "_SAID", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with maxinstr.session(tmp_path / "run", sample_hz=0) as s:
            assert type(s.sink) is PythonSink
            for i in range(5):
                with stage("work", step=i):
                    pass
        with maxinstr.session(tmp_path / "run2", sample_hz=0):
            pass
    said = [str(w.message) for w in caught if "the native writer did not start" in str(w.message)]
    assert len(said) == 1 and "OSError" in said[0] and "Too many open files" in said[0], said
    run = maxinstr.load(tmp_path / "run")
    assert run["step"].tolist() == list(range(5))
    writer = run.parts[0]["writer"]
    assert writer["kind"] == "python" and writer["why"].startswith("the native writer did not start (OSError")
    assert any("the Python flusher writes the stage records" in e["message"] for e in run.events)


def test_the_native_sink_says_python_until_its_thread_runs(tmp_path, native):
    from maxinstr.rundir.writer import PartWriter

    part = PartWriter(tmp_path / "p1", {"part": "p1"})
    sink = NativeSink(part, native, fsync_interval_s=1.0)
    assert sink.state == "pending" and sink.info == {"kind": "python"} and sink.settle(wait=True) is None


def test_a_batch_the_sink_raises_on_is_counted_not_raised(tmp_path, native, stage, monkeypatch):
    """process._drain: a sink that raises (a bug, a value nothing encodes) must not reach the
    program; its rows are counted where the run says what was dropped."""
    monkeypatch.setenv("MAXINSTR_NATIVE_WRITER", "0")
    with maxinstr.session(tmp_path / "run", sample_hz=0) as s:
        real_write = s.sink.write

        def broken(rows, names, attrs):
            if len(rows):
                raise ValueError("cannot encode")
            real_write(rows, names, attrs)

        monkeypatch.setattr(s.sink, "write", broken)
        for _ in range(4):
            with stage("lost"):
                pass
        s.flush()
        monkeypatch.setattr(s.sink, "write", real_write)
    part = json.loads(next((tmp_path / "run" / "parts").glob("*/part.json")).read_text())
    assert part["rows_dropped_disk"] == 4
    run = maxinstr.load(tmp_path / "run")
    assert len(run) == 0 and any("4 record(s) not written: ValueError: cannot encode" in e["message"]
                                 for e in run.events)


def test_outside_any_session_records_go_to_the_process_memory(native, stage):
    with stage("free"):
        pass
    with process.PROCESS.lock:
        process.flush_locked(process.PROCESS)
    assert process.PROCESS.memory.rows == 1
