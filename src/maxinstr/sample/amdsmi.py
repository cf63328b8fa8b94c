"""AMD devices through AMD SMI (the ``amdsmi`` package, imported when sampling starts).

``import amdsmi`` where ROCm is missing or partial prints and raises whatever its loader hits
(``KeyError`` in 7.0.2, ``OSError``, even ``SystemExit``): output captured, every exception but
KeyboardInterrupt an :class:`Unavailable`. A metric returning NOT_SUPPORTED (or "N/A") is dropped
and recorded once, never stopping sampling (``max benchmark`` dies there on Radeon, modular#7141).
"""

from __future__ import annotations

import contextlib
import functools
import io
import operator
import os
from collections.abc import Collection, Mapping
from typing import Any

from maxinstr.rundir.samples import GPM_METRICS, THROTTLE_BIT
from maxinstr.sample.base import (ABSENT, COL, LOST, RETRY, Backend, Device, DeviceInfo, ErrorLog, Probe, ProbeDevice,
                                  Unavailable, try_call)
from maxinstr.sample.devices import PhysicalGpu, amd_visible

# amdsmi_status_t values (amdsmi.h / amdsmi_wrapper.py), kept here so a mocked module cannot change them
STATUS_NOT_SUPPORTED = 2
STATUS_NOT_YET_IMPLEMENTED = 3
STATUS_NO_PERM = 10
STATUS_FILE_NOT_FOUND = 52
STATUS_NOT_FOUND = 31
STATUS_NOT_INIT = 32
STATUS_DRIVER_NOT_LOADED = 34
STATUS_AMDGPU_RESTART_ERR = 54

_ABSENT = {STATUS_NOT_SUPPORTED, STATUS_NOT_YET_IMPLEMENTED, STATUS_NO_PERM, STATUS_FILE_NOT_FOUND}
_LOST = {STATUS_NOT_FOUND, STATUS_NOT_INIT, STATUS_DRIVER_NOT_LOADED, STATUS_AMDGPU_RESTART_ERR}

MIB = 1024 * 1024

# amdgpu SMU "independent throttler" bits (linux drivers/gpu/drm/amd/pm/swsmu/inc/amdgpu_smu.h)
_INDEP_GROUPS: tuple[tuple[int, str], ...] = (
    (0x00000000000000FF, "sw_power_cap"),  # PPT0..3, SPL, FPPT, SPPT, SPPT_APU
    (0x0000000000FF0000, "current_limit"),  # TDC_*, EDC_*, APCC
    (0x00000FFF00000000, "hw_thermal"),  # TEMP_* (gpu, core, mem, edge, hotspot, vr, liquid)
    (0x0000F00000000000, "hw_slowdown"),  # VRHOT0/1, PROCHOT_CPU/GFX
    (0x0100000000000000, "sw_power_cap"),  # PPM
    (0x0200000000000000, "throttled_unknown"),  # FIT
)

# amdsmi_get_violation_status() "active_*" flags (MI300 and later) -> neutral bits
_VIOLATIONS: tuple[tuple[str, str], ...] = (
    ("active_ppt_pwr", "sw_power_cap"),
    ("active_socket_thrm", "hw_thermal"),
    ("active_vr_thrm", "hw_thermal"),
    ("active_hbm_thrm", "hw_thermal"),
    ("active_prochot_thrm", "hw_slowdown"),
)


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_import_failure: str | None = None  # a failed import is not retried in this process (it costs ~20 ms)


def import_amdsmi() -> Any:
    """The amdsmi module, or :class:`Unavailable` (remembered for the process's life)."""
    global _import_failure
    if _import_failure is not None:
        raise Unavailable(_import_failure)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            import amdsmi  # optional (maxinstr[amd]), and only when sampling starts
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - incl. SystemExit: a library must not end the user's run
        said = _one_line(out.getvalue())
        if isinstance(exc, ModuleNotFoundError):
            why = "amdsmi is not installed: pip install 'maxinstr[amd]'" if exc.name == "amdsmi" else f"amdsmi failed to import: {exc}"
        elif "libamd_smi.so" in f"{exc} {said}":
            # the package without ROCm's library: no advice to install amd-smi-lib on an NVIDIA machine
            why = "no AMD SMI library (libamd_smi.so not found: no ROCm here)"
        else:
            why = f"amdsmi failed to import ({type(exc).__name__}: {exc})" + (f"; it said: {said}" if said else "")
        _import_failure = why
        raise Unavailable(why) from None
    return amdsmi


