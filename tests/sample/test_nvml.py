"""NVML path against an autospec of the real pynvml (see conftest)."""

from __future__ import annotations

import math
import time
from unittest import mock

import numpy as np
import pytest

from maxinstr.sample import nvml, read_samples, start_sampler
from maxinstr.rundir.samples import FLAG_GPM, FLAG_LOST, FLAG_SLOW, THROTTLE_BIT
from maxinstr.sample.base import COL, ErrorLog, nan_values
from maxinstr.sample.writer import clock_ns

pynvml = pytest.importorskip("pynvml")

MS = 1_000_000


def backend(fake, **kw):
    errors = ErrorLog(clock_ns)
    return nvml.NvmlBackend(errors, nv=fake.nv, env=kw.pop("env", {}), interval_s=kw.pop("interval_s", 0.01), **kw), errors


def test_abi_constants_match_nvidia_ml_py():
    # nvml.py hardcodes NVML's ABI numbers so a mocked module cannot change them
    assert nvml.ERR_NOT_SUPPORTED == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert nvml.ERR_GPU_IS_LOST == pynvml.NVML_ERROR_GPU_IS_LOST
    assert nvml.ERR_FUNCTION_NOT_FOUND == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    assert nvml.ERR_NO_PERMISSION == pynvml.NVML_ERROR_NO_PERMISSION
    assert nvml.ERR_GPU_NOT_FOUND == pynvml.NVML_ERROR_GPU_NOT_FOUND
    assert nvml.ERR_DRIVER_NOT_LOADED == pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert nvml.CLOCK_SM == pynvml.NVML_CLOCK_SM and nvml.CLOCK_MEM == pynvml.NVML_CLOCK_MEM
    assert nvml.TEMPERATURE_GPU == pynvml.NVML_TEMPERATURE_GPU
    assert nvml.GPM_SM_UTIL == pynvml.NVML_GPM_METRIC_SM_UTIL
    assert nvml.GPM_SM_OCCUPANCY == pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
    assert nvml.GPM_ANY_TENSOR_UTIL == pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    assert nvml.GPM_DRAM_BW_UTIL == pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
    assert nvml.GPM_METRICS_GET_VERSION == pynvml.NVML_GPM_METRICS_GET_VERSION
    # reason bits 0..8 are our neutral bits 0..8, in order
    for name, nvml_name in [("idle", "GpuIdle"), ("app_clocks", "ApplicationsClocksSetting"),
                            ("sw_power_cap", "SwPowerCap"), ("hw_slowdown", "HwSlowdown"),
                            ("sync_boost", "SyncBoost"), ("sw_thermal", "SwThermalSlowdown"),
                            ("hw_thermal", "HwThermalSlowdown"), ("hw_power_brake", "HwPowerBrakeSlowdown"),
                            ("display_clocks", "DisplayClockSetting")]:
        assert getattr(pynvml, f"nvmlClocksEventReason{nvml_name}") == THROTTLE_BIT[name]
    assert pynvml.nvmlClocksEventReasonAll == nvml.NVML_REASON_MASK


def test_reads_every_metric_with_units(fake_nvml):
    fake = fake_nvml(1)
    fake.reasons = [pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwThermalSlowdown]
    b, errors = backend(fake)
    [dev] = b.devices()
    assert dev.info.name == "NVIDIA H200" and dev.info.gpm and dev.info.sm_clock_max_mhz == 1980
    assert dev.info.power_limit_w == pytest.approx(700.0)
    v = nan_values()
    flags, bits, raw = dev.read(v, 0, 0)
    assert flags == FLAG_SLOW  # first GPM sample has no partner yet
    assert v[COL["gpu_util_pct"]] == 87 and v[COL["mem_util_pct"]] == 40
    assert v[COL["power_w"]] == pytest.approx(350.0)  # mW -> W
    assert v[COL["energy_j"]] == pytest.approx(1_000_000.0)  # mJ -> J
    assert v[COL["sm_clock_mhz"]] == 1980 and v[COL["mem_clock_mhz"]] == 3201
    assert v[COL["temp_c"]] == 41 and v[COL["proc_mem_bytes"]] == 0
    assert math.isnan(v[COL["sm_active_pct"]])
    assert bits == THROTTLE_BIT["sw_power_cap"] | THROTTLE_BIT["hw_thermal"] and raw == 0x44
    assert errors.snapshot() == []


