"""The real pynvml code over a stand-in libnvidia-ml (C, compiled here; skipped without a C
compiler): ctypes structs, field names and units as pynvml really returns them, the GIL-held
fast path, and slow calls moved to the slow cadence (the stub can make one function slow)."""

from __future__ import annotations

import ctypes
import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

pynvml = pytest.importorskip("pynvml")

from maxinstr.sample import nvml  # noqa: E402
from maxinstr.rundir.samples import FLAG_GPM  # noqa: E402
from maxinstr.sample.base import COL, ErrorLog, nan_values  # noqa: E402
from maxinstr.sample.writer import clock_ns  # noqa: E402

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "sampler_cost.py"


@pytest.fixture
def fake_lib(tmp_path, monkeypatch):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    spec = importlib.util.spec_from_file_location("sampler_cost_src", BENCH)
    src = spec.loader.get_data(str(BENCH)).decode()
    code = src.split('FAKE_NVML_C = r"""', 1)[1].split('"""', 1)[0]
    (tmp_path / "fake.c").write_text(code)
    lib = tmp_path / "libfake-nvml.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "fake.c")], check=True)
    monkeypatch.setenv("FAKE_NVML_SPIN_NS", "1000")
    monkeypatch.setattr(pynvml, "nvmlLib", ctypes.CDLL(str(lib)))
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.delenv("MAXINSTR_SAMPLER_GIL", raising=False)
    monkeypatch.delenv("MAXINSTR_SAMPLER_PROFILE", raising=False)
    return lib


def make_slow(fn: str, ns: int) -> None:
    """Make the stub's ``fn`` spin ``ns`` per call from now on (0: back to normal)."""
    pynvml.nvmlLib.fake_set_slow(fn.encode(), ctypes.c_long(ns))


def test_real_pynvml_over_stub_library(fake_lib):
    b = nvml.NvmlBackend(ErrorLog(clock_ns), nv=pynvml, env={}, interval_s=0.01)
    assert b.gil.startswith("auto: per-row calls with the GIL held")
    assert b.versions() == {"driver": "fake-nvml", "cuda_driver": "13.0"}
    [dev] = b.devices()
    assert dev.info.name == "fake NVML device" and dev.info.mem_total_bytes == 2.0**37 and dev.info.gpm
    assert dev.info.uuid.startswith("GPU-fa4e")
    v = nan_values()
    dev.read(v, 0, 0)
    assert v[COL["gpu_util_pct"]] == 50 and v[COL["mem_used_bytes"]] == 2**30
    assert v[COL["power_w"]] == pytest.approx(300.0) and v[COL["energy_j"]] == pytest.approx(123456.789)
    assert v[COL["sm_clock_mhz"]] == 1500 and v[COL["temp_c"]] == 40 and v[COL["proc_mem_bytes"]] == 0
    v = nan_values()
    flags, _, _ = dev.read(v, 1, 200_000_000)  # second GPM sample, 200 ms later
    assert flags & FLAG_GPM and v[COL["sm_active_pct"]] == 42.0 and v[COL["dram_bw_util_pct"]] == 42.0
    assert b.errors.snapshot() == []
    dev.close()
    b.shutdown()


def test_per_row_calls_hold_the_gil_and_leave_pynvml_alone(fake_lib):
    lib = nvml.direct_library(pynvml)
    assert isinstance(lib, ctypes.PyDLL)  # PyDLL: called with the GIL held
    assert lib.nvmlDeviceGetPowerUsage._flags_ & ctypes._FUNCFLAG_PYTHONAPI
    b = nvml.NvmlBackend(ErrorLog(clock_ns), nv=pynvml, env={}, interval_s=0.01)
    [dev] = b.devices()
    dev.read(nan_values(), 0, 0)
    # pynvml's own function cache still holds CDLL functions (GIL released for other users)
    for fn in pynvml._nvmlGetFunctionPointer_cache.values():
        assert not fn._flags_ & ctypes._FUNCFLAG_PYTHONAPI
    assert nvml.direct_library(object()) is None  # not pynvml: nothing done


def test_direct_calls_translate_errors(fake_lib, monkeypatch):
    monkeypatch.setenv("FAKE_NVML_POWER_RET", str(pynvml.NVML_ERROR_NOT_SUPPORTED))
    b = nvml.NvmlBackend(ErrorLog(clock_ns), nv=pynvml, env={}, interval_s=0.01)
    [dev] = b.devices()
    for tick in range(3):
        v = nan_values()
        dev.read(v, tick, 0)
        assert v[COL["gpu_util_pct"]] == 50
    assert "power_w" in dev.info.absent
    [e] = b.errors.snapshot()
    assert e["kind"] == "absent" and "Not Supported" in e["message"]


