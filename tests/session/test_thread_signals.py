"""maxinstr's own threads block the terminating signals, so a process-directed SIGTERM goes to a
thread of the program (Python runs handlers on its main thread only; the flusher, a Python thread,
could take the signal while the main thread waited in C)."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import pytest

import maxinstr

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")


def _blocked(thread: threading.Thread) -> set[int]:
    for line in Path(f"/proc/self/task/{thread.native_id}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            mask = int(line.split()[1], 16)
            return {s for s in range(1, 65) if mask >> (s - 1) & 1}
    raise AssertionError("no SigBlk line")


def test_the_flusher_leaves_terminating_signals_to_the_program(tmp_path):
    with maxinstr.session(tmp_path / "run", sample_hz=0):
        with maxinstr.stage("s"):
            pass
        ours = [t for t in threading.enumerate() if t.name == "maxinstr-flusher"]
        assert ours, [t.name for t in threading.enumerate()]
        for t in ours:
            assert {signal.SIGTERM, signal.SIGHUP, signal.SIGINT} <= _blocked(t), t.name
        assert signal.SIGTERM not in _blocked(threading.main_thread())  # the program's own mask is untouched
