"""Where the memory of reading and attributing an nsys export goes: RSS sampled every 2 ms
with the function that was running, plus the peak and its stack.

A thread samples /proc/self/statm and the main thread's frame (no frame is kept between
samples: holding one would keep its locals, i.e. the arrays being measured, alive). Prints a
line whenever RSS moved by 100 MB, the RSS after each phase, and the peak.

    python benchmarks/trace_memory.py /tmp/maxinstr-trace-merge/h200_decode_10M.sqlite

(the 10M file comes from ``benchmarks/trace_merge.py --sizes 10M --keep``). The process's own
peak (``ru_maxrss``) is what ``trace_merge.py`` reports as peak RSS.
"""

from __future__ import annotations

import resource
import sys
import threading
import time
import traceback


def rss_mb() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 // 2**20


def main(path: str) -> None:
    main_id = threading.get_ident()
    peak = {"mb": 0, "at_s": 0.0, "stack": ""}
    lines: list[str] = []
    done = threading.Event()
    t0 = time.perf_counter()

    def where(n: int) -> list[traceback.FrameSummary]:
        frame = sys._current_frames().get(main_id)
        try:
            return traceback.extract_stack(frame)[-n:] if frame is not None else []
        finally:
            del frame

    def sampler() -> None:
        last = 0
        while not done.is_set():
            mb = rss_mb()
            if mb > peak["mb"]:
                peak.update(mb=mb, at_s=time.perf_counter() - t0, stack="".join(traceback.format_list(where(5))))
            if abs(mb - last) >= 100:
                stack = " < ".join(f"{f.name}:{f.lineno}" for f in reversed(where(3)))
                lines.append(f"{time.perf_counter() - t0:7.2f} s {mb:6d} MB  {stack}")
                last = mb
            time.sleep(0.002)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    from maxinstr.attribute import attribute
    from maxinstr.traces.nsys import read_nsys

    t1 = time.perf_counter()
    trace = read_nsys(path, backend="native")
    t2 = time.perf_counter()
    after_read = rss_mb()
    att = attribute(trace)
    t3 = time.perf_counter()
    after_attr = rss_mb()
    done.set()
    thread.join()
    print("\n".join(lines))
    print(f"read_nsys  {t2 - t1:6.2f} s, RSS after {after_read} MB ({len(trace.ops)} ops, {len(trace.calls)} calls, {len(trace.ranges)} ranges)")
    print(f"attribute  {t3 - t2:6.2f} s, RSS after {after_attr} MB ({int((att.op_range >= 0).sum())} ops attributed)")
    print(f"peak RSS {peak['mb']} MB at {peak['at_s']:.2f} s (ru_maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB), in:")
    print(peak["stack"])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
