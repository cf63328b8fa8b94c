"""Sessions in one process: the run directory they write, meta.json, warm-up and the
capture trigger, nesting, closing twice, stages outside sessions, the sampler hook, and an
unwritable directory."""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import maxinstr
from maxinstr import config
from maxinstr.record import process
from maxinstr.record import session as sess
from maxinstr.record.sinks import MemorySink
from maxinstr.rundir import format as fmt
from maxinstr.rundir.writer import RunDirWarning


def meta_of(path: Path) -> dict:
    return json.loads((path / "meta.json").read_text())


def test_session_writes_a_run_directory(tmp_path, native, stage, mark, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("MAXINSTR_SOMETHING", "x")
    monkeypatch.setenv("NCCL_SECRET_TOKEN", "hunter2")
    monkeypatch.delenv("RANK", raising=False)
    run_dir = tmp_path / "run"
    with maxinstr.session(run_dir, warmup=1, dtype="bf16", checkpoint="llama-8b", flags=["--fast"]) as s:
        assert meta_of(run_dir)["status"] == "running"
        for i in range(3):
            with stage("decode", step=i, layer=i):
                with stage("attn"):
                    pass
                mark("tick")
    assert s.part == f"p{os.getpid()}"
    meta = meta_of(run_dir)
    assert meta["format"] == "maxinstr-run" and meta["version"] == 1
    assert meta["status"] == "closed" and meta["warmup"] == 1
    assert meta["user"] == {"dtype": "bf16", "checkpoint": "llama-8b", "flags": ["--fast"]}
    assert meta["cwd"] == os.getcwd() and meta["command"]
    assert meta["maxinstr"] == maxinstr.__version__ and meta["python"]
    assert meta["git"] is None or len(meta["git"]["commit"]) == 40
    assert meta["env"]["CUDA_VISIBLE_DEVICES"] == "0,1" and meta["env"]["NCCL_DEBUG"] == "INFO"
    assert meta["env"]["MAXINSTR_SOMETHING"] == "x" and "NCCL_SECRET_TOKEN" not in meta["env"]
    assert meta["clock"]["host"] == "CLOCK_MONOTONIC"
    assert meta["session"]["start_ns"] < meta["session"]["end_ns"]

    part = run_dir / "parts" / s.part
    info = json.loads((part / "part.json").read_text())
    assert info["pid"] == os.getpid() and info["status"] == "closed" and info["rows_written"] == 9

    run = maxinstr.load(run_dir)
    assert run.notes == []
    assert run["name"].tolist() == ["decode", "attn", "tick"] * 3
    assert run["depth"].tolist() == [0, 1, 1] * 3
    assert run["step"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert np.all(run["id"] >> 32 == os.getpid())
    decode = run.stages[run["name"] == "decode"]
    assert np.all(run.stages[run["name"] == "attn"]["parent_id"] == decode["id"])
    assert [run.attrs[i] for i in decode["id"].tolist()] == [{"layer": 0}, {"layer": 1}, {"layer": 2}]
    assert run.warmup_mask().tolist() == [True, True, False] + [False] * 6
    assert (run["flags"][run["name"] == "tick"] & fmt.MARK).all()


def test_records_reach_disk_while_the_session_runs(tmp_path, native, stage):
    s = maxinstr.session(tmp_path / "run", flush_interval_s=0.02, sample_hz=0)
    s.start()
    try:
        for _ in range(10):
            with stage("a"):
                pass
        stages_bin = tmp_path / "run" / "parts" / s.part / "stages.bin"
        deadline = time.monotonic() + 5
        while stages_bin.stat().st_size < 10 * 72 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stages_bin.stat().st_size == 10 * 72  # flushed without close
        assert len(s.records()) == 10
    finally:
        s.close()


def test_close_twice_and_start_after_close(tmp_path, native):
    s = maxinstr.session(tmp_path / "run", sample_hz=0).start()
    assert s.start() is s  # idempotent while open
    s.close()
    first = (tmp_path / "run" / "meta.json").read_bytes()
    s.close()  # does nothing
    assert (tmp_path / "run" / "meta.json").read_bytes() == first
    with pytest.raises(RuntimeError, match="closed"):
        s.start()


def test_stage_after_session_closed_goes_to_the_memory_session(tmp_path, native, stage):
    with maxinstr.session(tmp_path / "run", sample_hz=0):
        with stage("inside"):
            pass
    with stage("after"):
        pass
    assert maxinstr.load(tmp_path / "run")["name"].tolist() == ["inside"]
    current = maxinstr.current_session()
    assert current.path is None
    assert current.records()["name"].tolist() == ["after"]


def test_stage_open_across_close_lands_where_it_ends(tmp_path, native, stage):
    s = maxinstr.session(tmp_path / "run", sample_hz=0).start()
    st = stage("spans")
    st.__enter__()
    with stage("inside"):
        pass
    s.close()
    st.__exit__(None, None, None)
    assert maxinstr.load(tmp_path / "run")["name"].tolist() == ["inside"]
    assert maxinstr.current_session().records()["name"].tolist() == ["spans"]


def test_memory_session_without_any_directory(native, stage):
    for i in range(4):
        with stage("free", step=i):
            pass
    run = maxinstr.current_session().records()
    assert run.path is None and len(run) == 4
    assert run["step"].tolist() == [0, 1, 2, 3]
    assert len(run.to_pandas()) == 4


def test_memory_session_is_bounded_and_says_so(native, stage, monkeypatch):
    monkeypatch.setattr(process.PROCESS, "memory", MemorySink(5))
    for _ in range(8):
        with stage("x"):
            pass
    run = maxinstr.current_session().records()
    assert len(run) == 5
    assert any("3 record(s) dropped" in n for n in run.notes)


def test_nested_session_joins_the_outer_one(tmp_path, native, stage):
    outer_dir, inner_dir = tmp_path / "outer", tmp_path / "inner"
    with maxinstr.session(outer_dir, sample_hz=0) as outer:
        with pytest.warns(RuntimeWarning, match="recorded in the outer run"):
            inner = maxinstr.session(inner_dir, warmup=3, note="inner").start()
        assert maxinstr.current_session() is inner
        with stage("in-inner"):
            pass
        inner.close()
        inner.close()
        assert maxinstr.current_session() is outer
        with stage("in-outer"):
            pass
    assert not inner_dir.exists()
    run = maxinstr.load(outer_dir)
    assert run["name"].tolist() == ["in-inner", "in-outer"]
    nested = run.meta["nested_sessions"]
    assert len(nested) == 1 and nested[0]["requested_path"] == str(inner_dir)
    assert nested[0]["user"] == {"note": "inner"} and nested[0]["end_ns"] > nested[0]["start_ns"]
    assert run.meta["warmup"] == 0  # the outer session's settings stand


def test_run_dir_env_redirects_and_adopts_the_scripts_session(tmp_path, native, stage, monkeypatch):
    run_dir = tmp_path / "from-env"
    monkeypatch.setenv(config.RUN_DIR, str(run_dir))
    auto = sess.ensure_env_session()
    assert auto is not None and auto.path == run_dir
    assert sess.ensure_env_session() is auto
    with maxinstr.session("runs/asked", warmup=2, dtype="fp8"):
        with stage("s"):
            pass
    assert not auto.closed  # the run goes on until the process ends
    auto.close()
    meta = meta_of(run_dir)
    assert meta["warmup"] == 2 and meta["user"] == {"dtype": "fp8"}
    assert meta["requested_path"] == "runs/asked"
    assert not Path("runs/asked").exists()
    assert maxinstr.load(run_dir)["name"].tolist() == ["s"]


def test_run_dir_env_without_bootstrap(tmp_path, native, monkeypatch):
    monkeypatch.setenv(config.RUN_DIR, str(tmp_path / "env"))
    with maxinstr.session(tmp_path / "asked", sample_hz=0):
        pass
    assert meta_of(tmp_path / "env")["requested_path"] == str(tmp_path / "asked")
    assert not (tmp_path / "asked").exists()


def test_session_sets_and_restores_the_child_env(tmp_path, native, monkeypatch):
    monkeypatch.delenv(config.SESSION_DIR, raising=False)
    with maxinstr.session(tmp_path / "run", sample_hz=0):
        assert os.environ[config.SESSION_DIR] == str(tmp_path / "run")
        assert os.environ[config.SESSION_PID] == str(os.getpid())
    assert config.SESSION_DIR not in os.environ


def test_warmup_starts_the_capture_once_at_steady_state(tmp_path, native, stage, monkeypatch):
    calls = []
    monkeypatch.setenv(config.CAPTURE, "nsys")
    monkeypatch.setattr(native, "profiler_start", lambda: calls.append("start") or True, raising=False)
    monkeypatch.setattr(native, "profiler_stop", lambda: calls.append("stop") or True, raising=False)
    with maxinstr.session(tmp_path / "run", warmup=2, sample_hz=0, flush_interval_s=60):
        for _ in range(2):
            with stage("step"):
                with stage("inner"):
                    pass
        assert calls == []  # the warm-up's instances: no capture yet
        with stage("step"):  # the first that can be steady: the capture starts as it enters
            assert calls == ["start"]
        for _ in range(2):
            with stage("step"):
                pass
    assert calls == ["start", "stop"]
    meta = meta_of(tmp_path / "run")
    run = maxinstr.load(tmp_path / "run")
    step = run.stages[run["name"] == "step"]
    assert meta["steady_state"]["name"] == "step"
    assert step["host_end_ns"][1] <= meta["steady_state"]["start_ns"] <= meta["capture"]["start_ns"] < step["host_start_ns"][2]
    assert meta["capture"]["started"] is True and meta["capture"]["stop_ns"] > meta["capture"]["start_ns"]


def test_warmup_zero_starts_capture_at_session_start(tmp_path, native, monkeypatch):
    calls = []
    monkeypatch.setenv(config.CAPTURE, "1")
    monkeypatch.setattr(native, "profiler_start", lambda: calls.append("start") or False, raising=False)
    monkeypatch.setattr(native, "profiler_stop", lambda: calls.append("stop") or False, raising=False)
    with maxinstr.session(tmp_path / "run", sample_hz=0):
        assert calls == ["start"]
    assert calls == ["start"]  # never started (no profiler attached): nothing to stop
    assert meta_of(tmp_path / "run")["capture"]["started"] is False


def test_no_capture_without_the_env(tmp_path, native, stage, monkeypatch):
    monkeypatch.delenv(config.CAPTURE, raising=False)
    monkeypatch.setattr(native, "profiler_start", lambda: pytest.fail("profiler_start called"), raising=False)
    with maxinstr.session(tmp_path / "run", warmup=1, sample_hz=0):
        with stage("a"):
            pass
    assert "capture" not in meta_of(tmp_path / "run")


def test_sampler_hook(tmp_path, native, monkeypatch):
    import maxinstr.sample as sample

    started = []

    class Handle:
        def stop(self):
            started.append("stop")

    def fake_start(part_dir, interval_s):
        started.append((Path(part_dir), interval_s))
        return Handle()

    monkeypatch.setattr(sample, "start_sampler", fake_start)
    with maxinstr.session(tmp_path / "run", sample_hz=50) as s:
        assert started == [(tmp_path / "run" / "parts" / s.part, 0.02)]
    assert started[-1] == "stop"
    started.clear()
    with maxinstr.session(tmp_path / "run2", sample_hz=0):
        pass
    assert started == []


def test_broken_sampler_never_breaks_a_session(tmp_path, native, stage, monkeypatch):
    import maxinstr.sample as sample

    def broken(part_dir, interval_s):
        raise RuntimeError("no GPU library")

    monkeypatch.setattr(sample, "start_sampler", broken)
    with maxinstr.session(tmp_path / "run"):
        with stage("a"):
            pass
    run = maxinstr.load(tmp_path / "run")
    assert len(run) == 1
    assert any("sampler not started: RuntimeError: no GPU library" in e["message"] for e in run.events)


def test_unwritable_directory_warns_once_and_keeps_running(tmp_path, native, stage):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with maxinstr.session(blocker / "run", sample_hz=0) as s:
            for _ in range(3):
                with stage("a"):
                    pass
            records = s.records()
    ours = [c for c in caught if issubclass(c.category, RunDirWarning)]
    assert len(ours) == 1, [str(c.message) for c in caught]
    assert "cannot write run directory" in str(ours[0].message)
    assert len(records) == 3  # kept in memory instead


def test_session_keeps_user_signal_handlers(tmp_path, native):
    import signal

    def mine(signum, frame):
        pass

    old = signal.signal(signal.SIGTERM, mine)
    try:
        with maxinstr.session(tmp_path / "run", sample_hz=0):
            assert signal.getsignal(signal.SIGTERM) is process.on_signal
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, old)


def test_meta_and_part_keys_are_documented(tmp_path, native, stage, monkeypatch):
    """docs/formats.md stays exact: every key a session writes is in its documented example."""
    import re

    doc = (Path(__file__).parents[2] / "docs" / "formats.md").read_text()
    meta_block = doc.split("### meta.json")[1].split("```json")[1].split("```")[0]
    part_block = doc.split("### part.json and events.jsonl")[1].split("```json")[1].split("```")[0]
    documented_meta = set(re.findall(r'"(\w+)":', meta_block))
    documented_part = set(re.findall(r'"(\w+)":', part_block))
    monkeypatch.setenv(config.CAPTURE, "1")
    with maxinstr.session(tmp_path / "run", sample_hz=0, warmup=1) as s:
        with pytest.warns(RuntimeWarning):
            maxinstr.session(tmp_path / "other").start().close()
        for _ in range(2):
            with stage("a"):
                pass
    meta = meta_of(tmp_path / "run")
    assert set(meta) - documented_meta == set()
    for key in ("clock", "session", "steady_state", "capture"):
        assert set(meta[key]) - documented_meta == set(), key
    assert set(meta["nested_sessions"][0]) - documented_meta == set()
    part = json.loads((tmp_path / "run" / "parts" / s.part / "part.json").read_text())
    assert set(part) - documented_part == set()


def test_reopening_a_path_replaces_the_previous_run(tmp_path, native, stage, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    with maxinstr.session(run_dir, sample_hz=0):
        with stage("first"):
            pass
    (run_dir / "parts" / "p1").mkdir()  # a part of some older process
    with maxinstr.session(run_dir, sample_hz=0):
        with stage("second"):
            pass
    run = maxinstr.load(run_dir)
    assert run["name"].tolist() == ["second"] and len(run.parts) == 1
    assert (run_dir / "notes.txt").read_text() == "mine"


def _capture_calls(native, monkeypatch):
    calls = []
    monkeypatch.setenv(config.CAPTURE, "1")
    monkeypatch.setattr(native, "profiler_start", lambda: calls.append("start") or True, raising=False)
    monkeypatch.setattr(native, "profiler_stop", lambda: calls.append("stop") or True, raising=False)
    return calls


def test_maxinstr_run_capture_waits_for_the_scripts_warmup(tmp_path, native, stage, monkeypatch):
    calls = _capture_calls(native, monkeypatch)
    monkeypatch.setenv(config.RUN_DIR, str(tmp_path / "run"))
    monkeypatch.delenv(config.WARMUP, raising=False)
    auto = sess.ensure_env_session()
    assert calls == []  # warm-up unknown yet: no capture at start-up
    with maxinstr.session("runs/x", warmup=2):
        assert calls == []
        for _ in range(3):
            with stage("step"):
                pass
        assert calls == ["start"]
    auto.close()
    meta = meta_of(tmp_path / "run")
    assert meta["warmup"] == 2 and meta["steady_state"]["name"] == "step"
    assert calls == ["start", "stop"]


def test_maxinstr_run_without_any_session_captures_from_the_first_stage(tmp_path, native, stage, monkeypatch):
    calls = _capture_calls(native, monkeypatch)
    monkeypatch.setenv(config.RUN_DIR, str(tmp_path / "run"))
    monkeypatch.delenv(config.WARMUP, raising=False)
    auto = sess.ensure_env_session()
    assert calls == []
    with stage("only"):
        assert calls == ["start"]  # warm-up 0: the capture starts as the first stage enters
    auto.close()
    meta = meta_of(tmp_path / "run")
    run = maxinstr.load(tmp_path / "run")
    assert meta["warmup"] == 0 and meta["steady_state"]["name"] == "only"
    assert meta["session"]["start_ns"] < meta["steady_state"]["start_ns"] < int(run["host_start_ns"][0])


def test_maxinstr_run_warmup_flag_wins(tmp_path, native, stage, monkeypatch):
    calls = _capture_calls(native, monkeypatch)
    monkeypatch.setenv(config.RUN_DIR, str(tmp_path / "run"))
    monkeypatch.setenv(config.WARMUP, "3")
    auto = sess.ensure_env_session()
    with maxinstr.session("runs/x", warmup=1):
        for _ in range(3):
            with stage("step"):
                pass
        assert calls == []
        with stage("step"):
            pass
        assert calls == ["start"]
    auto.close()
    meta = meta_of(tmp_path / "run")
    assert meta["warmup"] == 3 and meta["nested_sessions"][0]["warmup"] == 1


def test_session_closed_from_another_thread_keeps_signal_chaining(tmp_path, native):
    import signal
    import threading

    seen = []

    def mine(signum, frame):
        seen.append(signum)

    old = signal.signal(signal.SIGTERM, mine)
    try:
        s = maxinstr.session(tmp_path / "run", sample_hz=0).start()
        t = threading.Thread(target=s.close)
        t.start()
        t.join()
        # ours could not be removed off the main thread: it must still reach the program's handler
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert seen == [signal.SIGTERM]
        with maxinstr.session(tmp_path / "run2", sample_hz=0):
            pass
        assert signal.getsignal(signal.SIGTERM) is mine  # restored once a main-thread close could
    finally:
        signal.signal(signal.SIGTERM, old)


@pytest.mark.parametrize("rank, local_rank, part_rank, part_local_rank, samples", [
    ("2", "1", 2, 1, False), (" 1 ", " 0 ", 1, 0, True), ("x", "x", None, None, True),
    ("-1", "-1", None, None, True), ("", "", None, None, True),
])  # fmt: skip
def test_one_rank_rule_for_the_part_its_json_the_records_and_the_sampler(tmp_path, native, stage, monkeypatch, rank,
                                                                        local_rank, part_rank, part_local_rank, samples):
    """RANK is read once (maxinstr.config.rank): a value that is not a whole number >= 0 names no rank
    everywhere alike (part p<pid>, part.json rank null, records' rank -1, meta.json written as by a
    single process); LOCAL_RANK by the same rule decides the one sampler per host."""
    import maxinstr.sample as sample

    started = []

    class Handle:
        def stop(self):
            pass

    monkeypatch.setattr(sample, "start_sampler", lambda part_dir, interval_s: started.append(part_dir) or Handle())
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.setenv("WORLD_SIZE", "4")
    pid = os.getpid()
    with maxinstr.session(tmp_path / "run", sample_hz=50) as s:
        with stage("a"):
            pass
    assert s.part == (f"p{pid}" if part_rank is None else f"r{part_rank}.p{pid}")
    info = json.loads((tmp_path / "run" / "parts" / s.part / "part.json").read_text())
    assert (info["rank"], info["local_rank"], info["world_size"]) == (part_rank, part_local_rank, 4)
    assert (tmp_path / "run" / "meta.json").is_file()
    assert bool(started) is samples
    with stage("b"):  # no session open: the in-memory one keeps it, with the same rank
        pass
    memory = sess.current_session().records()
    assert memory["rank"].tolist() == [-1 if part_rank is None else part_rank]
