"""Helpers shared by the stage-core tests."""

from __future__ import annotations

import numpy as np

from maxinstr.rundir.format import STAGE_DTYPE


def records(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype=STAGE_DTYPE)


def drain_all(n) -> tuple[np.ndarray, dict[int, str], dict[int, dict]]:
    """(records, all names seen so far by id, attrs by record id). Resolves GPU events first, so
    the semantics tests also hold on a machine where a CUDA context is current."""
    n.resolve(block=True)
    raw, _, attrs = n.drain()
    return records(raw), dict(n.names()), dict(attrs)  # drain reports a name once per process
