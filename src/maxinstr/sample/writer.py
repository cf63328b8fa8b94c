"""The sampler thread: reads every visible device at a fixed rate and appends one fixed-size row
per device to ``samples.bin`` (:mod:`maxinstr.rundir.samples`), in one ``os.write`` per flush
interval (a SIGKILL loses at most that). ``samples.json`` is replaced atomically at start, at a
new error and at stop. Nothing here raises into the user's program: failures go to ``errors``.
"""

from __future__ import annotations

import contextlib
import array
import atexit
import json
import os
import struct
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from maxinstr._files import open_write, real_dirs, replace_atomic
from maxinstr._threads import start_thread
from maxinstr.rundir.samples import (FLAG_GPM, FLAG_LOST, FLAG_SLOW, METRICS, ROW_FORMAT, ROW_SIZE, SAMPLES_FILE,
                                     SAMPLES_FORMAT, SAMPLES_LAYOUT_FILE, SAMPLES_VERSION, THROTTLE_BITS, row_layout)
from maxinstr.sample import amdsmi, nvml
from maxinstr.sample.base import NAN, Backend, Device, DeviceLost, ErrorLog, NullBackend, Unavailable, try_call

clock_ns: Callable[[], int]
try:  # the native core's clock (CLOCK_MONOTONIC ns, the clock stage records use)
    from maxinstr._native import clock_ns
except Exception:  # noqa: BLE001 - no native build: time.monotonic_ns is CLOCK_MONOTONIC on Linux
    clock_ns = time.monotonic_ns

DEFAULT_INTERVAL_S = 0.01
"""100 Hz: fast enough to see a decode step. Cost measured in docs/benchmarks.md (target <= 1%)."""
_COST_RING = 8192  # recent per-tick costs kept for percentiles
_U32_MAX = 0xFFFFFFFF


def open_backend(errors: ErrorLog, *, interval_s: float = DEFAULT_INTERVAL_S, env: Mapping[str, str] | None = None,
                 pids: Collection[int] | None = None, prefer: str | None = None) -> tuple[Backend, str]:
    """``(backend, "")`` for the first vendor with a visible device (NVML, then AMD SMI; ``prefer``:
    only that one), or ``(NullBackend, why)``. Never raises."""
    reasons: list[str] = []
    for name in [prefer] if prefer else ["nvml", "amdsmi"]:
        try:
            backend: Any = (nvml.NvmlBackend if name == "nvml" else amdsmi.AmdSmiBackend)(
                errors, env=env, pids=pids, interval_s=interval_s)
            count = (backend.nv.nvmlDeviceGetCount() if name == "nvml"
                     else len(backend.smi.amdsmi_get_processor_handles()))
        except Unavailable as exc:
            reasons.append(str(exc))
            continue
        except Exception as exc:  # noqa: BLE001 - a vendor module misbehaving: try the next one
            reasons.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if count:
            return backend, ""
        backend.shutdown()
        reasons.append(f"{name}: no GPUs")
    return NullBackend("; ".join(reasons)), "; ".join(reasons) or "no GPU library"


