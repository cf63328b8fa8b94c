"""What a stage costs on this machine, measured when a session opens (the report's footprint).

:func:`probe_stage_ns` times ``with stage(...)`` on the calling thread with the native core in its
probing mode (``_native._probing``): the stages run the real enter and exit code, but keep no
record, take no id and push no marker, so the run holds nothing of the probe. What it leaves out:
NVTX's push and pop (nearly free without a tool attached; under a profiler, the profiler's own
cost) and appending the record (~50 ns). The report scales it by what a launch-bound step was
measured to feel (analyze/footprint.py).
"""

from __future__ import annotations

import time
from typing import Any

PROBE_STAGES = 2000
"""About 0.5-1 ms at session open."""


def probe_stage_ns(native: Any, n: int = PROBE_STAGES) -> float | None:
    """Median over 4 blocks of ``n // 4`` stages of the ns per ``with stage(...): pass`` (host
    only), or None where the core cannot probe (an older build, stages disabled)."""
    probing = getattr(native, "_probing", None)
    if probing is None or not native.is_enabled():
        return None
    stage = native.stage
    per = max(1, n // 4)
    blocks: list[float] = []
    probing(True)
    try:
        for _ in range(4):
            t0 = time.perf_counter_ns()
            for _ in range(per):
                with stage("maxinstr.probe", gpu=False):
                    pass
            blocks.append((time.perf_counter_ns() - t0) / per)
    except Exception:  # noqa: BLE001 - a probe never breaks the session
        return None
    finally:
        probing(False)
    blocks.sort()
    return (blocks[1] + blocks[2]) / 2
