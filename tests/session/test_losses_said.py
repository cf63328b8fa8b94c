"""Whatever a session loses is counted and said in the report (issue 29, points 5, 6, 7).

- Attrs a write error lost (``ulimit -f``: every row kept, every attr lost, and a warning that
  said "stages are no longer saved"), attrs dropped at close or by a flusher that fell behind,
  attrs that could not be made data: each a count in part.json and a note of the report.
- Ctrl-C while the run is being closed: the close finishes (nothing drained is lost), then
  KeyboardInterrupt; a batch cut off between the drain and the write is counted.
- Close is bounded: attrs still unwritten at the close deadline are counted, not written (the
  time itself is measured in benchmarks/close_under_load.py, not here).
- Depth is an int16: stages nested deeper than 32,767 levels are not recorded, counted, and said
  once, instead of wrapping to a negative depth the reader then skipped.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maxinstr
from maxinstr import _native
from maxinstr.errors import RunDirError
from maxinstr.rundir import format as fmt
from maxinstr.rundir.writer import PartWriter, attrs_line


def _python(tmp_path: Path, body: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(body))
    base = {k: v for k, v in os.environ.items() if not k.startswith("MAXINSTR_")}
    return subprocess.run([sys.executable, str(script), *args], env={**base, **(env or {})}, capture_output=True,
                          text=True, timeout=180)


@pytest.mark.parametrize("native", ["1", "0"])
def test_attrs_lost_to_a_file_size_limit_are_counted_and_said(tmp_path, native):
    """200 stages with a 1 kB attr under `ulimit -f 64 kB`: the rows (14 kB) fit, the attrs
    (200 kB) do not. Every row is kept, the attrs that did not fit are counted and said, and the
    warning no longer claims the stages stopped being saved."""
    res = _python(tmp_path, """
        import resource, signal, sys, maxinstr
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64_000, 64_000))
        with maxinstr.session(sys.argv[1], sample_hz=0):
            for i in range(200):
                with maxinstr.stage("s", i=i, blob="x" * 1000):
                    pass
    """, str(tmp_path / "run"), env={"MAXINSTR_NATIVE_WRITER": native})
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("RunDirWarning") == 1 and "no longer saved" not in res.stderr, res.stderr
    assert "what is not written from now on is counted in part.json and said in the report" in res.stderr
    run = maxinstr.load(tmp_path / "run")
    [part] = run.parts
    if native == "1":
        assert len(run) == 200  # the native writer appends every row: only the attrs are lost
    else:  # the Python path writes a batch's attrs first: the writer stops, later rows are counted too
        assert len(run) + part["rows_dropped_disk"] == 200 and part["rows_dropped_disk"] > 0
        assert f"{part['name']}: {part['rows_dropped_disk']} stage record(s) dropped while recording (the disk " \
               "write failed)" in run.notes
    lost = part["attrs_dropped_disk"]
    assert lost > 100 and lost + len(run.attrs) == 200, (lost, len(run.attrs))
    assert f"{part['name']}: the attrs of {lost} stage record(s) were not written (a disk error, or a file of the " \
           "run directory refused)" in run.notes


def test_ctrl_c_while_closing_finishes_the_close_then_interrupts(tmp_path):
    """SIGINT delivered inside close (at its first flush, so always during it): every row and
    every attr is kept, the run and the part are closed, and the KeyboardInterrupt comes after,
    from close itself, not from inside the drain."""
    res = _python(tmp_path, """
        import os, signal, sys, maxinstr
        from maxinstr.record import process
        real = process.flush_locked
        def flush_locked(proc, **kw):
            if kw.get("block"):
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, now that close has begun
            return real(proc, **kw)
        process.flush_locked = flush_locked
        from maxinstr.record import session
        session.flush_locked = flush_locked
        with maxinstr.session(sys.argv[1], sample_hz=0):
            for i in range(50_000):
                with maxinstr.stage("s", i=i, tag="x" * 20):
                    pass
        print("not reached")
    """, str(tmp_path / "run"))
    assert res.returncode != 0 and "not reached" not in res.stdout
    tail = res.stderr.strip().splitlines()
    assert tail[-1] == "KeyboardInterrupt" and "raise KeyboardInterrupt" in tail[-3], res.stderr
    assert "_drain" not in res.stderr and "frombuffer" not in res.stderr
    run = maxinstr.load(tmp_path / "run")
    assert len(run) == 50_000 and len(run.attrs) == 50_000
    assert run.meta["status"] == "closed" and run.parts[0]["status"] == "closed" and run.notes == []


def test_a_batch_cut_off_between_drain_and_write_is_counted(tmp_path, monkeypatch):
    """A second Ctrl-C (or any exception) after a batch left the core and before it reached the
    files: its rows and attrs are counted in part.json, not lost without a word."""
    from maxinstr.record import process
    from maxinstr.record.sinks import PythonSink

    part = PartWriter(tmp_path / "run" / "parts" / "p1", {"part": "p1"})
    part.open()
    sink = PythonSink(part)

    class Core:
        def resolve(self, block):
            pass

        def drain(self, n):
            rows = np.zeros(3, fmt.STAGE_DTYPE)
            return rows.tobytes(), [], [(1, {"a": 1}), (2, {"a": 2})]

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    class Root:  # the session, as the drain sees it
        closed = False

        def before_drain(self, native):
            pass

        def after_drain(self, rows, *, periodic):
            pass

    monkeypatch.setattr(part, "write", interrupted)
    proc = process.Process()
    proc.root = Root()
    proc.root.sink = sink
    with pytest.raises(KeyboardInterrupt):
        process._drain(proc, Core(), True, False)
    assert part.rows_dropped == 3 and part.attrs_dropped_disk == 2
    part.close()
    info = json.loads((part.part_dir / "part.json").read_text())
    assert info["rows_dropped_disk"] == 3 and info["attrs_dropped_disk"] == 2


def test_attrs_past_the_close_deadline_are_counted_and_said(tmp_path):
    """What close does when its time is up (another thread kept it busy): the attrs left are not
    written, counted as attrs_dropped_close, and said; the rows are all written."""
    root = tmp_path / "run"
    (root / "parts").mkdir(parents=True)
    (root / "meta.json").write_text(json.dumps({"format": "maxinstr-run", "version": 1, "status": "closed"}))
    part = PartWriter(root / "parts" / "p7", {"part": "p7", "pid": 7})
    part.open()
    rows = np.zeros(10, fmt.STAGE_DTYPE)
    rows["id"] = (7 << 32) | np.arange(1, 11)
    rows["host_start_ns"] = np.arange(10) * 100 + 1000
    rows["host_end_ns"] = rows["host_start_ns"] + 50
    rows["parent_id"] = rows["gpu_start_ns"] = rows["gpu_end_ns"] = -1
    part.write(rows[:5], {0: "s"}, [(int(i), {"k": int(i)}) for i in rows["id"][:5]])
    part.deadline = time.monotonic() - 1  # the close's time ran out
    part.write(rows[5:], {0: "s"}, [(int(i), {"k": int(i)}) for i in rows["id"][5:]])
    part.close(status="closed")
    run = maxinstr.load(root)
    assert len(run) == 10 and len(run.attrs) == 5
    assert run.parts[0]["attrs_dropped_close"] == 5
    assert any(n.startswith("p7: the attrs of 5 stage record(s) were still unwritten when the session closed")
               for n in run.notes), run.notes


@pytest.mark.parametrize("field,said", [
    ({"writer": {"kind": "native", "dropped_attrs": 5_600_000}},
     "p7: the attrs of 5600000 stage record(s) were dropped while recording (the Python flusher fell a whole buffer behind"),
    ({"attrs_unconverted": 3}, "p7: the attrs of 3 stage record(s) could not be made data: not kept"),
    ({"depth_refused": 7233}, "p7: 7233 stage(s) and mark(s) nested deeper than 32767 levels were not recorded"),
])
def test_every_loss_part_json_counts_is_a_note(tmp_path, field, said):
    """The issue's 5.6M rows whose attrs were dropped were counted in part.json only."""
    root = tmp_path / "run"
    part = PartWriter(root / "parts" / "p7", {"part": "p7", "pid": 7})
    (root / "meta.json").parent.mkdir(parents=True, exist_ok=True)
    (root / "meta.json").write_text(json.dumps({"format": "maxinstr-run", "version": 1, "status": "closed"}))
    part.open()
    part.close(status="closed", **field)
    notes = maxinstr.load(root).notes
    assert any(n.startswith(said) for n in notes), notes


