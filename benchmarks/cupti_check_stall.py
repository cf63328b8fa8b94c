"""How long the kernels=True fast-path check keeps the program's thread waiting (no GPU needed).

    python benchmarks/cupti_check_stall.py [--records 2000] [--rows 1000,128]

The collector trusts its numpy reading of CUPTI's buffers only after it read the session's first
``FAST_CHECK_ROWS`` records both ways, once through cupti-python's record objects (``from_ptr``),
which hold the GIL for tens of microseconds each. On the H200 (2026-12-04) the 1,000-record check
stalled the MAX decoder's main thread ~90 ms, once, mid-run. Here the collector's flusher-side
conversion runs in a thread on one buffer of zeroed kernel records (real cupti-python objects over
it) while the main thread runs tiny steps that each release and retake the GIL (as a program's
calls into native code do), timestamping each; printed per setting: the check's length, the time
the main thread lost in gaps over 0.2 ms (its stall) and its longest gap, against no check
(medians over repeats, the settings interleaved in a rotated order).
``--rows R:S`` checks R records in slices of S (``1000:1000000`` is the collector before
2026-12-04: one slice).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np

from harness import interleave


def _collector():
    from cupti import cupti as c

    from maxinstr.kernels.convert import Converter

    return Converter(c), c


def _buffer(c, n: int) -> tuple[bytes, np.ndarray]:
    dt = c.activity_kernel10_dtype
    size = (dt.itemsize + 7) // 8 * 8
    raw = np.zeros(n * size, np.uint8)
    kinds = raw.view("<i4")
    kinds[np.arange(n) * (size // 4)] = int(c.ActivityKind.CONCURRENT_KERNEL)
    return raw.tobytes(), np.arange(n, dtype=np.int64) * size


def stall(rows: int | None, slice_rows: int, records: int) -> tuple[float, float, float]:
    """One conversion: (check ms, main-thread time lost in gaps > 0.2 ms, longest gap ms);
    rows=None: no check."""
    from maxinstr.kernels import convert as mc

    col, c = _collector()
    data, offs = _buffer(c, records)
    if rows is None:
        col.fast = True
    else:
        mc.FAST_CHECK_ROWS, mc.FAST_CHECK_SLICE = rows, slice_rows
    done = threading.Event()
    took = [0.0]

    def work() -> None:
        t0 = time.perf_counter()
        col.convert(data, offs)
        took[0] = time.perf_counter() - t0
        done.set()

    last, worst, lost_s = time.perf_counter(), 0.0, 0.0
    t = threading.Thread(target=work)
    t.start()
    while not done.is_set():
        time.sleep(0)  # a call into native code: the GIL goes and must be taken back
        now = time.perf_counter()
        gap = now - last
        worst = max(worst, gap)
        lost_s += gap if gap > 2e-4 else 0.0
        last = now
    t.join()
    return took[0] * 1e3, lost_s * 1e3, worst * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--rows", default="1000:1000000,128:16", help="ROWS:SLICE settings to compare")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    from maxinstr.kernels import convert as mc

    print(f"one buffer of {a.records} kernel records; FAST_CHECK_SLICE {mc.FAST_CHECK_SLICE}; "
          f"median of {a.repeats}; switch interval {1e3 * __import__('sys').getswitchinterval():.0f} ms")
    settings: dict[str, tuple[int | None, int]] = {"no check (fast path trusted)": (None, 0)}
    for spec in a.rows.split(","):
        rows, _, sl = spec.partition(":")
        settings[f"check {rows} records, slices {sl}"] = (int(rows), int(sl or mc.FAST_CHECK_SLICE))
    runs = interleave(list(settings), a.repeats, lambda name, _r: stall(*settings[name], a.records))
    line = "  {:28s} conversion {:6.1f} ms, main thread lost {:6.1f} ms, longest gap {:5.1f} ms"
    for name, rs in runs.items():
        print(line.format(name, *(statistics.median(x) for x in zip(*rs))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
