"""Vendor fakes for the sampler tests.

NVML: ``unittest.mock.create_autospec`` of the real ``pynvml`` module, so a misspelled
function or a wrong argument count fails the test. Only what a mock cannot be is taken from
the real module: the exception class (``except`` needs a real class) and the GPM ctypes
struct (a real struct, so field names are checked by ctypes).

AMD: amdsmi installs without ROCm but cannot be imported there (its loader raises KeyError),
so it cannot be autospecced directly. ``AmdSmiSpec`` mirrors the signatures of the amdsmi
7.0.2 functions the sampler calls; ``test_amdsmi_spec_matches_installed_source`` checks it
against the installed package's source with ``ast`` (parameter names and order).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

try:
    import pynvml
except ImportError:  # nvidia-ml-py is in the test extra; without it the NVML tests skip
    pynvml = None


# ----------------------------------------------------------------------------- NVML
class FakeNvml:
    """Scripted answers for an autospecced pynvml. ``fail[(fn_name, device)] = code`` makes
    that call raise NVMLError(code) from ``after`` calls on (per key)."""

    def __init__(self, n: int = 1, *, gpm: bool = True, names: list[str] | None = None) -> None:
        nv = mock.create_autospec(pynvml, spec_set=False)
        nv.NVMLError = pynvml.NVMLError
        nv.c_nvmlGpmMetricsGet_t.side_effect = pynvml.c_nvmlGpmMetricsGet_t
        self.nv = nv
        self.n = n
        self.fail: dict[tuple[str, int], tuple[int, int]] = {}
        self.calls: dict[tuple[str, int], int] = {}
        self.energy_mj = [1_000_000_000 + 7 * i for i in range(n)]
        self.power_mw = [350_000] * n
        self.util = [(87, 40)] * n
        self.reasons = [0] * n
        self.gpm_values = {2: 55.0, 3: 30.0, 5: 20.0, 10: 45.0}
        self.procs: list[Any] = []
        names = names or ["NVIDIA H200"] * n

        def handle(i: int) -> str:
            return f"h{i}"

        def dev(h: Any) -> int:
            return int(str(h)[1:])

        def scripted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def call(h: Any, *args: Any) -> Any:
                d = dev(h)
                key = (name, d)
                self.calls[key] = self.calls.get(key, 0) + 1
                if key in self.fail:
                    code, after = self.fail[key]
                    if self.calls[key] > after:
                        raise pynvml.NVMLError(code)
                return fn(d, *args)
            return call

        nv.nvmlDeviceGetCount.side_effect = lambda: self.n
        nv.nvmlDeviceGetHandleByIndex.side_effect = handle
        nv.nvmlDeviceGetUUID.side_effect = lambda h: f"GPU-{dev(h):08x}-1111-2222-3333-444444444444"
        nv.nvmlDeviceGetName.side_effect = lambda h: names[dev(h)]
        nv.nvmlDeviceGetPciInfo.side_effect = lambda h: SimpleNamespace(busId=f"00000000:{dev(h) + 0x18:02X}:00.0")
        nv.nvmlDeviceGetMaxClockInfo.side_effect = lambda h, t: {1: 1980, 2: 3201}[t]
        nv.nvmlDeviceGetEnforcedPowerLimit.return_value = 700_000
        nv.nvmlSystemGetDriverVersion.return_value = "580.159"
        nv.nvmlSystemGetCudaDriverVersion.return_value = 13000
        nv.nvmlGpmQueryDeviceSupport.side_effect = lambda h: SimpleNamespace(isSupportedDevice=1 if gpm else 0)
        nv.nvmlGpmSampleAlloc.side_effect = lambda: pynvml.c_nvmlGpmSample_t()
        nv.nvmlGpmSampleGet.side_effect = scripted("nvmlGpmSampleGet", lambda d, s: s)
        nv.nvmlDeviceGetUtilizationRates.side_effect = scripted(
            "nvmlDeviceGetUtilizationRates", lambda d: SimpleNamespace(gpu=self.util[d][0], memory=self.util[d][1]))
        nv.nvmlDeviceGetMemoryInfo.side_effect = scripted(
            "nvmlDeviceGetMemoryInfo", lambda d, version=None: SimpleNamespace(total=143_771_090_944, used=70_000_000_000 + d, free=1))
        nv.nvmlDeviceGetClockInfo.side_effect = scripted("nvmlDeviceGetClockInfo", lambda d, t: {1: 1980, 2: 3201}[t])
        nv.nvmlDeviceGetPowerUsage.side_effect = scripted("nvmlDeviceGetPowerUsage", lambda d: self.power_mw[d])
        nv.nvmlDeviceGetTotalEnergyConsumption.side_effect = scripted(
            "nvmlDeviceGetTotalEnergyConsumption", lambda d: self.energy_mj[d])
        nv.nvmlDeviceGetCurrentClocksEventReasons.side_effect = scripted(
            "nvmlDeviceGetCurrentClocksEventReasons", lambda d: self.reasons[d])
        nv.nvmlDeviceGetCurrentClocksThrottleReasons.side_effect = scripted(
            "nvmlDeviceGetCurrentClocksThrottleReasons", lambda d: self.reasons[d])
        nv.nvmlDeviceGetTemperature.side_effect = scripted("nvmlDeviceGetTemperature", lambda d, s: 41)
        nv.nvmlDeviceGetComputeRunningProcesses.side_effect = scripted(
            "nvmlDeviceGetComputeRunningProcesses", lambda d: self.procs)

        def metrics_get(get: Any) -> Any:
            for i in range(get.numMetrics):
                m = get.metrics[i]
                m.nvmlReturn = 0
                m.value = self.gpm_values[m.metricId]
            return get

        nv.nvmlGpmMetricsGet.side_effect = metrics_get


@pytest.fixture
def fake_nvml() -> Callable[..., FakeNvml]:
    if pynvml is None:
        pytest.skip("nvidia-ml-py not installed")
    return FakeNvml


# ----------------------------------------------------------------------------- AMD SMI
class AmdSmiInitFlags(enum.IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2


class AmdSmiClkType(enum.IntEnum):
    SYS = 0
    GFX = 0
    DF = 1
    MEM = 4


class AmdSmiTemperatureType(enum.IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(enum.IntEnum):
    CURRENT = 0
    MAX = 1


class AmdSmiException(Exception):
    """Base smi exception class (amdsmi_exception.py)."""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiSpec:
    """The amdsmi 7.0.2 names the sampler uses, with their real signatures."""

    __version__ = "7.0.2"
    AmdSmiInitFlags = AmdSmiInitFlags
    AmdSmiClkType = AmdSmiClkType
    AmdSmiTemperatureType = AmdSmiTemperatureType
    AmdSmiTemperatureMetric = AmdSmiTemperatureMetric
    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException

    @staticmethod
    def amdsmi_init(flag=AmdSmiInitFlags.INIT_AMD_GPUS): ...
    @staticmethod
    def amdsmi_shut_down(): ...
    @staticmethod
    def amdsmi_get_processor_handles(): ...
    @staticmethod
    def amdsmi_get_gpu_device_uuid(processor_handle): ...
    @staticmethod
    def amdsmi_get_gpu_device_bdf(processor_handle): ...
    @staticmethod
    def amdsmi_get_gpu_asic_info(processor_handle): ...
    @staticmethod
    def amdsmi_get_gpu_vram_usage(processor_handle): ...
    @staticmethod
    def amdsmi_get_clock_info(processor_handle, clock_type): ...
    @staticmethod
    def amdsmi_get_gpu_activity(processor_handle): ...
    @staticmethod
    def amdsmi_get_power_info(processor_handle): ...
    @staticmethod
    def amdsmi_get_energy_count(processor_handle): ...
    @staticmethod
    def amdsmi_get_violation_status(processor_handle): ...
    @staticmethod
    def amdsmi_get_gpu_metrics_info(processor_handle): ...
    @staticmethod
    def amdsmi_get_temp_metric(processor_handle, sensor_type, metric): ...
    @staticmethod
    def amdsmi_get_gpu_process_list(processor_handle): ...


SPEC_FUNCTIONS = [n for n in vars(AmdSmiSpec) if n.startswith("amdsmi_")]


class FakeAmdSmi:
    """Scripted answers for an autospec of :class:`AmdSmiSpec`; ``fail[(fn, device)] = (code, after)``."""

    def __init__(self, n: int = 1) -> None:
        smi = mock.create_autospec(AmdSmiSpec, spec_set=True, instance=False)
        # what a mock cannot be: exceptions (for except) and enums (for lookups)
        for name in ("AmdSmiInitFlags", "AmdSmiClkType", "AmdSmiTemperatureType", "AmdSmiTemperatureMetric",
                     "AmdSmiException", "AmdSmiLibraryException"):
            setattr(smi, name, getattr(AmdSmiSpec, name))
        self.smi = smi
        self.n = n
        self.fail: dict[tuple[str, int], tuple[int, int]] = {}
        self.calls: dict[tuple[str, int], int] = {}
        self.activity = {"gfx_activity": 93, "umc_activity": 35, "mm_activity": "N/A"}
        self.power = {"socket_power": 550, "current_socket_power": 550, "average_socket_power": 540,
                      "gfx_voltage": 800, "soc_voltage": 900, "mem_voltage": 1100, "power_limit": 750}
        self.energy = {"energy_accumulator": 10_000_000, "counter_resolution": 15.259, "timestamp": 1}
        self.violation = {"active_ppt_pwr": False, "active_socket_thrm": False, "active_prochot_thrm": False,
                          "active_vr_thrm": False, "active_hbm_thrm": False}
        self.metrics = {"throttle_status": False, "indep_throttle_status": False}
        handles = [f"h{i}" for i in range(n)]

        def scripted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def call(h: Any, *args: Any) -> Any:
                d = int(str(h)[1:])
                key = (name, d)
                self.calls[key] = self.calls.get(key, 0) + 1
                if key in self.fail:
                    code, after = self.fail[key]
                    if self.calls[key] > after:
                        raise AmdSmiLibraryException(code)
                return fn(d, *args)
            return call

        smi.amdsmi_get_processor_handles.side_effect = lambda: list(handles)
        smi.amdsmi_get_gpu_device_uuid.side_effect = lambda h: f"0fff74a1-0000-1000-80{int(h[1:]):02x}-7e2a9b1c3d4e"
        smi.amdsmi_get_gpu_device_bdf.side_effect = lambda h: f"0000:{int(h[1:]) + 5:02x}:00.0"
        smi.amdsmi_get_gpu_asic_info.side_effect = lambda h: {"market_name": "AMD Instinct MI300X"}
        smi.amdsmi_get_gpu_vram_usage.side_effect = scripted("amdsmi_get_gpu_vram_usage", lambda d: {"vram_total": 196592, "vram_used": 1024})
        smi.amdsmi_get_clock_info.side_effect = scripted(
            "amdsmi_get_clock_info", lambda d, t: {"clk": 2100 if t == AmdSmiClkType.GFX else 1300, "min_clk": 500,
                                                   "max_clk": 2100 if t == AmdSmiClkType.GFX else 1300,
                                                   "clk_locked": False, "clk_deep_sleep": "N/A"})
        smi.amdsmi_get_gpu_activity.side_effect = scripted("amdsmi_get_gpu_activity", lambda d: dict(self.activity))
        smi.amdsmi_get_power_info.side_effect = scripted("amdsmi_get_power_info", lambda d: dict(self.power))
        smi.amdsmi_get_energy_count.side_effect = scripted("amdsmi_get_energy_count", lambda d: dict(self.energy))
        smi.amdsmi_get_violation_status.side_effect = scripted("amdsmi_get_violation_status", lambda d: dict(self.violation))
        smi.amdsmi_get_gpu_metrics_info.side_effect = scripted("amdsmi_get_gpu_metrics_info", lambda d: dict(self.metrics))
        smi.amdsmi_get_temp_metric.side_effect = scripted("amdsmi_get_temp_metric", lambda d, s, m: 52)
        smi.amdsmi_get_gpu_process_list.side_effect = scripted("amdsmi_get_gpu_process_list", lambda d: [])


@pytest.fixture
def fake_amdsmi() -> Callable[..., FakeAmdSmi]:
    return FakeAmdSmi


@pytest.fixture
def amdsmi_spec() -> type:
    """The spec class (its ``amdsmi_*`` functions are the ones the sampler may call)."""
    return AmdSmiSpec


# ------------------------------------------------------------- stand-in libnvidia-ml (C)
@pytest.fixture(scope="session")
def fake_nvml_lib_path(tmp_path_factory):
    """The stand-in libnvidia-ml of benchmarks/sampler_cost.py, compiled once (skips without a C
    compiler or nvidia-ml-py). For code that loads it itself, e.g. a sampler child process."""
    import shutil
    import subprocess
    from pathlib import Path

    if pynvml is None:
        pytest.skip("nvidia-ml-py not installed")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "sampler_cost.py"
    code = bench.read_text().split('FAKE_NVML_C = r"""', 1)[1].split('"""', 1)[0]
    d = tmp_path_factory.mktemp("fake-nvml")
    (d / "fake.c").write_text(code)
    lib = d / "libfake-nvml.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(d / "fake.c")], check=True)
    return lib