class Sampler:
    """A running (or finished) sampler for one part directory. Use :meth:`stop`."""

    def __init__(self, part_dir: Path, interval_s: float, backend: Backend, *, unavailable: str = "",
                 notes: list[str] | None = None, errors: ErrorLog | None = None, pids: list[int] | None = None,
                 extra: dict[str, Any] | None = None, flush_interval_s: float = 0.1, only: Any = None) -> None:
        self.part_dir = Path(part_dir)
        self.interval_s = interval_s
        self.flush_interval_s = flush_interval_s
        self.only = None if only is None else set(int(i) for i in only)
        self.backend = backend
        self.unavailable = unavailable
        self.notes = list(notes or [])
        self.errors = errors or ErrorLog(clock_ns)
        self.errors.on_new = self._on_new_error
        self.pids = pids
        self.extra = dict(extra or {})
        self.devices: list[Device] = []
        self._json_lock = threading.Lock()
        self._stop_evt = threading.Event()
        self._thread: threading.Thread | None = None
        self._fd = -1
        self._stopped = False
        self.started_ns = clock_ns()
        self.stopped_ns: int | None = None
        self._pid = os.getpid()
        # cost accounting (written by the thread only)
        self.ticks = self.rows = self.missed_ticks = 0
        self._cost_sum_ns = self._cost_max_ns = self._thread_cpu_ns = 0
        self._costs = array.array("q", bytes(8 * _COST_RING))

    def start(self) -> Sampler:
        try:
            real_dirs(self.part_dir.parent, self.part_dir)  # the part folder: no planted link (parts/ is the session's)
            if not self.unavailable:
                try:
                    self.devices = self.backend.devices()
                except Exception as exc:  # noqa: BLE001 - vendor boundary: enumeration failed
                    self.unavailable = f"{self.backend.name}: listing devices failed: {type(exc).__name__}: {exc}"
                    self.devices = []
            self.notes.extend(getattr(self.backend, "notes", []))
            if self.only is not None and self.devices:
                keep = [d for d in self.devices if d.info.visible_index in self.only]
                for d in self.devices:
                    if d not in keep:
                        d.close()
                self.devices = keep
            self._fd = open_write(self.part_dir / SAMPLES_FILE)
            self.write_json("running")
            if self.devices:
                self._thread = start_thread(self._run, "maxinstr-sampler")
                atexit.register(self.stop)
        except Exception as exc:  # noqa: BLE001 - the sampler never raises into the user's program
            self.errors.once(("start",), "internal", f"sampler did not start: {type(exc).__name__}: {exc}")
        return self

    def stop(self) -> None:
        """Stop the thread, write the final samples.json, close the vendor library. Never raises."""
        if self._stopped:
            return
        self._stopped = True
        if os.getpid() != self._pid:  # a forked child's copy (no thread): the part is the parent's
            return
        leak_fd = False  # a vendor call hangs (a wedged GPU): a reused descriptor would take the thread's late writes
        try:
            atexit.unregister(self.stop)
            self._stop_evt.set()
            if self._thread is not None:
                self._thread.join(timeout=max(2.0, 5 * self.interval_s))
                if self._thread.is_alive():
                    leak_fd = True
                    self.errors.once(("hung",), "internal", "sampler thread did not stop within "
                                     f"{max(2.0, 5 * self.interval_s):g} s (a vendor call hangs); left running")
            self.stopped_ns = clock_ns()
            for dev in self.devices:
                try_call(dev.close)
            try_call(self.backend.shutdown)
            self.write_json("closed")
        except Exception:  # noqa: BLE001 - never raise at stop
            pass
        finally:
            if self._fd >= 0 and not leak_fd:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = -1

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        cpu0 = time.thread_time_ns()
        try:
            self._loop()
        except Exception as exc:  # noqa: BLE001 - a bug here must not reach the user
            self.errors.once(("thread",), "internal", f"sampler thread stopped: {type(exc).__name__}: {exc}")
        finally:
            self._thread_cpu_ns = time.thread_time_ns() - cpu0

    def _loop(self) -> None:
        active = list(enumerate(self.devices))  # (row device index, device)
        n_metrics = len(METRICS)
        template = [NAN] * n_metrics
        values = [NAN] * n_metrics
        interval_ns = max(1, int(self.interval_s * 1e9))
        flush_ns = max(interval_ns, int(self.flush_interval_s * 1e9))
        # rows of up to one flush interval (+1 tick of slack) are packed here, then written at once
        ticks_per_flush = flush_ns // interval_ns + 1
        buf = bytearray(ROW_SIZE * max(1, len(active)) * ticks_per_flush)
        view = memoryview(buf)
        cap = len(buf)
        pack_into = struct.Struct(ROW_FORMAT).pack_into
        fd = self._fd
        wait = self._stop_evt.wait
        sleep = time.sleep
        costs, ring = self._costs, _COST_RING
        clock = clock_ns
        tick = 0
        off = 0
        next_ns = clock()
        last_flush = next_ns
        try:
            while active and not self._stop_evt.is_set():
                t_tick = clock()
                lost: list[int] = []
                for k, (index, dev) in enumerate(active):
                    values[:] = template
                    t0 = clock()
                    try:
                        flags, bits, raw = dev.read(values, tick, t0)
                    except Exception as exc:  # noqa: BLE001 - DeviceLost, or a vendor module bug: stop that device
                        if not isinstance(exc, DeviceLost):
                            vis = dev.info.visible_index
                            self.errors.once((vis, "internal"), "internal",
                                             f"gpu{vis}: sampling stopped: {type(exc).__name__}: {exc}", vis)
                        flags, bits, raw = FLAG_LOST, 0, 0
                        lost.append(k)
                    read_ns = clock() - t0
                    pack_into(buf, off, t0, index, flags, read_ns if read_ns < _U32_MAX else _U32_MAX, bits, raw, *values)
                    off += ROW_SIZE
                self.rows += len(active)
                if lost:
                    active = [a for k, a in enumerate(active) if k not in lost]
                now = clock()
                # os.write releases the GIL (retaking it can wait the 5 ms switch interval): once a flush
                if now - last_flush >= flush_ns or off + ROW_SIZE * len(active) > cap or lost:
                    os.write(fd, view[:off])
                    off = 0
                    last_flush = now
                cost = clock() - t_tick
                costs[tick % ring] = cost
                self._cost_sum_ns += cost
                if cost > self._cost_max_ns:
                    self._cost_max_ns = cost
                tick += 1
                self.ticks = tick
                next_ns += interval_ns
                now = clock()
                if next_ns <= now:  # fell behind (GIL held by the program, slow vendor call): skip, don't burst
                    skipped = (now - next_ns) // interval_ns + 1
                    self.missed_ticks += skipped
                    next_ns += skipped * interval_ns
                delay = (next_ns - now) * 1e-9
                # time.sleep is one syscall, Event.wait ~2x the CPU: the event only for long waits (stop)
                if delay <= 0.05:
                    sleep(delay)
                else:
                    wait(delay)
        finally:
            if off:
                os.write(fd, view[:off])

    def _on_new_error(self) -> None:
        if self._fd >= 0 and not self._stopped:
            self.write_json("running")

    def cost_summary(self) -> dict[str, Any]:
        n = min(self.ticks, _COST_RING)
        out: dict[str, Any] = {"ticks": self.ticks, "rows": self.rows, "missed_ticks": self.missed_ticks}
        if n:
            import numpy as np  # not at the top: the sampler's child process samples without it

            recent = np.frombuffer(self._costs, dtype=np.int64)[:n]
            out["per_tick_ns"] = {
                "mean": self._cost_sum_ns / self.ticks,
                "p50": float(np.percentile(recent, 50)),
                "p99": float(np.percentile(recent, 99)),
                "max": self._cost_max_ns,
                "percentiles_over_last_ticks": int(n),
            }
            out["per_device_row_ns_mean"] = self._cost_sum_ns / max(1, self.rows)
        probes: dict[str, Any] = {}
        for d in self.devices:
            stats = try_call(d.probe_stats)
            if stats:
                probes[str(d.info.visible_index)] = stats
        if probes:
            # per metric and GPU: cadence, calls, ns per call (docs/sampler.md "What a sample costs")
            out["probes"] = probes
        if self.stopped_ns is not None and self._thread_cpu_ns:
            elapsed = max(1, self.stopped_ns - self.started_ns)
            out["thread_cpu_ns"] = self._thread_cpu_ns
            out["thread_cpu_pct"] = 100.0 * self._thread_cpu_ns / elapsed
        return out

    def write_json(self, status: str) -> None:
        doc: dict[str, Any] = {
            "format": SAMPLES_FORMAT, "version": SAMPLES_VERSION, "status": status, "clock": "CLOCK_MONOTONIC",
            "backend": self.backend.name if not self.unavailable else "none", "unavailable": self.unavailable or None,
            "backend_versions": try_call(self.backend.versions) or {},
            "visible": getattr(self.backend, "source", "") or None, "gil": getattr(self.backend, "gil", None),
            "interval_s": self.interval_s, "flush_interval_s": max(self.interval_s, self.flush_interval_s),
            **self.extra,
            "row": row_layout(), "flags": {"GPM": FLAG_GPM, "SLOW": FLAG_SLOW, "LOST": FLAG_LOST},
            "throttle_bits": [{"bit": i, "name": n, "group": g} for i, (n, g) in enumerate(THROTTLE_BITS)],
            "devices": [d.info.to_json() for d in self.devices], "pids": self.pids,
            "started_ns": self.started_ns, "stopped_ns": self.stopped_ns, "cost": self.cost_summary(),
            "notes": self.notes, "errors": self.errors.snapshot(),
        }
        with self._json_lock:
            replace_atomic(self.part_dir / SAMPLES_LAYOUT_FILE,
                           (json.dumps(_finite(doc), indent=1, allow_nan=False, default=str) + "\n").encode())


def _finite(obj: Any) -> Any:  # JSON cannot hold NaN: non-finite floats become None
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