def test_gpm_runs_on_its_own_cadence_at_least_100ms(fake_nvml):
    fake = fake_nvml(1)
    b, _ = backend(fake, interval_s=0.01)
    [dev] = b.devices()
    flags_at = {}
    for tick, t in enumerate(range(0, 400 * MS, 10 * MS)):
        v = nan_values()
        flags, _, _ = dev.read(v, tick, t)
        flags_at[t] = (flags, v[COL["sm_active_pct"]])
    gpm_rows = [t for t, (f, _) in flags_at.items() if f & FLAG_GPM]
    assert gpm_rows == [100 * MS, 200 * MS, 300 * MS]  # first sample at 0 has no partner
    assert np.all(np.diff(gpm_rows) >= 100 * MS)
    assert fake.nv.nvmlGpmSampleGet.call_count == 4
    assert flags_at[100 * MS][1] == 55.0
    assert math.isnan(flags_at[110 * MS][1])  # absent between GPM rows
    # a faster GPM request is raised to NVML's 100 ms minimum
    b2, _ = backend(fake_nvml(1), interval_s=0.001, gpm_interval_s=0.02)
    assert b2.devices()[0]._gpm_ns == 100 * MS


def test_not_supported_metric_is_absent_and_sampling_goes_on(fake_nvml):
    fake = fake_nvml(1)
    fake.fail[("nvmlDeviceGetPowerUsage", 0)] = (pynvml.NVML_ERROR_NOT_SUPPORTED, 0)
    fake.fail[("nvmlDeviceGetTotalEnergyConsumption", 0)] = (pynvml.NVML_ERROR_NOT_SUPPORTED, 0)
    b, errors = backend(fake)
    [dev] = b.devices()
    for tick in range(5):
        v = nan_values()
        dev.read(v, tick, tick * 10 * MS)
        assert math.isnan(v[COL["power_w"]]) and v[COL["gpu_util_pct"]] == 87
    # asked once, then dropped; recorded once
    assert fake.calls[("nvmlDeviceGetPowerUsage", 0)] == 1
    absent = [e for e in errors.snapshot() if e["kind"] == "absent" and e["metric"] in ("power_w", "energy_j")]
    assert len(absent) == 2 and "Not Supported" in absent[0]["message"]
    assert {"power_w", "energy_j"} <= set(dev.info.absent)


def test_transient_error_is_recorded_once_and_retried(fake_nvml):
    fake = fake_nvml(1)
    fake.fail[("nvmlDeviceGetUtilizationRates", 0)] = (pynvml.NVML_ERROR_TIMEOUT, 2)
    b, errors = backend(fake)
    [dev] = b.devices()
    for tick in range(6):
        dev.read(nan_values(), tick, tick * 10 * MS)
    assert fake.calls[("nvmlDeviceGetUtilizationRates", 0)] == 6  # kept trying
    assert len([e for e in errors.snapshot() if e["metric"] == "gpu_util_pct"]) == 1


def test_old_driver_falls_back_to_throttle_reasons(fake_nvml):
    fake = fake_nvml(1)
    fake.fail[("nvmlDeviceGetCurrentClocksEventReasons", 0)] = (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, 0)
    fake.reasons = [pynvml.nvmlClocksThrottleReasonHwSlowdown]
    b, errors = backend(fake)
    [dev] = b.devices()
    for tick in range(3):
        _, bits, _ = dev.read(nan_values(), tick, 0)
        assert bits == THROTTLE_BIT["hw_slowdown"]
    assert fake.calls[("nvmlDeviceGetCurrentClocksEventReasons", 0)] == 1
    assert errors.snapshot() == []