def test_nesting_deeper_than_the_depth_column_is_refused_counted_and_said_once(tmp_path):
    """40,000 nested stages and a mark at the bottom: 32,768 recorded with their true depth, the
    other 7,233 not recorded (not wrapped to a negative depth and skipped by the reader), one
    warning, one note."""
    res = _python(tmp_path, """
        import sys, maxinstr
        with maxinstr.session(sys.argv[1], sample_hz=0):
            with maxinstr.stage("outer"):
                open_ = []
                for i in range(40_000 - 1):
                    s = maxinstr.stage("nested", i=i)
                    s.__enter__()
                    open_.append(s)
                maxinstr.mark("bottom")
                for s in reversed(open_):
                    s.__exit__(None, None, None)
    """, str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("stages nested deeper than 32767 levels are not recorded") == 1, res.stderr
    run = maxinstr.load(tmp_path / "run")
    assert len(run) == 32_768 and int(run["depth"].max()) == 32_767 and int(run["depth"].min()) == 0
    assert not any("negative depth" in n for n in run.notes)
    [part] = run.parts
    assert part["depth_refused"] == 7_233
    assert f"{part['name']}: 7233 stage(s) and mark(s) nested deeper than 32767 levels were not recorded" in run.notes


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.integers(), st.floats(),
                    st.text(), st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x3000)),
                    st.lists(st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.dictionaries(st.text(), SCALARS, max_size=4)), max_size=8))
