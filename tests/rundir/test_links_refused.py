"""Symbolic links planted in a run directory are never written through (issue 29, point 2).

A run directory may be shared, copied or unpacked from anywhere: a link in place of a file
maxinstr writes (``parts/p<pid>/stages.bin -> ~/.bashrc``) or of a folder (``parts ->
/elsewhere``) must not turn maxinstr's writes into writes to the link's target. Each test plants
the link, records or runs, and checks the target's bytes are what they were."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from maxinstr import _files
from maxinstr.rundir import load
from maxinstr.rundir.writer import write_json_atomic

VICTIM_TEXT = b"precious bytes, not a run\n"

RECORD = textwrap.dedent("""
    import os, sys, warnings
    from pathlib import Path
    run = Path(sys.argv[1])
    plant = sys.argv[2]
    victim = sys.argv[3]
    part = run / "parts" / f"p{os.getpid()}"
    if plant == "file":  # the attacker predicted our pid
        part.mkdir(parents=True)
        os.symlink(victim, part / sys.argv[4])
    warnings.simplefilter("always")
    import maxinstr
    with maxinstr.session(str(run)):
        for i in range(50):
            with maxinstr.stage("step", i=i):
                pass
""")


def _record(run: Path, plant: str, victim: Path, name: str = "", native: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAXINSTR_")}
    env["MAXINSTR_NATIVE_WRITER"] = "1" if native else "0"
    return subprocess.run([sys.executable, "-c", RECORD, str(run), plant, str(victim), name], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_bytes(VICTIM_TEXT)
    return path


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("name", ["stages.bin", "strings.jsonl", "attrs.jsonl", "events.jsonl", "samples.bin",
                                  "part.json", "sampler-stderr.txt"])
def test_a_link_in_place_of_a_part_file_is_not_written_through(tmp_path, victim, name, native):
    res = _record(tmp_path / "run", "file", victim, name, native=native)
    assert res.returncode == 0, res.stderr  # the program itself is never broken
    assert victim.read_bytes() == VICTIM_TEXT
    if name in ("stages.bin", "strings.jsonl", "attrs.jsonl", "events.jsonl"):  # the part's own files: said once
        assert "symbolic link inside a run directory" in res.stderr


def test_a_parts_link_of_a_previous_run_is_removed_not_followed(tmp_path):
    """The issue's second case: ``parts -> elsewhere`` in a closed run. The old run is cleared
    (the link goes, its target untouched) and the new part is written in a real parts/."""
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_bytes(VICTIM_TEXT)
    (run / "meta.json").write_text(json.dumps({"format": "maxinstr-run", "version": 1, "status": "closed"}))
    os.symlink(elsewhere, run / "parts")
    res = _record(run, "none", tmp_path / "unused")
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]  # nothing written into the target
    assert (run / "parts").is_dir() and not (run / "parts").is_symlink()
    assert len(load(run)) == 50


def test_a_parts_link_without_a_run_is_refused(tmp_path):
    """No meta.json: nothing is cleared, and the link is not written through either."""
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    os.symlink(elsewhere, run / "parts")
    res = _record(run, "none", tmp_path / "unused")
    assert res.returncode == 0, res.stderr
    assert list(elsewhere.iterdir()) == []
    assert "symbolic link inside a run directory" in res.stderr


def test_the_native_writer_refuses_a_link(tmp_path, victim):
    from maxinstr import _native

    (tmp_path / "stages.bin").symlink_to(victim)
    with pytest.raises(OSError):
        _native.writer_start(str(tmp_path / "stages.bin"), str(tmp_path / "strings.jsonl"))
    assert victim.read_bytes() == VICTIM_TEXT


def test_atomic_json_replaces_a_link_and_never_writes_its_target(tmp_path, victim):
    (tmp_path / "meta.json").symlink_to(victim)
    write_json_atomic(tmp_path / "meta.json", {"a": 1})
    assert victim.read_bytes() == VICTIM_TEXT
    assert not (tmp_path / "meta.json").is_symlink() and json.loads((tmp_path / "meta.json").read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_open_write_refuses_links_and_fifos(tmp_path, victim):
    (tmp_path / "link").symlink_to(victim)
    with pytest.raises(OSError, match="symbolic link inside a run directory"):
        _files.open_write(tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError, match="FIFO"):
        _files.open_write(tmp_path / "fifo")  # returns at once: no reader, no hang
    (tmp_path / "dir").mkdir()
    (tmp_path / "dirlink").symlink_to(tmp_path / "dir")
    with pytest.raises(OSError, match="symbolic link inside a run directory"):
        _files.real_dirs(tmp_path, tmp_path / "dirlink" / "p1")
    assert victim.read_bytes() == VICTIM_TEXT


def test_maxinstr_run_refuses_a_planted_log_link(tmp_path, victim):
    """`maxinstr run -o RUN` where RUN/child.log is a link: one line, nothing started."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "child.log").symlink_to(victim)
    marker = tmp_path / "ran"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAXINSTR_")}
    res = subprocess.run([sys.executable, "-m", "maxinstr", "run", "--profiler", "none", "--no-report", "-o", str(run),
                          "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"], env=env, capture_output=True,
                         text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert res.returncode != 0
    assert "child.log: a symbolic link inside a run directory" in res.stderr
    assert not marker.exists() and victim.read_bytes() == VICTIM_TEXT