def decode_indep_throttle(raw: int) -> int:
    """Neutral throttle bits for an amdgpu ``indep_throttle_status`` mask."""
    return functools.reduce(operator.or_, (THROTTLE_BIT[name] for mask, name in _INDEP_GROUPS if raw & mask), 0)


def _num(value: Any) -> float:
    """A number from amdsmi, which says "N/A" (a str) for an unsupported field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _NotAvailable(repr(value))
    return float(value)


class _NotAvailable(Exception):
    """amdsmi returned "N/A" for a field: the device does not report it."""


class AmdSmiDevice(ProbeDevice):
    def __init__(self, smi: Any, handle: Any, info: DeviceInfo, errors: ErrorLog, *,
                 pids: Collection[int] | None, slow_every: int) -> None:
        self.smi = smi
        self.h = handle
        self.info = info
        self.errors = errors
        self._slow_every = max(1, slow_every)
        self._throttle_bits = self._throttle_raw = 0
        self._fast = self._fast_probes()
        self._slow = self._slow_probes(pids)

    def _fast_probes(self) -> tuple[Probe, ...]:
        smi, h = self.smi, self.h
        c_gpu, c_mem, c_used = COL["gpu_util_pct"], COL["mem_util_pct"], COL["mem_used_bytes"]
        c_sm, c_mclk, c_pow, c_en = COL["sm_clock_mhz"], COL["mem_clock_mhz"], COL["power_w"], COL["energy_j"]
        gfx, mem = smi.AmdSmiClkType.GFX, smi.AmdSmiClkType.MEM

        def activity(v: list) -> None:
            a = smi.amdsmi_get_gpu_activity(h)
            v[c_gpu] = _num(a["gfx_activity"])
            umc = a.get("umc_activity")
            if isinstance(umc, (int, float)) and not isinstance(umc, bool):
                v[c_mem] = umc

        def vram(v: list) -> None:
            v[c_used] = _num(smi.amdsmi_get_gpu_vram_usage(h)["vram_used"]) * MIB

        def gfx_clock(v: list) -> None:
            v[c_sm] = _num(smi.amdsmi_get_clock_info(h, gfx)["clk"])

        def mem_clock(v: list) -> None:
            v[c_mclk] = _num(smi.amdsmi_get_clock_info(h, mem)["clk"])

        def power(v: list) -> None:
            p = smi.amdsmi_get_power_info(h)
            for key in ("current_socket_power", "average_socket_power", "socket_power"):
                value = p.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                    v[c_pow] = value
                    return
            raise _NotAvailable("no socket power")

        def energy(v: list) -> None:
            e = smi.amdsmi_get_energy_count(h)
            # 'energy_accumulator' (ROCm >= 6.1) or 'power' (older); units of counter_resolution uJ
            count = e.get("energy_accumulator", e.get("power"))
            v[c_en] = _num(count) * _num(e["counter_resolution"]) * 1e-6

        def violations(v: list) -> None:
            status = smi.amdsmi_get_violation_status(h)
            for key, name in _VIOLATIONS:
                if status.get(key) is True:
                    self._throttle_bits |= THROTTLE_BIT[name]

        return (Probe("gpu_util_pct", activity, ("gpu_util_pct", "mem_util_pct")), Probe("mem_used_bytes", vram),
                Probe("sm_clock_mhz", gfx_clock), Probe("mem_clock_mhz", mem_clock), Probe("power_w", power),
                Probe("energy_j", energy), Probe("violation_status", violations, ()))

    def _slow_probes(self, pids: Collection[int] | None) -> tuple[Probe, ...]:
        smi, h = self.smi, self.h
        c_proc, c_temp = COL["proc_mem_bytes"], COL["temp_c"]
        watched = None if pids is None else frozenset(pids)
        hotspot, current = smi.AmdSmiTemperatureType.HOTSPOT, smi.AmdSmiTemperatureMetric.CURRENT

        def proc_mem(v: list) -> None:
            used = ((p.get("memory_usage") or {}).get("vram_mem") for p in smi.amdsmi_get_gpu_process_list(h)
                    if watched is None or p.get("pid") in watched)
            v[c_proc] = sum(u for u in used if isinstance(u, int))

        def temp(v: list) -> None:
            v[c_temp] = _num(smi.amdsmi_get_temp_metric(h, hotspot, current))

        # gpu_metrics is one large struct turned into a ~100-key dict in Python: slow cadence
        def metrics_throttle(v: list) -> None:
            m = smi.amdsmi_get_gpu_metrics_info(h)
            indep = m.get("indep_throttle_status")
            if isinstance(indep, int) and not isinstance(indep, bool):  # amdsmi < 7: the bitmask
                self._throttle_raw = indep
                self._throttle_bits |= decode_indep_throttle(indep)
            elif indep is True or m.get("throttle_status") is True:  # amdsmi 7: a bool, cause not given
                self._throttle_bits |= THROTTLE_BIT["throttled_unknown"]
            elif indep == "N/A" and m.get("throttle_status") == "N/A":
                raise _NotAvailable("throttle status N/A")

        return (Probe("proc_mem_bytes", proc_mem), Probe("temp_c", temp), Probe("throttle_status", metrics_throttle, ()))

    def classify(self, exc: Exception) -> tuple[str, str, object]:
        if isinstance(exc, _NotAvailable):
            return ABSENT, f"amdsmi returned {exc}", "n/a"
        if isinstance(exc, self.smi.AmdSmiLibraryException):
            code = getattr(exc, "err_code", None)
            what = f"amdsmi error {code}"
            return (LOST if code in _LOST else ABSENT if code in _ABSENT else RETRY), what, code
        if isinstance(exc, (KeyError, TypeError, AttributeError)):
            # the amdsmi version returns another shape (renamed key, older signature)
            return ABSENT, f"{type(exc).__name__}: {exc}", type(exc).__name__
        return RETRY, f"{type(exc).__name__}: {exc}", type(exc).__name__

    def read(self, values: list[float], tick: int, now_ns: int) -> tuple[int, int, int]:
        self._throttle_bits = self._throttle_raw = 0
        flags = self.read_probes(values, tick)
        return flags, self._throttle_bits, self._throttle_raw


class AmdSmiBackend(Backend):
    name = "amdsmi"

    def __init__(self, errors: ErrorLog, *, env: Mapping[str, str] | None = None,
                 pids: Collection[int] | None = None, interval_s: float = 0.01,
                 slow_interval_s: float = 0.1, smi: Any = None) -> None:
        self.smi = smi if smi is not None else import_amdsmi()
        self.errors = errors
        try:
            self.smi.amdsmi_init(self.smi.AmdSmiInitFlags.INIT_AMD_GPUS)
        except Exception as exc:  # noqa: BLE001 - vendor boundary
            raise Unavailable(f"amdsmi_init failed: {type(exc).__name__}: {_one_line(str(exc))}") from None
        self._env = os.environ if env is None else env
        self._pids = (os.getpid(),) if pids is None else pids
        self._slow_every = max(1, round(slow_interval_s / interval_s)) if interval_s > 0 else 1
        self.notes: list[str] = []
        self.source = ""

    def versions(self) -> dict[str, str]:
        version = getattr(self.smi, "__version__", None)
        return {"amdsmi": version} if isinstance(version, str) else {}

    def devices(self) -> list[Device]:
        smi = self.smi
        handles = list(smi.amdsmi_get_processor_handles())
        gpus = [PhysicalGpu(index=i, uuid=str(try_call(smi.amdsmi_get_gpu_device_uuid, h) or "")) for i, h in enumerate(handles)]
        vis = amd_visible(gpus, self._env)
        self.notes.extend(vis.notes)
        self.source = vis.source
        out: list[Device] = []
        for g in vis.gpus:
            h = handles[g.physical_index]
            asic = try_call(smi.amdsmi_get_gpu_asic_info, h) or {}
            vram = try_call(smi.amdsmi_get_gpu_vram_usage, h) or {}
            gfx = try_call(smi.amdsmi_get_clock_info, h, smi.AmdSmiClkType.GFX) or {}
            mem = try_call(smi.amdsmi_get_clock_info, h, smi.AmdSmiClkType.MEM) or {}
            total = vram.get("vram_total")
            info = DeviceInfo(vendor="amd", visible_index=g.visible_index, physical_index=g.physical_index,
                              name=str(asic.get("market_name", "")), uuid=g.uuid,
                              pci_bus_id=str(try_call(smi.amdsmi_get_gpu_device_bdf, h) or ""),
                              sm_clock_max_mhz=gfx.get("max_clk") if isinstance(gfx.get("max_clk"), int) else None,
                              mem_clock_max_mhz=mem.get("max_clk") if isinstance(mem.get("max_clk"), int) else None,
                              mem_total_bytes=float(total) * MIB if isinstance(total, int) else None,
                              gpm=False, absent=list(GPM_METRICS))
            out.append(AmdSmiDevice(smi, h, info, self.errors, pids=self._pids, slow_every=self._slow_every))
        return out

    def shutdown(self) -> None:
        try_call(self.smi.amdsmi_shut_down)
