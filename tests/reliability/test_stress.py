"""Many threads x many stages through a live session: every record reaches the run
directory, correctly nested, or the drop is counted (never silent)."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

import maxinstr


def _hammer(tmp_path, stage, threads: int, per_thread: int):
    """per_thread stages per thread: per_thread/2 outer stages each holding one inner."""
    barrier = threading.Barrier(threads)

    def work(t: int) -> None:
        barrier.wait()
        for i in range(per_thread // 2):
            with stage("outer", step=i):
                with stage("inner"):
                    pass

    run_dir = tmp_path / "run"
    t0 = time.perf_counter()
    with maxinstr.session(run_dir, sample_hz=0) as s:
        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
    elapsed = time.perf_counter() - t0
    run = maxinstr.load(run_dir)
    part = json.loads((run_dir / "parts" / s.part / "part.json").read_text())
    return run, part, elapsed


def _check(run, part, threads: int, per_thread: int) -> None:
    dropped = int(part["dropped_records"])
    assert part["rows_dropped_disk"] == 0
    assert len(run) + dropped == threads * per_thread  # nothing vanishes silently
    st = run.stages
    assert len(np.unique(st["id"])) == len(st)
    names = run["name"]
    assert len(np.unique(st["tid"])) == threads or dropped
    outer, inner = st[names == "outer"], st[names == "inner"]
    assert np.all(outer["depth"] == 0) and np.all(outer["parent_id"] == -1)
    assert np.all(inner["depth"] == 1)
    # every inner's parent is an outer on the same thread whose host range contains it
    order = np.argsort(outer["id"])
    pos = np.searchsorted(outer["id"], inner["parent_id"], sorter=order)
    pos = np.clip(pos, 0, len(order) - 1)
    parent = outer[order[pos]]
    found = parent["id"] == inner["parent_id"]
    assert found.sum() >= len(inner) - dropped
    p, c = parent[found], inner[found]
    assert np.all(p["tid"] == c["tid"])
    assert np.all(p["host_start_ns"] <= c["host_start_ns"]) and np.all(c["host_end_ns"] <= p["host_end_ns"])
    assert np.all(c["step"] == p["step"])  # inherited
    # per thread, the steps of the outer stages are 0..n-1 in order
    for tid in np.unique(outer["tid"]):
        steps = outer["step"][outer["tid"] == tid]
        if not dropped:
            assert steps.tolist() == list(range(per_thread // 2))


def test_8_threads_x_10k_stages(tmp_path, native, stage):
    run, part, _ = _hammer(tmp_path, stage, 8, 10_000)
    _check(run, part, 8, 10_000)
    assert part["dropped_records"] == 0


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:maxinstr. the record buffer was full")  # counted and checked below
def test_16_threads_x_100k_stages(tmp_path, native, stage):
    run, part, elapsed = _hammer(tmp_path, stage, 16, 100_000)
    _check(run, part, 16, 100_000)
    writer = part.get("writer", {})
    print(f"16 x 100k stages: {elapsed:.1f} s, {len(run)} records, dropped {part['dropped_records']}, "
          f"writer {writer.get('kind')} (batches {writer.get('batches')}, largest {writer.get('max_batch')})")
    if writer.get("kind") == "native":
        # The writer thread needs no GIL: 16 threads holding it in turn cannot starve it, and
        # it takes the buffer at least every 2 ms. The Python flusher dropped 250k-560k here.
        assert part["dropped_records"] == 0
        assert len(run) == 16 * 100_000


@pytest.mark.parametrize("writer", ["python", "native"])
def test_bounded_buffer_counts_drops(tmp_path, native, stage, monkeypatch, writer):
    """With a tiny native buffer and nothing taking records (the Python flusher asleep, or
    the native writer on a 10 s interval), the overflow is counted and said."""
    if writer == "python":
        monkeypatch.setenv("MAXINSTR_NATIVE_WRITER", "0")
    else:
        if not hasattr(native, "writer_start"):
            pytest.skip("this core has no native writer")
        monkeypatch.delenv("MAXINSTR_NATIVE_WRITER", raising=False)
        monkeypatch.setenv("MAXINSTR_WRITER_INTERVAL_MS", "10000")
    native.set_capacity(1000)
    try:
        monkeypatch.setattr("maxinstr.record.session.DEFAULT_FLUSH_INTERVAL_S", 10.0)
        with maxinstr.session(tmp_path / "run", sample_hz=0, flush_interval_s=10.0) as s:
            time.sleep(0.05)  # let the flusher do its first (empty) drain and go to sleep
            with pytest.warns(RuntimeWarning, match="dropped"):
                for _ in range(3000):
                    with stage("x"):
                        pass
                s.flush()
        run = maxinstr.load(tmp_path / "run")
        part = run.parts[0]
        assert len(run) + part["dropped_records"] == 3000 and part["dropped_records"] >= 2000
        assert any("dropped" in e["message"] for e in run.events)
        assert any("dropped" in n for n in run.notes)
        assert part["writer"]["kind"] == writer
    finally:
        native.set_capacity(1_000_000)
