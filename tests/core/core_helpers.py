"""Helpers shared by the stage-core tests."""

from __future__ import annotations

import numpy as np

from maxinstr.rundir.format import STAGE_DTYPE


def records(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype=STAGE_DTYPE)


NAMES: dict[int, str] = {}
"""Every name the core reported in this process (it reports each name once)."""


def drain_all(n) -> tuple[np.ndarray, dict[int, str], dict[int, dict]]:
    """(records, all names seen so far by id, attrs by record id). Resolves GPU events first, so
    the semantics tests also hold on a machine where a CUDA context is current."""
    n.resolve(block=True)
    raw, names, attrs = n.drain()
    NAMES.update(names)
    return records(raw), dict(NAMES), dict(attrs)
