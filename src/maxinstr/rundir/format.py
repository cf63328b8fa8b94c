"""Run directory format, version 1: the constants writers and readers share (docs/formats.md)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from maxinstr import config

FORMAT_NAME = "maxinstr-run"
FORMAT_VERSION = 1

META_FILE = "meta.json"
PARTS_DIR = "parts"
STAGES_FILE = "stages.bin"
STRINGS_FILE = "strings.jsonl"
ATTRS_FILE = "attrs.jsonl"
EVENTS_FILE = "events.jsonl"
PART_FILE = "part.json"
SAMPLER_PART = "sampler"  # the samples `maxinstr run` takes from its own process for the whole run

STAGE_DTYPE = np.dtype([(name, "<i8") for name in ("id", "parent_id", "tid", "host_start_ns", "host_end_ns",
                                                     "gpu_start_ns", "gpu_end_ns", "step")]
                       + [("name_id", "<i4"), ("depth", "<i2"), ("flags", "<u2")])
"""One stage record as stored in ``stages.bin`` (72 bytes, little-endian, no padding)."""

assert STAGE_DTYPE.itemsize == 72

# `flags` bits
EXCEPTION = 1 << 0  # the stage was left by an exception
GPU_TIMED = 1 << 1  # gpu_start_ns / gpu_end_ns are valid
MARK = 1 << 2  # instant event: host_end_ns == host_start_ns
GPU_DROPPED = 1 << 3  # GPU time wanted but not recorded (event pool exhausted or event error)
UNCLOSED = 1 << 4  # still open when the process/session ended; host_end_ns = time of close
GPU_SAMPLED_OUT = 1 << 5  # left without GPU events by the GPU-timing budget (docs/stage-core.md)
KNOWN_FLAGS = EXCEPTION | GPU_TIMED | MARK | GPU_DROPPED | UNCLOSED | GPU_SAMPLED_OUT

MAX_TIME_NS = 1 << 62
"""Times in a run (CLOCK_MONOTONIC ns) are below this: any difference of two fits an int64."""

def part_name(pid: int | None = None, rank: int | str | None = None) -> str:
    """The part folder name of a process: ``p<pid>``, or ``r<rank>.p<pid>`` with a rank
    (``rank=None``: torchrun's ``RANK`` when set)."""
    pid = os.getpid() if pid is None else pid
    if rank is None:
        rank = config.rank()
    try:
        number = int(str(rank).strip()) if rank is not None else -1
    except ValueError:  # a RANK that is not a number names no rank
        number = -1
    return f"p{pid}" if number < 0 else f"r{number}.p{pid}"


def run_artifact(run_dir: str | Path, recorded: str | None) -> str | None:
    """Where a file `maxinstr run` recorded (its trace) is now: the file of that name inside the
    run directory (a moved or copied run keeps it, while the recorded path may name another run's),
    else the recorded path (relative to the run directory) when it exists and is inside it."""
    if not recorded:
        return None
    path = Path(str(recorded))
    beside = Path(run_dir) / path.name
    if beside.is_file():
        return str(beside)
    path = path if path.is_absolute() else Path(run_dir) / path
    if not inside(run_dir, path):
        return None  # a file is data: a path it names outside the run is never read unasked
    return str(path) if path.exists() else None


def inside(run_dir: str | Path, path: str | Path) -> bool:
    """Whether ``path`` (links resolved) is inside ``run_dir``, the only place a path a run names may
    lead unasked (elsewhere `report` would read a file the user never named)."""
    try:
        Path(path).resolve().relative_to(Path(run_dir).resolve())
        return True
    except (ValueError, OSError, RuntimeError):
        return False