def test_release_mode_releases_the_gil_on_every_call(fake_lib, monkeypatch):
    monkeypatch.setenv("MAXINSTR_SAMPLER_GIL", "release")
    b = nvml.NvmlBackend(ErrorLog(clock_ns), nv=pynvml, env={}, interval_s=0.01)
    assert b.gil.startswith("release:")
    [dev] = b.devices()
    assert not dev.held
    for p in dev._fast + dev._slow:  # every closure calls through the CDLL view
        assert not p.fn.__closure__ or all(
            not getattr(c.cell_contents, "_flags_", 0) & ctypes._FUNCFLAG_PYTHONAPI for c in p.fn.__closure__)
    v = nan_values()
    dev.read(v, 0, 0)
    assert v[COL["power_w"]] == pytest.approx(300.0)


def test_slow_call_is_moved_at_start(fake_lib):
    # the H200 (run 1) spent ~2.8 ms per row in the per-row calls: one such call must not be
    # made every row with the GIL held
    make_slow("nvmlDeviceGetTotalEnergyConsumption", 300_000)
    try:
        b = nvml.NvmlBackend(ErrorLog(clock_ns), nv=pynvml, env={}, interval_s=0.01, moved_interval_s=0.05)
        [dev] = b.devices()
    finally:
        make_slow("", 0)
    energy = next(p for p in dev._moved if p.name == "energy_j")
    assert energy.cadence == "moved" and "median of 5" in energy.moved
    assert energy.fn is energy.released_fn  # the GIL is released for it from now on
    assert min(energy.calibration_ns) >= 300_000
    assert [p.name for p in dev._fast] == ["gpu_util_pct", "mem_used_bytes", "sm_clock_mhz", "mem_clock_mhz",
                                           "power_w", "throttle"]
    rows = []
    for tick in range(10):
        v = nan_values()
        flags, _, _ = dev.read(v, tick, tick * 10_000_000)
        rows.append((v[COL["energy_j"]], v[COL["power_w"]]))
    assert all(p == pytest.approx(300.0) for _, p in rows)  # fast metrics every row
    # energy every 5th row (0.05 s / 0.01 s), NaN between
    assert [e == pytest.approx(123456.789) for e, _ in rows] == [t % 5 == 0 for t in range(10)]
    [note] = b.errors.snapshot()
    assert note["kind"] == "cadence" and note["metric"] == "energy_j" and "every 0.05 s, GIL released" in note["message"]
    stats = dev.probe_stats()
    assert stats["energy_j"]["cadence"] == "moved" and stats["energy_j"]["calls"] == 2
    assert stats["power_w"]["cadence"] == "fast" and stats["power_w"]["calls"] == 10
    assert 0 < stats["power_w"]["p50_ns"] < 300_000


def test_call_that_becomes_slow_while_sampling_is_moved(fake_lib):
    b = nvml.NvmlBackend(ErrorLog(clock_ns), nv=pynvml, env={}, interval_s=0.01)
    [dev] = b.devices()
    assert dev.held and [p.cadence for p in dev._fast] == ["fast"] * 7
    for tick in range(3):
        dev.read(nan_values(), tick, 0)
    make_slow("nvmlDeviceGetMemoryInfo", 200_000)
    try:
        for tick in range(3, 8):
            dev.read(nan_values(), tick, 0)
    finally:
        make_slow("", 0)
    mem = next(p for p in dev._moved if p.name == "mem_used_bytes")
    assert mem.cadence == "moved" and "5 calls in a row" in mem.moved and mem.fn is mem.released_fn
    assert "mem_used_bytes" not in [p.name for p in dev._fast]


def test_profile_records_thread_cpu_per_call(fake_lib, monkeypatch, tmp_path):
    monkeypatch.setenv("MAXINSTR_SAMPLER_PROFILE", "1")
    from maxinstr.sample import read_samples, start_sampler

    b = nvml.NvmlBackend(ErrorLog(clock_ns), nv=pynvml, env={}, interval_s=0.005)
    assert "profile" in b.gil
    s = start_sampler(tmp_path, 0.005, backend=b)
    import time

    time.sleep(0.3)
    s.stop()
    probes = read_samples(tmp_path).meta["cost"]["probes"]["0"]
    # every per-row metric, the slow ones and GPM, each with its time per call
    assert {"gpu_util_pct", "power_w", "energy_j", "throttle", "temp_c", "proc_mem_bytes", "gpm"} <= set(probes)
    for name, p in probes.items():
        assert p["calls"] > 0 and p["p50_ns"] >= 1000 and p["max_ns"] >= p["p50_ns"], name
        if name != "gpm":
            assert p["thread_cpu_mean_ns"] > 0, name
