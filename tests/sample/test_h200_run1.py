"""A real samples part from the H200 (tests/sample/data/h200_run1, see its PROVENANCE.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from maxinstr.sample import read_samples
from maxinstr.rundir.samples import THROTTLE_BIT
from maxinstr.sample.summary import summarize

PART = Path(__file__).parent / "data" / "h200_run1"


@pytest.fixture(scope="module")
def run1():
    return read_samples(PART), json.loads((PART / "phases.json").read_text())


def _step_ms(t: np.ndarray, x: np.ndarray) -> float:
    changed = np.flatnonzero(np.diff(x) != 0) + 1
    return float(np.median(np.diff(t[changed]))) / 1e6


def test_energy_and_power_change_every_100ms(run1):
    # why a per-row call measured slow is read every 0.1 s (nvml.MOVED_INTERVAL_S): the H200's
    # counters do not move faster, so reading them at 100 Hz adds no information
    from maxinstr.sample.nvml import MOVED_INTERVAL_S

    r, _ = run1
    assert len(r) == 312 and r.meta["interval_s"] == 0.01
    for col in ("energy_j", "power_w"):
        assert _step_ms(r.t_ns, r.rows[col].astype(np.float64)) == pytest.approx(100.0, abs=2.0), col
    assert MOVED_INTERVAL_S * 1e3 == pytest.approx(100.0)


def test_power_cap_is_not_thermal_or_hw_slowdown(run1):
    r, ph = run1
    t = r.t_ns
    matmul = (t >= ph["matmul"]) & (t < ph["tiny"])
    capped = (r.throttle & THROTTLE_BIT["sw_power_cap"]) != 0
    assert capped[matmul].mean() > 0.8
    [s] = summarize(r)
    assert set(s.throttle_pct) == {"sw_power_cap"}
    assert s.power_cap_pct == pytest.approx(s.hw_throttle_pct) and s.power_cap_pct > 50
    assert s.thermal_hw_pct == 0.0


def test_run1_rows_cost_milliseconds(run1):
    # the measurement that started the per-call timing: every row ~2.8 ms with the GIL held
    r, _ = run1
    plain = r.rows["flags"] == 0
    assert np.median(r.rows["read_ns"][plain]) > 2_000_000
    assert r.meta["gil"].startswith("held")
