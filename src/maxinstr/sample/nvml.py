"""NVIDIA devices through NVML (nvidia-ml-py, imported when sampling starts).

NVML errors are translated here only (:meth:`NvmlDevice.classify`): an unsupported metric is
dropped and recorded once (its column stays NaN), a lost GPU raises
:class:`~maxinstr.sample.base.DeviceLost`, anything else is recorded once per (metric, error) and
retried. How calls are made (``MAXINSTR_SAMPLER_GIL``, samples.json ``gil``):

- ``auto``: per-row calls go straight to the library through a ``ctypes.PyDLL`` view (GIL held:
  one hand-over per row, not per call, :func:`direct_library`); a call slower than
  :data:`~maxinstr.sample.base.SLOW_CALL_NS` moves to every :data:`MOVED_INTERVAL_S`, GIL released.
- ``release``: every call releases the GIL (``ctypes.CDLL``); each return waits for it (up to the
  5 ms switch interval in a program busy in Python).
- ``process`` (the default): a child process (:mod:`maxinstr.sample.process`) that uses ``auto``.

GPM (Hopper+: SM activity, occupancy, tensor activity, DRAM bandwidth) compares two samples NVML
wants >= 100 ms apart: its own cadence, its columns NaN in the rows between (flag GPM marks the
others; a value covers the time since the previous GPM row).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Callable, Collection, Mapping
from typing import Any

from maxinstr import config
from maxinstr.rundir.samples import FLAG_GPM
from maxinstr.sample.base import (ABSENT, COL, LOST, MAX_FAILS_IN_A_ROW, RETRY, SLOW_CALL_NS, Backend, Device,
                                  DeviceInfo, ErrorLog, Probe, ProbeDevice, Unavailable, perf_ns, try_call)
from maxinstr.sample.devices import MigInstance, PhysicalGpu, nvidia_visible

# NVML's ABI values (nvml.h), here so a mocked module cannot change them (tests check them).
NVML_SUCCESS = 0
ERR_UNINITIALIZED = 1
ERR_NOT_SUPPORTED = 3
ERR_NO_PERMISSION = 4
ERR_DRIVER_NOT_LOADED = 9
ERR_FUNCTION_NOT_FOUND = 13
ERR_GPU_IS_LOST = 15
ERR_RESET_REQUIRED = 16
ERR_LIB_RM_VERSION_MISMATCH = 18
ERR_ARGUMENT_VERSION_MISMATCH = 25
ERR_DEPRECATED = 26
ERR_GPU_NOT_FOUND = 28

CLOCK_SM = 1
CLOCK_MEM = 2
TEMPERATURE_GPU = 0

GPM_SM_UTIL = 2
GPM_SM_OCCUPANCY = 3
GPM_ANY_TENSOR_UTIL = 5
GPM_DRAM_BW_UTIL = 10
GPM_METRICS_GET_VERSION = 1
GPM_MIN_INTERVAL_S = 0.1
SLOW_INTERVAL_S = 0.5  # cadence of the slow metrics: process memory and temperature
MOVED_INTERVAL_S = 0.1
"""Cadence of a per-row call measured slower than SLOW_CALL_NS: NVML's counters change no faster
(the H200's energy and power moved in ~100 ms steps in run 1, tests/sample/data/h200_run1)."""

GPM_COLUMNS: tuple[tuple[int, str], ...] = (  # (GPM metric id, column)
    (GPM_SM_UTIL, "sm_active_pct"),
    (GPM_SM_OCCUPANCY, "sm_occupancy_pct"),
    (GPM_ANY_TENSOR_UTIL, "tensor_active_pct"),
    (GPM_DRAM_BW_UTIL, "dram_bw_util_pct"),
)

# NVML clocks-event reasons 0x1..0x100 are, bit for bit, our neutral bits 0..8 (UserDefinedClocks
# is an alias of ApplicationsClocksSetting, 0x2).
NVML_REASON_MASK = 0x1FF

_ABSENT = {ERR_NOT_SUPPORTED, ERR_NO_PERMISSION, ERR_FUNCTION_NOT_FOUND, ERR_ARGUMENT_VERSION_MISMATCH, ERR_DEPRECATED}
_LOST = {ERR_GPU_IS_LOST, ERR_GPU_NOT_FOUND, ERR_RESET_REQUIRED, ERR_DRIVER_NOT_LOADED, ERR_UNINITIALIZED,
         ERR_LIB_RM_VERSION_MISMATCH}  # fmt: skip

NVML_LIB_ENV = config.SAMPLER_NVML_LIB  # tests and benchmarks: a stand-in libnvidia-ml for pynvml


def direct_library(nv: Any, *, hold_gil: bool = True) -> Any:
    """A view of the NVML library the real pynvml loaded: ``ctypes.PyDLL`` (GIL held) or, with
    ``hold_gil=False``, ``ctypes.CDLL``; else None. Why hold the GIL: pynvml releases it around
    every call, and in a program busy in Python each re-acquisition costs a thread switch and can
    wait up to the 5 ms switch interval, about eight per row; through PyDLL a row is one. Slow
    calls move to the CDLL view (:meth:`~maxinstr.sample.base.ProbeDevice.calibrate`)."""
    try:
        lib = getattr(nv, "nvmlLib", None)
        if not isinstance(lib, ctypes.CDLL) or not isinstance(getattr(nv, "c_nvmlMemory_t", None), type):
            return None
        return (ctypes.PyDLL if hold_gil else ctypes.CDLL)(lib._name, handle=lib._handle)
    except Exception:  # noqa: BLE001 - an optimization only
        return None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def import_pynvml() -> Any:
    try:
        import pynvml  # optional (maxinstr[nvidia]), and only when sampling starts
    except ImportError as exc:
        raise Unavailable(f"nvidia-ml-py is not installed: pip install 'maxinstr[nvidia]' ({exc})") from None
    lib = config.sampler_nvml_library()
    if lib and getattr(pynvml, "nvmlLib", None) is None:
        pynvml.nvmlLib = ctypes.CDLL(lib)  # pynvml loads nothing else once this is set
    return pynvml


class NvmlDevice(ProbeDevice):
    """One visible NVIDIA GPU or MIG instance (``parent``: the MIG instance's GPU)."""

    def __init__(self, backend: NvmlBackend, handle: Any, info: DeviceInfo, parent: Any = None,
                 gpu_instance_id: int = -1) -> None:
        self.nv = backend.nv
        self._direct, self._released = backend._direct, backend._released  # PyDLL and CDLL views, or None
        self.h = handle
        self.info = info
        self.errors = backend.errors
        self._slow_every = backend._slow_every
        self._moved_every = backend._moved_every
        self.moved_interval_s = backend._moved_every * backend._interval_s
        self._throttle_raw = 0
        self._parent, self._gi = parent, gpu_instance_id
        self.profile = backend._profile
        self._fast: tuple[Probe, ...] = self._fast_probes()
        self._slow: tuple[Probe, ...] = self._slow_probes(backend._pids)
        self._throttle_probe = next((p for p in self._fast if p.name == "throttle"), None)
        self._gpm_ns = int(max(backend._gpm_interval_s, GPM_MIN_INTERVAL_S) * 1e9)
        self._gpm_t = -(1 << 62)
        self._gpm_ok, self._gpm_fails = False, 0
        self._gpm_samples: list[Any] = []
        self._gpm_probe = Probe("gpm", lambda v: None, ())  # timing of the GPM reads only
        self._gpm_probe.cadence = "gpm"
        if info.gpm:
            self._gpm_ok = self._gpm_setup()
        if backend._calibrate:
            self.slow_call_ns = SLOW_CALL_NS
            self.calibrate()

    def _fast_probes(self) -> tuple[Probe, ...]:
        if self._released is not None:
            try:
                released = self._row_probes(self._released)
                if self._direct is None:
                    return released
                held = self._row_probes(self._direct)
                self.held = True
                return tuple(Probe(p.name, p.fn, p.columns, released_fn=r.fn) for p, r in zip(held, released))
            except Exception as exc:  # noqa: BLE001 - fall back to pynvml's wrappers
                idx = self.info.visible_index
                self.errors.once((idx, "direct"), "metric", f"gpu{idx}: direct NVML calls unavailable ({exc}); using pynvml",
                                 idx, None)
                self._direct = self._released = None
                self.held = False
        return self._row_probes(None)

    def _getter(self, lib: Any, name: str, out_type: Any, *args: Any) -> Callable[[], Any]:
        """What pynvml's ``name(handle, *args)`` returns, as a function of no argument: through
        pynvml (``lib`` None) or straight through ``lib`` into a preallocated ``out_type`` (a
        ctypes number is returned as its value), a failure raised as ``nv.NVMLError(code)``."""
        if lib is None:
            return functools.partial(getattr(self.nv, name), self.h, *args)
        fn, out, err = getattr(lib, name), out_type(), self.nv.NVMLError
        call = (self.h, *args, ctypes.byref(out))
        if isinstance(out, ctypes.Structure):
            def get() -> Any:
                ret = fn(*call)
                if ret:
                    raise err(ret)
                return out
        else:
            def get() -> Any:
                ret = fn(*call)
                if ret:
                    raise err(ret)
                return out.value
        return get

    def _row_probes(self, lib: Any) -> tuple[Probe, ...]:
        """The per-row reads, through ``lib`` (a ctypes view of the library) or pynvml (None)."""
        nv, h, get = self.nv, self.h, functools.partial(self._getter, lib)
        c_gpu, c_mem, c_used = COL["gpu_util_pct"], COL["mem_util_pct"], COL["mem_used_bytes"]
        c_sm, c_mclk, c_pow, c_en = COL["sm_clock_mhz"], COL["mem_clock_mhz"], COL["power_w"], COL["energy_j"]
        get_util = get("nvmlDeviceGetUtilizationRates", nv.c_nvmlUtilization_t)
        get_mem = get("nvmlDeviceGetMemoryInfo", nv.c_nvmlMemory_t)
        get_sm = get("nvmlDeviceGetClockInfo", ctypes.c_uint, CLOCK_SM)
        get_mclk = get("nvmlDeviceGetClockInfo", ctypes.c_uint, CLOCK_MEM)
        get_pow = get("nvmlDeviceGetPowerUsage", ctypes.c_uint)
        get_en = get("nvmlDeviceGetTotalEnergyConsumption", ctypes.c_ulonglong)
        if lib is not None:  # drivers before 535 lack the "ClocksEvent" name
            why = "Event" if hasattr(lib, "nvmlDeviceGetCurrentClocksEventReasons") else "Throttle"
            get_why = get(f"nvmlDeviceGetCurrentClocks{why}Reasons", ctypes.c_ulonglong)
        else:
            reasons = [nv.nvmlDeviceGetCurrentClocksEventReasons]

            def get_why() -> Any:
                try:
                    return reasons[0](h)
                except nv.NVMLError as exc:  # the old name, once
                    old = nv.nvmlDeviceGetCurrentClocksThrottleReasons
                    if _code(exc) != ERR_FUNCTION_NOT_FOUND or reasons[0] is old:
                        raise
                    reasons[0] = nv.nvmlDeviceGetCurrentClocksThrottleReasons
                    return reasons[0](h)

        def util(v: list) -> None:
            u = get_util()
            v[c_gpu] = u.gpu
            v[c_mem] = u.memory

        def memory(v: list) -> None:
            v[c_used] = get_mem().used

        def sm_clock(v: list) -> None:
            v[c_sm] = get_sm()

        def mem_clock(v: list) -> None:
            v[c_mclk] = get_mclk()

        def power(v: list) -> None:
            v[c_pow] = get_pow() * 1e-3  # mW -> W

        def energy(v: list) -> None:
            v[c_en] = get_en() * 1e-3  # mJ -> J

        def throttle(v: list) -> None:
            self._throttle_raw = get_why()

        return (Probe("gpu_util_pct", util, ("gpu_util_pct", "mem_util_pct")), Probe("mem_used_bytes", memory),
                Probe("sm_clock_mhz", sm_clock), Probe("mem_clock_mhz", mem_clock), Probe("power_w", power),
                Probe("energy_j", energy), Probe("throttle", throttle, ()))

    def _slow_probes(self, pids: Collection[int] | None) -> tuple[Probe, ...]:
        nv, h = self.nv, self.h
        c_proc, c_temp = COL["proc_mem_bytes"], COL["temp_c"]
        watched = None if pids is None else frozenset(pids)
        lib = self._released if hasattr(self._released, "nvmlDeviceGetTemperature") else None
        get_temp = self._getter(lib, "nvmlDeviceGetTemperature", ctypes.c_uint, TEMPERATURE_GPU)

        def proc_mem(v: list) -> None:  # usedGpuMemory None: not available (e.g. Windows WDDM)
            v[c_proc] = sum(p.usedGpuMemory or 0 for p in nv.nvmlDeviceGetComputeRunningProcesses(h)
                            if watched is None or p.pid in watched)

        def temp(v: list) -> None:
            v[c_temp] = get_temp()

        return (Probe("proc_mem_bytes", proc_mem), Probe("temp_c", temp))

    def _gpm_setup(self) -> bool:
        nv = self.nv
        try:
            self._gpm_samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
            get = nv.c_nvmlGpmMetricsGet_t()
            get.version = GPM_METRICS_GET_VERSION
            get.numMetrics = len(GPM_COLUMNS)
            for i, (metric_id, _) in enumerate(GPM_COLUMNS):
                get.metrics[i].metricId = metric_id
            self._gpm_get = get
        except Exception as exc:  # noqa: BLE001 - vendor boundary
            self._absent_gpm(f"GPM set-up failed: {_text(exc)}")
            return False
        self._gpm_cur, self._gpm_have_prev = 0, False
        self._gpm_cols = tuple(COL[c] for _, c in GPM_COLUMNS)
        return True

    def _absent_gpm(self, why: str) -> None:
        self._gpm_ok = False
        idx = self.info.visible_index
        self.info.absent.extend(col for _, col in GPM_COLUMNS if col not in self.info.absent)
        self.errors.once((idx, "gpm"), "absent", f"gpu{idx}: GPM metrics absent: {why}", idx, "gpm")

    def _read_gpm(self, v: list, now_ns: int) -> int:
        nv = self.nv
        sample = self._gpm_samples[self._gpm_cur]
        if self._parent is not None:
            nv.nvmlGpmMigSampleGet(self._parent, self._gi, sample)
        else:
            nv.nvmlGpmSampleGet(self.h, sample)
        self._gpm_t = now_ns
        flags = 0
        if self._gpm_have_prev:
            get = self._gpm_get
            get.sample1 = self._gpm_samples[self._gpm_cur ^ 1]
            get.sample2 = sample
            nv.nvmlGpmMetricsGet(get)
            idx = self.info.visible_index
            for i, col in enumerate(self._gpm_cols):
                m = get.metrics[i]
                if m.nvmlReturn == NVML_SUCCESS:
                    v[col] = m.value
                else:
                    name = GPM_COLUMNS[i][1]
                    self.errors.once((idx, name, m.nvmlReturn), "metric", f"gpu{idx}: GPM {name}: NVML error {m.nvmlReturn}",
                                     idx, name)
            flags = FLAG_GPM
        self._gpm_have_prev = True
        self._gpm_cur ^= 1
        self._gpm_fails = 0
        return flags

    def classify(self, exc: Exception) -> tuple[str, str, object]:
        if not isinstance(exc, self.nv.NVMLError):
            return ABSENT, f"{type(exc).__name__}: {exc}", type(exc).__name__
        code = _code(exc)
        what = f"NVML: {_text(exc)}"
        return (LOST if code in _LOST else ABSENT if code in _ABSENT else RETRY), what, code

    def read(self, values: list[float], tick: int, now_ns: int) -> tuple[int, int, int]:
        tp = self._throttle_probe
        if tp is None or tp.cadence == "fast":
            self._throttle_raw = 0
        # else: moved to a slower cadence; rows between keep the last reasons seen
        flags = self.read_probes(values, tick)
        if self._gpm_ok and now_ns - self._gpm_t >= self._gpm_ns:
            t0 = perf_ns()
            try:
                flags |= self._read_gpm(values, now_ns)
                self._gpm_probe.record(perf_ns() - t0)
            except Exception as exc:  # noqa: BLE001 - vendor boundary
                kind, what, key = self.classify(exc)
                if kind == LOST:
                    self.fail(Probe("gpm", lambda v: None, ()), exc)  # raises DeviceLost
                self._gpm_fails += 1
                if kind == ABSENT or self._gpm_fails >= MAX_FAILS_IN_A_ROW:
                    self._absent_gpm(what)
                else:
                    idx = self.info.visible_index
                    self.errors.once((idx, "gpm", key), "metric", f"gpu{idx}: GPM: {what} (retrying)", idx, "gpm")
                self._gpm_t = now_ns  # retry on the GPM cadence, not every row
        raw = self._throttle_raw
        return flags, raw & NVML_REASON_MASK, raw

    def probe_stats(self) -> dict[str, Any]:
        out = super().probe_stats()
        if self._gpm_probe.calls:
            out["gpm"] = self._gpm_probe.stats()
        return out

    def close(self) -> None:
        for sample in self._gpm_samples:
            with contextlib.suppress(Exception):  # best effort at close
                self.nv.nvmlGpmSampleFree(sample)
        self._gpm_samples = []


class NvmlBackend(Backend):
    name = "nvml"

    def __init__(self, errors: ErrorLog, *, env: Mapping[str, str] | None = None, pids: Collection[int] | None = None,
                 interval_s: float = 0.01, gpm_interval_s: float | None = None,
                 slow_interval_s: float = SLOW_INTERVAL_S, moved_interval_s: float = MOVED_INTERVAL_S, nv: Any = None) -> None:
        self.nv = nv if nv is not None else import_pynvml()
        self.errors = errors
        try:
            self.nv.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - vendor boundary: library missing, driver not loaded
            raise Unavailable(f"NVML: {_text(exc)}") from None
        self._env = os.environ if env is None else env
        self._pids = (os.getpid(),) if pids is None else pids
        self._interval_s = interval_s
        self._gpm_interval_s = max(GPM_MIN_INTERVAL_S, interval_s if gpm_interval_s is None else gpm_interval_s)
        self._slow_every = max(1, round(slow_interval_s / interval_s)) if interval_s > 0 else 1
        self._moved_every = max(1, round(moved_interval_s / interval_s)) if interval_s > 0 else 1
        self.notes: list[str] = []
        self.source = ""
        mode = config.sampler_gil()  # a value that is none of its modes: a warning and "process"
        if mode == "process":  # this backend runs in-process after all (start_sampler fell back, or a test)
            mode = "auto"
        self._profile = config.sampler_profile()
        # the real library only: a mocked module's calls cost what the mock costs, not NVML
        self._released = direct_library(self.nv, hold_gil=False)
        self._direct = direct_library(self.nv) if mode == "auto" and self._released is not None else None
        self._calibrate = self._released is not None
        if self._direct is not None:
            self.gil = (f"auto: per-row calls with the GIL held (ctypes.PyDLL); calls slower than "
                        f"{SLOW_CALL_NS // 1000} us moved to every {moved_interval_s:g} s, GIL released")
        elif self._released is not None:
            self.gil = f"release: every call releases the GIL (ctypes.CDLL); calls slower than {SLOW_CALL_NS // 1000} us moved to every {moved_interval_s:g} s"
        else:
            self.gil = "released per call (pynvml)"
        if self._profile:
            self.gil += "; profile: thread CPU per call recorded"

    def versions(self) -> dict[str, str]:
        driver = try_call(self.nv.nvmlSystemGetDriverVersion)
        out: dict[str, str] = {} if driver is None else {"driver": _text(driver)}
        cuda = try_call(self.nv.nvmlSystemGetCudaDriverVersion)
        if isinstance(cuda, int):
            out["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        return out

    def _physical(self, want_mig: bool) -> tuple[list[PhysicalGpu], list[Any]]:
        nv = self.nv
        gpus, handles = [], []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            migs: list[MigInstance] = []
            if want_mig and (try_call(nv.nvmlDeviceGetMigMode, h) or [0])[0] == 1:
                for k in range(try_call(nv.nvmlDeviceGetMaxMigDeviceCount, h) or 0):
                    mh = try_call(nv.nvmlDeviceGetMigDeviceHandleByIndex, h, k)
                    if mh is not None:
                        migs.append(MigInstance(uuid=_text(try_call(nv.nvmlDeviceGetUUID, mh) or ""),
                                                gpu_instance_id=try_call(nv.nvmlDeviceGetGpuInstanceId, mh) or -1,
                                                compute_instance_id=try_call(nv.nvmlDeviceGetComputeInstanceId, mh) or -1,
                                                index=k))
            gpus.append(PhysicalGpu(index=i, uuid=_text(nv.nvmlDeviceGetUUID(h)),
                                    name=_text(try_call(nv.nvmlDeviceGetName, h) or ""), mig=tuple(migs)))
            handles.append(h)
        return gpus, handles

    def devices(self) -> list[Device]:
        nv = self.nv
        gpus, handles = self._physical("MIG" in self._env.get("CUDA_VISIBLE_DEVICES", "").upper())
        vis = nvidia_visible(gpus, self._env)
        self.notes.extend(vis.notes)
        self.source = vis.source
        out: list[Device] = []
        for g in vis.gpus:
            parent = handles[g.physical_index]
            h = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, g.mig.index) if g.mig is not None else parent
            gpm_support = try_call(nv.nvmlGpmQueryDeviceSupport, parent)
            mem = try_call(nv.nvmlDeviceGetMemoryInfo, h)
            limit_mw = try_call(nv.nvmlDeviceGetEnforcedPowerLimit, h)
            pci = try_call(nv.nvmlDeviceGetPciInfo, parent)
            info = DeviceInfo(vendor="nvidia", visible_index=g.visible_index, physical_index=g.physical_index,
                              name=_text(try_call(nv.nvmlDeviceGetName, h) or ""), uuid=g.uuid,
                              pci_bus_id=_text(pci.busId) if pci is not None else "", mig=g.mig is not None,
                              sm_clock_max_mhz=try_call(nv.nvmlDeviceGetMaxClockInfo, h, CLOCK_SM),
                              mem_clock_max_mhz=try_call(nv.nvmlDeviceGetMaxClockInfo, h, CLOCK_MEM),
                              mem_total_bytes=float(mem.total) if mem is not None else None,
                              power_limit_w=limit_mw * 1e-3 if isinstance(limit_mw, (int, float)) else None,
                              gpm=gpm_support is not None and bool(getattr(gpm_support, "isSupportedDevice", 0)))
            if not info.gpm:
                info.absent.extend(c for _, c in GPM_COLUMNS)
                self.errors.once((g.visible_index, "gpm"), "absent",
                                 f"gpu{g.visible_index}: GPM metrics absent (needs Hopper or later)", g.visible_index, "gpm")
            mig = g.mig
            out.append(NvmlDevice(self, h, info, parent if mig is not None else None, mig.gpu_instance_id if mig is not None else -1))
        return out

    def shutdown(self) -> None:
        try_call(self.nv.nvmlShutdown)