def test_no_gpm_before_hopper(fake_nvml):
    fake = fake_nvml(1, gpm=False)
    b, errors = backend(fake)
    [dev] = b.devices()
    assert not dev.info.gpm and "sm_active_pct" in dev.info.absent
    dev.read(nan_values(), 0, 0)
    fake.nv.nvmlGpmSampleGet.assert_not_called()
    assert any(e["metric"] == "gpm" for e in errors.snapshot())


def test_gpu_lost_mid_run_stops_that_device_only(fake_nvml, tmp_path):
    fake = fake_nvml(2)
    # GPU 1 falls off the bus after 3 successful power reads
    fake.fail[("nvmlDeviceGetPowerUsage", 1)] = (pynvml.NVML_ERROR_GPU_IS_LOST, 3)
    with mock.patch.object(nvml, "import_pynvml", return_value=fake.nv):
        s = start_sampler(tmp_path, 0.005, env={})
        deadline = time.monotonic() + 5
        while fake.calls.get(("nvmlDeviceGetPowerUsage", 0), 0) < 12 and time.monotonic() < deadline:
            time.sleep(0.01)
        s.stop()
    r = read_samples(tmp_path)
    d0, d1 = r.for_device(0), r.for_device(1)
    assert len(d1) == 4 and d1.flags[-1] & FLAG_LOST and not (d1.flags[:-1] & FLAG_LOST).any()
    assert len(d0) >= 12 and not (d0.flags & FLAG_LOST).any()
    lost = [e for e in r.errors if e["kind"] == "lost"]
    assert len(lost) == 1 and lost[0]["device"] == 1 and "GPU is lost" in lost[0]["message"]
    assert fake.calls[("nvmlDeviceGetPowerUsage", 1)] == 4  # never asked again
    assert r.meta["status"] == "closed" and r.meta["backend"] == "nvml"
    assert r.meta["backend_versions"] == {"driver": "580.159", "cuda_driver": "13.0"}
    assert r.meta["cost"]["ticks"] >= 12 and r.meta["cost"]["per_tick_ns"]["p50"] > 0
    fake.nv.nvmlShutdown.assert_called_once()


def test_process_memory_counts_only_watched_pids(fake_nvml):
    fake = fake_nvml(1)
    fake.procs = [SimpleProc(pid=10, usedGpuMemory=1000), SimpleProc(pid=11, usedGpuMemory=24),
                  SimpleProc(pid=12, usedGpuMemory=None)]
    b, _ = backend(fake, pids=[10, 12])
    [dev] = b.devices()
    v = nan_values()
    dev.read(v, 0, 0)
    assert v[COL["proc_mem_bytes"]] == 1000
    v = nan_values()
    dev.read(v, 1, 0)  # not a slow tick (every 10th at 100 Hz)
    assert math.isnan(v[COL["proc_mem_bytes"]])


class SimpleProc:
    def __init__(self, pid, usedGpuMemory):
        self.pid = pid
        self.usedGpuMemory = usedGpuMemory


def test_cuda_visible_devices_picks_and_renumbers(fake_nvml):
    fake = fake_nvml(4)
    b, _ = backend(fake, env={"CUDA_VISIBLE_DEVICES": "2,GPU-00000000"})
    devs = b.devices()
    assert [(d.info.visible_index, d.info.physical_index) for d in devs] == [(0, 2), (1, 0)]
    assert b.source == "CUDA_VISIBLE_DEVICES=2,GPU-00000000"


def test_nvml_library_missing_is_unavailable(fake_nvml):
    fake = fake_nvml(1)
    fake.nv.nvmlInit.side_effect = pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(nvml.Unavailable, match="NVML Shared Library Not Found"):
        backend(fake)


def test_devices_picks_visible_gpus(fake_nvml, tmp_path):
    fake = fake_nvml(4)
    with mock.patch.object(nvml, "import_pynvml", return_value=fake.nv):
        s = start_sampler(tmp_path, 0.01, env={}, devices=[2, 3])
        time.sleep(0.05)
        s.stop()
    r = read_samples(tmp_path)
    assert [d["visible_index"] for d in r.devices] == [2, 3]
    assert set(np.unique(r.device)) == {0, 1}  # rows index the sampled devices
