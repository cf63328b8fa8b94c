"""NVIDIA utilization per stage, on the H200's own sampler rows (tests/data/nsys/h200_*-run,
benchmarks/device/40-report.sh 2026-12-03, see tests/data/PROVENANCE-extra.md).

Root cause of "GPU utilization per stage far too low" (14.8 % for a stage running back-to-back
bf16 matmuls): NVML's utilization.gpu changes once per driver period (200 ms on the H200) and,
read at time t, describes a window that ended before t. Taking the rows read inside a stage
gave it the value of the time before it. The rows here show it: the GPU went from idle to
back-to-back decode kernels at 7544 ms (CUDA-event times), and the rows read during the next
~220 ms still said 3 %."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import maxinstr
from maxinstr.analyze.report import build_report
from maxinstr.sample.attribute import (
    NVML_UTIL_LAG_NS,
    WINDOW_SHARE_MIN,
    instance_samples,
    util_windows,
    window_means,
    window_share,
)

DATA = Path(__file__).parents[1] / "data" / "nsys"
KV_PLAIN = DATA / "h200_kvcache-plain-run"
H200_RUNS = [DATA / f"h200_{n}-run" for n in ("kvcache-plain", "kvcache", "reprefill-plain", "reprefill")]
MS = 1_000_000


def _device_rows(path):
    run = maxinstr.load(path)
    (smp,) = run.samples.values()
    return run, smp.for_device(0)


def test_h200_utilization_changes_once_per_200_ms():
    _, dev = _device_rows(KV_PLAIN)
    t, u = dev.t_ns.astype(np.int64), dev.rows["gpu_util_pct"].astype(np.float64)
    assert np.isfinite(u).all() and np.median(np.diff(t)) == pytest.approx(10 * MS, rel=0.01)  # 100 Hz rows
    ws, we, v = util_windows(t, u)
    assert len(ws) >= 30
    assert np.median(we - ws) == pytest.approx(200 * MS, abs=0.5 * MS)
    np.testing.assert_array_equal(ws[1:], we[:-1])  # contiguous: each window runs from the update before
    # every row reads the value of the last window published (ended >= lag) before it
    k = np.searchsorted(we + NVML_UTIL_LAG_NS, t, side="right") - 1
    inside = (k >= 0) & (t >= we[0] + NVML_UTIL_LAG_NS) & (t < we[-1] + NVML_UTIL_LAG_NS + 200 * MS)
    assert inside.mean() > 0.9
    assert (v[k[inside]] == u[inside]).mean() > 0.97


def _busy_decode(run):
    st, names = run.stages, list(run.names)
    req = st[st["name_id"] == names.index("request")]
    a, b = req["host_start_ns"][1], req["host_end_ns"][2]  # requests 2 and 3: GPU-bound
    sel = (st["host_start_ns"] >= a) & (st["host_end_ns"] <= b)
    return st[sel & (st["name_id"] == names.index("decode"))], st[sel & (st["depth"] == 1)]


def test_busy_decode_gets_the_windows_of_its_own_time():
    run, dev = _device_rows(KV_PLAIN)
    dec, leaf = _busy_decode(run)
    # ground truth from CUDA events: the GPU ran the decode/sample kernels back to back
    o = np.argsort(leaf["gpu_start_ns"])
    g0, g1 = leaf["gpu_start_ns"][o], leaf["gpu_end_ns"][o]
    gaps = np.clip(g0[1:] - g1[:-1], 0, None).sum()
    assert 1 - gaps / (g1.max() - g0.min()) > 0.98
    # the bug: rows read inside these instances carry the idle windows before them
    t, u = dev.t_ns, dev.rows["gpu_util_pct"].astype(np.float64)
    lo, hi = np.searchsorted(t, dec["host_start_ns"]), np.searchsorted(t, dec["host_end_ns"])
    rows = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)])
    assert len(rows) >= 20 and u[rows].mean() < 60 and (u[rows] <= 3).sum() >= 10
    # the fix: each instance gets the windows that cover its time
    inst = instance_samples(dev, 0, dec["host_start_ns"], dec["host_end_ns"])
    m, c = inst.mean["gpu_util_pct"], inst.count["gpu_util_pct"]
    covered = c > 0
    assert covered.sum() >= 100
    assert (m[covered] * c[covered]).sum() / c[covered].sum() >= 95
    # instances after the last window the sampler saw published get none, not a stale value
    assert np.isnan(m[~covered]).all() and (dec["host_start_ns"][~covered] > dec["host_start_ns"][covered].max()).all()


@pytest.mark.parametrize("path", H200_RUNS, ids=lambda p: p.name)
def test_stage_utilization_is_at_least_sm_activity(path):
    """utilization.gpu (time any kernel ran) >= GPM SM activity (SMs busy x time), per stage.
    Before: re-prefill decode 13.1 % vs SM activity 44.9 % (rows vs an instance-weighted GPM
    window fill)."""
    r = build_report(run=path)
    checked = 0
    for s in r["stages"]:
        smp = s.get("samples") or {}
        util, sm = smp.get("gpu_util_pct_mean"), smp.get("sm_active_pct_mean")
        if util is None or sm is None:
            continue
        assert util + 2 >= sm, (s["name"], util, sm)
        checked += 1
    assert checked >= 2


def test_window_share_tells_a_stage_that_fills_its_windows_from_one_that_does_not():
    # warmup=1: the second request is steady too (with the session's warmup=2 only the last one is,
    # and it ran after the last utilization window the sampler saw: no utilization at all)
    r = build_report(run=KV_PLAIN, warmup=1)
    by = {s["name"]: s["samples"] for s in r["stages"] if s.get("samples")}
    # decode (1.1 ms) and sample (0.05 ms) alternate: the windows are mostly decode's time
    assert by["decode"]["util_window_share"] > 0.7 and by["decode"]["window_limited"] is False
    assert by["sample"]["util_window_share"] < 0.1 and by["sample"]["window_limited"] is True
    assert WINDOW_SHARE_MIN == 0.5


def test_threads_run_stages_after_the_last_published_window_get_no_utilization():
    """h200_threads: 170 ms of rows, all 0 %, and the work in the last 170 ms: no update was
    seen, so no window is known to cover the stages (was: 0 % for a 68 %-busy decode)."""
    _, dev = _device_rows(DATA / "h200_threads-run")
    u = dev.rows["gpu_util_pct"].astype(np.float64)
    assert len(u) == 17 and (u == 0).all()
    ws, we, v = util_windows(dev.t_ns, u)
    assert len(ws) == 0


def test_util_windows_on_synthetic_rows():
    """A driver with a 200 ms period whose phase jumps by 20 ms (seen on the H200, run/window),
    rows every 10 ms, then every 100 ms (a moved call): the windows follow the updates."""
    L = NVML_UTIL_LAG_NS
    ups = np.concatenate((np.arange(15, 2015, 200), np.arange(2035, 4035, 200))) * MS
    vals = np.arange(len(ups), dtype=np.float64) % 7 * 10  # changes at every update but every 7th
    rows = np.concatenate((np.arange(0, 2500, 10), np.arange(2500, 4000, 100))) * MS + 100_000
    k = np.searchsorted(ups, rows, side="right") - 1
    ok = k >= 0
    ws, we, v = util_windows(rows[ok], vals[k[ok]])
    ends = we + L  # detected update times
    for i, u_true in enumerate(ups[1:-1], start=1):
        j = np.argmin(np.abs(ends - u_true))
        tol = 10 * MS if u_true < 2500 * MS else 100 * MS
        assert abs(ends[j] - u_true) <= tol, (i, ends[j], u_true)
        assert v[j] == vals[i]
    # window_means: a stage inside one window gets its value; a stage across two, the overlap mean
    a = np.array([we[5] - 50 * MS, we[5] - 50 * MS])
    b = np.array([we[5] - 10 * MS, we[5] + 30 * MS])
    m, c = window_means(ws, we, v, a, b)
    assert m[0] == v[5] and c[0] == 40 * MS
    assert m[1] == pytest.approx((50 * v[5] + 30 * v[6]) / 80) and c[1] == 80 * MS
    # share: two 40 ms stages in one 200 ms window fill 40 % of it; counted once
    share = window_share(ws, we, np.array([ws[5], ws[5] + 100 * MS]), np.array([ws[5] + 40 * MS, ws[5] + 140 * MS]),
                         np.array([40.0, 40.0]) * MS)
    assert share == pytest.approx(80 / (we[5] - ws[5]) * MS)
    # a constant series: no period, only the span every reading certainly covers
    t = np.arange(0, 3000, 10) * MS
    ws, we, v = util_windows(t, np.full(len(t), 4.0))
    assert len(ws) == 1 and ws[0] == -L and we[0] == t[-1] - 1000 * MS - L and v[0] == 4.0


def test_h200_update_phase_jumps_and_the_windows_follow():
    """h200_window-run: the driver's 200 ms updates moved ~20 ms later at ~2.0 s (after a busy
    phase ended). A single global grid of updates would put half the windows in the wrong place;
    the windows here follow each detected update."""
    _, dev = _device_rows(DATA / "h200_window-run")
    t, u = dev.t_ns.astype(np.int64), dev.rows["gpu_util_pct"].astype(np.float64)
    ws, we, v = util_windows(t, u)
    assert np.median(we - ws) == pytest.approx(200 * MS, abs=1 * MS)
    np.testing.assert_array_equal(ws[1:], we[:-1])
    ups = we + NVML_UTIL_LAG_NS - t[0]
    early = ups[(ups > 0) & (ups < 1900 * MS)] % (200 * MS)
    late = ups[(ups > 2300 * MS) & (ups < 8000 * MS)] % (200 * MS)
    assert len(early) >= 8 and len(late) >= 25
    jump = np.median(late) - np.median(early)
    assert 15 * MS <= jump <= 25 * MS
    # every row reads the value of the last window published before it
    k = np.searchsorted(we + NVML_UTIL_LAG_NS, t, side="right") - 1
    inside = (k >= 0) & (t < we[-1] + NVML_UTIL_LAG_NS)
    assert inside.sum() > 700 and (v[k[inside]] == u[inside]).mean() > 0.97