def test_the_native_attrs_lines_are_the_python_lines(pairs):
    """The C++ encoder writes exactly the bytes json.dumps does (control characters, quotes,
    surrogates, NaN, 1e+16, -0.0, ints past int64 and lists go to the Python path)."""
    from maxinstr.rundir.writer import attrs_lines

    assert attrs_lines(pairs) == b"".join(attrs_line(r, a) for r, a in pairs) or \
        sorted(attrs_lines(pairs).splitlines()) == sorted(b"".join(attrs_line(r, a) for r, a in pairs).splitlines())
    data, rest = _native.attrs_lines(pairs)
    simple = [p for p in pairs if p not in rest]
    assert data == b"".join(attrs_line(r, a) for r, a in simple)
    for line in data.splitlines():
        json.loads(line)


def test_a_signal_while_the_session_starts_leaves_no_lasting_temporary(tmp_path):
    """SIGTERM while meta.json's temporary file is being written (the signal sent from inside
    the write, so always then): the directory holds only that temporary; the reader says what
    happened, and the next session there removes it (its writer is dead) and records."""
    run = tmp_path / "run"
    res = _python(tmp_path, """
        import os, signal, sys
        from maxinstr.rundir import writer
        real = writer.write_all
        def write_all(fd, data):
            real(fd, data[:10])
            os.kill(os.getpid(), signal.SIGTERM)  # killed mid-write, at session start
        writer.write_all = write_all
        import maxinstr
        with maxinstr.session(sys.argv[1], sample_hz=0):
            pass
    """, str(run))
    assert res.returncode == -15, res.stderr
    left = [p.name for p in run.iterdir()]
    assert len(left) == 1 and left[0].startswith(".meta.json.") and left[0].endswith(".tmp"), left
    with pytest.raises(RunDirError, match="a session was killed while it started"):
        maxinstr.load(run)
    res = _python(tmp_path, """
        import sys, maxinstr
        with maxinstr.session(sys.argv[1], sample_hz=0):
            with maxinstr.stage("s"):
                pass
    """, str(run))
    assert res.returncode == 0, res.stderr
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]
    assert len(maxinstr.load(run)) == 1


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_slow_profiler_stop_at_close_loses_no_attrs(tmp_path, monkeypatch, native):
    """Under `maxinstr run` close first stops the steady capture, and nsys flushes its trace inside
    that call (seconds on the H100 for a 59k-kernel decoder; 49 records' attrs were then dropped as
    late). Close's budget bounds close's own writing, so it counts from after that stop."""
    from maxinstr.record import process, steady

    def slow_stop(self):
        time.sleep(process.CLOSE_BUDGET_S + 0.3)

    monkeypatch.setenv("MAXINSTR_NATIVE_WRITER", native)
    monkeypatch.setattr(steady.SteadyState, "stop_capture", slow_stop)
    with maxinstr.session(tmp_path / "run", sample_hz=0):
        for i in range(50):
            with maxinstr.stage("s", i=i):
                pass
    run = maxinstr.load(tmp_path / "run")
    [part] = run.parts
    assert len(run) == 50 and part.get("attrs_dropped_close", 0) == 0
    assert len(run.attrs) == 50
