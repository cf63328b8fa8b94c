"""GPU sampling: a background thread (or process) records utilization, SM activity, memory,
clocks, power/energy, temperature and throttling of every visible GPU into a part folder.

    handle = start_sampler(part_dir, interval_s=0.01)   # started by maxinstr.session(...)
    handle.stop()                                       # never raises

Vendors sit behind :mod:`maxinstr.sample.base` (NVML in ``nvml.py``, AMD SMI in ``amdsmi.py``,
a null backend when neither is there); the files are :mod:`maxinstr.rundir.samples`.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from maxinstr import config
from maxinstr.sample.base import Backend, ErrorLog
from maxinstr.sample.writer import DEFAULT_INTERVAL_S, Sampler, clock_ns, open_backend

if TYPE_CHECKING:  # pragma: no cover
    from maxinstr.rundir.reader import Samples

__all__ = ["DEFAULT_INTERVAL_S", "SessionSampler", "open_backend", "read_samples", "sampler_mode", "start_sampler"]

MIN_INTERVAL_S = 0.0005
_VISIBILITY_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def start_sampler(part_dir: Path | str, interval_s: float = DEFAULT_INTERVAL_S, *, pids: Collection[int] | None = None,
                  env: Mapping[str, str] | None = None, backend: Backend | None = None,
                  extra: dict[str, Any] | None = None, flush_interval_s: float = 0.1,
                  devices: Collection[int] | None = None, mode: str | None = None) -> Sampler:
    """Start sampling every visible GPU (``devices``: these visible indices) into ``part_dir``;
    rows reach the file every ``flush_interval_s``. ``pids``: whose GPU memory is
    ``proc_mem_bytes`` (default: this process). By default (``mode`` or ``MAXINSTR_SAMPLER_GIL``:
    ``process``) NVIDIA GPUs are sampled by a child process
    (:class:`~maxinstr.sample.process.ProcessSampler`), else (or when it cannot start) by a thread here
    (:class:`~maxinstr.sample.writer.Sampler`); both have ``stop()``, ``running``, ``devices``,
    ``unavailable``, ``notes``. Never raises; with no GPU samples.json says why."""
    errors = getattr(backend, "errors", None) if backend is not None else None
    if not isinstance(errors, ErrorLog):
        errors = ErrorLog(clock_ns)
    notes: list[str] = []
    try:
        interval = float(interval_s)
        if not interval >= MIN_INTERVAL_S:  # also catches NaN
            notes.append(f"interval_s={interval_s!r} raised to {MIN_INTERVAL_S}")
            interval = MIN_INTERVAL_S
    except (TypeError, ValueError):
        notes.append(f"interval_s={interval_s!r} is not a number; {DEFAULT_INTERVAL_S} used")
        interval = DEFAULT_INTERVAL_S
    pid_list = [os.getpid()] if pids is None else list(pids)

    unavailable = ""
    if backend is None:
        backend, unavailable = open_backend(errors, interval_s=interval, env=env, pids=pid_list)
        # a child process for the real NVML library only (not mocks, not AMD yet)
        real_nvml = backend.name == "nvml" and getattr(backend, "_released", None) is not None
        if not unavailable and (mode or sampler_mode()) == "process" and real_nvml:
            child_extra = {**(extra or {}), **({"parent_notes": notes} if notes else {})}
            child = _start_child(Path(part_dir), interval, pid_list, devices, flush_interval_s, env, notes, child_extra)
            if child is not None:
                backend.shutdown()  # the child has its own
                return child
    sampler = Sampler(Path(part_dir), interval, backend, unavailable=unavailable, notes=notes, errors=errors,
                      pids=pid_list, extra=extra, flush_interval_s=flush_interval_s, only=devices)
    return sampler.start()


class SessionSampler:
    """The sampler as a session attaches it (:class:`maxinstr.kernels.base.Collector`): its own
    thread or process writes the samples, so :meth:`flush` has nothing to do."""

    name = "sampler"

    def __init__(self, part_dir: Path | str, interval_s: float) -> None:
        self.part_dir = part_dir
        self.interval_s = interval_s
        self.handle: Any = None

    def start(self) -> None:
        self.handle = start_sampler(self.part_dir, self.interval_s)

    def flush(self, final: bool = False) -> None:
        return None

    def stop(self) -> dict[str, Any]:
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.stop()
        return {}


def sampler_mode() -> str:
    """``MAXINSTR_SAMPLER_GIL``: ``process`` (default: a child process samples, your GIL is never
    touched), ``auto`` (a thread here: cheap calls with the GIL held, slow ones moved and
    released) or ``release`` (a thread here, GIL released on every call)."""
    return config.sampler_gil()


def _start_child(part_dir: Path, interval: float, pids: list[int], devices: Collection[int] | None,
                 flush_interval_s: float, env: Mapping[str, str] | None, notes: list[str],
                 extra: dict[str, Any]) -> Any:
    try:
        # not at the top: `python -m maxinstr.sample.process` would find it imported (runpy warns)
        from maxinstr.sample.process import ProcessSampler

        child_env = dict(os.environ)
        if env is not None:  # the caller's view of device visibility, not ours
            for key in _VISIBILITY_ENV:
                child_env.pop(key, None)
                if key in env:
                    child_env[key] = env[key]
        child = ProcessSampler(part_dir, interval, pids=pids, devices=devices, flush_interval_s=flush_interval_s,
                               env=child_env, extra=extra)
        if child.start():
            return child
        notes.append(f"the sampler process did not start ({child.failure}); sampling in this process")
    except Exception as exc:  # noqa: BLE001 - fall back to the in-process sampler
        notes.append(f"the sampler process did not start ({type(exc).__name__}: {exc}); sampling in this process")
    return None


def read_samples(part_dir: Path | str) -> Samples:
    """The samples of one part folder as numpy columns (:func:`maxinstr.rundir.reader.read_samples`)."""
    # here, not at the top: the run reader and numpy stay out of the sampler's child process
    from maxinstr.rundir.reader import read_samples as read

    return read(part_dir)
