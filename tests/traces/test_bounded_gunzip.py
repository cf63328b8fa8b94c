"""Compressed traces are inflated within a bound, and their temporary copies never outlive the
process but for SIGKILL (issue 29, point 3).

A 3 MB Kineto ``.json.gz`` reached 9.3 GB resident before ``MemoryError``; a 4 MB ``.gz`` SQLite
unpacked to 2 GB on disk, and a SIGTERM during that left 653 MB in /tmp. Now a gzip input
inflates to at most ``GUNZIP_RATIO`` times its size (at least ``GUNZIP_FLOOR_BYTES``), said in
one line naming the file, and the temporary database goes on every way out."""
from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from maxinstr.errors import TraceError
from maxinstr.traces import _util, open_trace

DATA = Path(__file__).resolve().parents[1] / "data"


def _bomb(path: Path, head: bytes, inflated: int) -> Path:
    """``head`` then zeros or spaces up to ``inflated`` bytes, gzipped (about 1000:1)."""
    fill = b" " if head.startswith(b"{") else b"\0"
    with gzip.open(path, "wb", compresslevel=6) as fh:
        fh.write(head)
        left = inflated - len(head)
        chunk = fill * (1 << 20)
        while left > 0:
            fh.write(chunk[:left])
            left -= len(chunk)
    return path


@pytest.mark.parametrize("name,head", [
    ("bomb.pt.trace.json.gz", b'{"traceEvents": ['),  # Kineto JSON: was inflated whole in memory
    ("bomb.rpd.gz", b"SQLite format 3\x00"),  # SQLite: was inflated whole into /tmp
    ("bomb_kernel_trace.csv.gz", b"Kind,Agent_Id\n"),  # rocprofv3 CSV: pandas inflated it unbounded
])
def test_a_decompression_bomb_is_one_line_within_the_bound(tmp_path, name, head, monkeypatch):
    """100 MB of zeros in ~100 kB of gzip: past the 64 MiB floor, refused before more is made;
    the temp folder (TMPDIR) is left empty."""
    path = _bomb(tmp_path / name, head, 100 << 20)
    assert path.stat().st_size * _util.GUNZIP_RATIO < _util.GUNZIP_FLOOR_BYTES  # the floor is the bound here
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    with pytest.raises(TraceError, match=r"gzip data inflates past 67\.1 MB \(100 times its .*decompression bombs"):
        open_trace(path)
    assert list(tmp.iterdir()) == []


def test_the_report_of_a_bomb_stays_within_the_bound(tmp_path):
    """The CLI on a bomb: exit 2, one line, and peak memory near the bound (not the 1 GB it inflates to)."""
    path = _bomb(tmp_path / "bomb.json.gz", b'{"traceEvents": [', 1 << 30)
    # VmHWM, the high-water mark of this process's own memory: ru_maxrss also counts the memory
    # of the parent it was forked from, until exec (pytest's, late in a full run)
    prog = textwrap.dedent(f"""
        import sys
        from maxinstr.cli import main
        rc = main(["report", {str(path)!r}])
        hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
        print(hwm, rc)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAXINSTR_")}
    res = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=300, env=env)
    peak_kb, rc = map(int, res.stdout.split()[-2:])
    assert rc == 2 and "inflates past" in res.stderr, res.stderr
    said = [line for line in res.stderr.splitlines() if line.startswith("maxinstr:")]
    assert len(said) == 1 and "inflates past" in said[0], res.stderr
    assert peak_kb * 1024 < 400 << 20, peak_kb  # the old read held the whole GB


@pytest.mark.parametrize("path", sorted((DATA / "kineto").glob("*.gz")) + [DATA / "rocprof" / "rpd" / "mytrace.rpd.gz"],
                         ids=lambda p: p.name)
def test_real_gzip_inputs_inflate_to_what_gzip_says(path):
    out = bytearray()
    n = _util.inflate(path, out.extend)
    assert n == len(out) and bytes(out) == gzip.decompress(path.read_bytes())


def test_several_members_and_padding_read_as_gzip_does(tmp_path):
    path = tmp_path / "multi.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": ') + gzip.compress(b"[]}") + b"\0" * 100)
    out = bytearray()
    _util.inflate(path, out.extend)
    assert bytes(out) == b'{"traceEvents": []}'


@pytest.mark.parametrize("cut", [10, 200, -9])
def test_truncated_or_corrupt_gzip_is_one_line(tmp_path, cut):
    data = gzip.compress(os.urandom(2000) * 20)
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[:cut] if cut > 0 else data[:cut] + b"garbage!!")
    with pytest.raises(TraceError, match="gzip data"):
        _util.inflate(path, lambda b: None)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_while_inflating_leaves_no_temp_copy(tmp_path, sig):
    """The signal arrives after the first MB is written to the temp database (deterministic: the
    sink sends it); the process ends by it and the temp folder is gone."""
    src = DATA / "rocprof" / "rpd" / "mytrace.rpd.gz"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    prog = textwrap.dedent(f"""
        import os, signal
        from maxinstr.traces import _util
        real = _util.inflate
        def inflate(path, sink):
            def first(chunk):
                sink(chunk)
                os.kill(os.getpid(), {int(sig)})
            return real(path, first)
        _util.inflate = inflate
        from maxinstr.cli import main
        raise SystemExit(main(["report", {str(src)!r}]))
    """)
    env = {**os.environ, "TMPDIR": str(tmp)}
    res = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 128 + sig, res.stderr  # ended by the signal, as the shell says it
    assert list(tmp.iterdir()) == [], res.stderr
