"""The sampler in a child process (MAXINSTR_SAMPLER_GIL=process): same files, own GIL, stops
when told or when the parent dies, falls back to sampling in-process when the child fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from maxinstr.sample import read_samples, start_sampler
from maxinstr.sample.nvml import NVML_LIB_ENV
from maxinstr.sample.process import ProcessSampler
from maxinstr.sample.writer import Sampler


@pytest.fixture
def process_mode(monkeypatch, fake_nvml_lib_path):
    import pynvml

    # this process loads the stand-in too (to see a GPU before starting the child): restore after
    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.delenv("MAXINSTR_SAMPLER_GIL", raising=False)  # process is the default
    monkeypatch.setenv(NVML_LIB_ENV, str(fake_nvml_lib_path))
    monkeypatch.setenv("FAKE_NVML_SPIN_NS", "1000")
    return fake_nvml_lib_path


def _rows_flushed(part: Path) -> int:
    try:
        return len(read_samples(part))
    except Exception:  # noqa: BLE001 - not written yet
        return 0


def test_child_samples_into_the_part_and_stops(process_mode, tmp_path):
    s = start_sampler(tmp_path, 0.01)
    try:
        assert isinstance(s, ProcessSampler) and s.running and s.pid != os.getpid()
        assert [d.info.name for d in s.devices] == ["fake NVML device"] and not s.unavailable
        # 20 rows take 0.2 s at 10 ms; a loaded machine starts the child late (18 of 20 rows after a
        # fixed 0.4 s was seen), so wait for the rows the child has flushed, not for a set time
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _rows_flushed(tmp_path) < 20:
            time.sleep(0.05)
    finally:
        s.stop()
    assert not s.running
    r = read_samples(tmp_path)
    assert r.meta["status"] == "closed" and len(r) >= 20
    assert r.meta["process"] == {"sampler_pid": s.pid, "parent_pid": os.getpid()}
    assert r.meta["pids"] == [os.getpid()]  # this process's memory is what is watched
    assert r.meta["gil"].startswith("auto")  # in the child, holding the GIL stops nobody
    assert r.column("power_w")[0] == pytest.approx(300.0)
    assert sorted(os.listdir(tmp_path)) == ["samples.bin", "samples.json"]  # empty stderr file removed
    s.stop()  # idempotent


def test_child_stops_when_the_parent_dies(process_mode, tmp_path):
    parent = textwrap.dedent(f"""
        import time
        from maxinstr.sample import start_sampler
        s = start_sampler({str(tmp_path)!r}, 0.01)
        print(s.pid, flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    try:
        child = int(p.stdout.readline())
        time.sleep(0.3)
    finally:
        p.kill()
        p.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if json.loads((tmp_path / "samples.json").read_text())["status"] == "closed":
            break
        time.sleep(0.05)
    assert json.loads((tmp_path / "samples.json").read_text())["status"] == "closed"
    for _ in range(100):  # the child exits right after (it is not our child: poll its pid)
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("sampler process still running after its parent died")
    assert len(read_samples(tmp_path)) >= 10


def test_falls_back_to_in_process_when_the_child_fails(process_mode, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", "/bin/false")
    s = start_sampler(tmp_path, 0.01)
    try:
        assert isinstance(s, Sampler)
        [note] = [n for n in s.notes if "process" in n]
        assert "did not start (the sampler process exited with status 1)" in note and "in this process" in note
    finally:
        s.stop()
    assert "sampler-stderr.txt" not in os.listdir(tmp_path)
    assert s.backend.name == "nvml" and s.devices  # sampled here instead


def test_threads_when_asked(process_mode, tmp_path, monkeypatch):
    for mode in ("auto", "release"):
        monkeypatch.setenv("MAXINSTR_SAMPLER_GIL", mode)
        s = start_sampler(tmp_path / mode, 0.01)
        s.stop()
        assert isinstance(s, Sampler) and s.backend.gil.startswith(mode)


def test_child_that_never_answers_is_killed(tmp_path, monkeypatch):
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")  # takes any arguments, says nothing
    hang.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(hang))
    ps = ProcessSampler(tmp_path, 0.01, pids=[os.getpid()], devices=None, flush_interval_s=0.1, ready_timeout_s=0.5)
    t0 = time.monotonic()
    assert not ps.start()
    assert "no answer within 0.5 s" in ps.failure and time.monotonic() - t0 < 5
    assert not ps.running
