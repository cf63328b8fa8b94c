"""What attribution produces: columns aligned with ``trace.ops`` and ``trace.ranges`` (never re-joined)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from maxinstr.traces.model import Trace


class Rule(IntEnum):
    """How an op was tied to a range (reported per stage: what to trust)."""

    NONE = 0  # not attributed
    SAME_THREAD = 1  # launch call inside the range, on the range's thread (nsys's rule)
    START_END = 2  # start/end range ended on another thread: launch on its start or end thread
    CROSS_THREAD = 3  # launching thread had no range: innermost range of another thread, same process
    GRAPH = 4  # replayed from a CUDA/HIP graph whose launch call was inside the range (same thread)
    TIME_OVERLAP = 5  # fallback: the op has no launch call in the trace; GPU start inside the range


class JoinMethod(IntEnum):
    """How trace ranges were matched to the run directory's stage records."""

    NONE = 0
    PAYLOAD = 1  # NVTX int64 payload == record id (exact)
    THREAD_NAME_ORDER = 2  # (tid, name, k-th occurrence)
    CLOCK = 3  # the run's records placed on the trace's clock (a torch.profiler trace has no NVTX ranges)


@dataclass
class Attribution:
    """``trace.ops`` attributed to ``trace.ranges``. Per op: the innermost owning range (-1 none; the stack
    follows ``range_parent``) and the :class:`Rule`. Per range instance, inclusive of nested ranges as
    nsys counts them: GPU span (``proj_start_ns`` -1: no op), busy time, counts, bytes, gaps, rules."""

    trace: Trace
    op_range: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    op_rule: np.ndarray = field(default_factory=lambda: np.empty(0, np.int8))
    range_parent: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    range_depth: np.ndarray = field(default_factory=lambda: np.empty(0, np.int16))
    proj_start_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    proj_end_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    busy_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    op_count: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    launch_count: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    """Distinct launch calls behind the range's ops (a graph replay is one): nsys's "GPU Ops"."""
    kernel_count: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    kernel_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    memcpy_bytes: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    memcpy_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    memset_bytes: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    memset_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    idle_gap_ns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    range_rules: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint8))  # bit set of 1 << Rule used
    range_record_id: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # joined stage record, -1 none
    join_method: JoinMethod = JoinMethod.NONE
    notes: list[str] = field(default_factory=list)  # plain statements about fallbacks used
