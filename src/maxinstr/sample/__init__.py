"""GPU sampling: a background thread that records utilization, SM activity, memory, clocks,
power/energy, temperature and throttling of every visible GPU into a run directory part.

    handle = start_sampler(part_dir, interval_s=0.01)   # started by maxinstr.session(...)
    ...
    handle.stop()                                       # never raises

Vendors sit behind :mod:`maxinstr.sample.base` (NVML in ``nvml.py``, AMD SMI in
``amdsmi.py``, a null backend when neither is there). ``read_samples`` reads what was
written; ``attribute.stage_samples`` turns samples into per-stage numbers.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from maxinstr.sample.base import Backend, ErrorLog
    from maxinstr.sample.read import Samples
    from maxinstr.sample.writer import Sampler

__all__ = ["DEFAULT_INTERVAL_S", "SessionSampler", "open_backend", "read_samples", "sampler_mode", "start_sampler"]

DEFAULT_INTERVAL_S = 0.01
"""100 Hz: fast enough to see a decode step. Cost measured in docs/benchmarks.md (target <= 1%)."""
MIN_INTERVAL_S = 0.0005


def open_backend(
    errors: ErrorLog,
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    env: Mapping[str, str] | None = None,
    pids: Collection[int] | None = None,
    prefer: str | None = None,
) -> tuple[Backend, str]:
    """The first vendor backend with at least one visible device: NVML, then AMD SMI.

    Returns ``(backend, "")`` or ``(NullBackend, reason)`` where ``reason`` says in one line
    why nothing could be sampled. ``prefer`` ("nvml" / "amdsmi") tries only that one.
    Never raises.
    """
    from maxinstr.sample.base import NullBackend

    reasons: list[str] = []
    order = [prefer] if prefer else ["nvml", "amdsmi"]
    for name in order:
        try:
            if name == "nvml":
                from maxinstr.sample import nvml

                try:
                    backend: Backend = nvml.NvmlBackend(errors, env=env, pids=pids, interval_s=interval_s)
                except nvml.Unavailable as exc:
                    reasons.append(str(exc))
                    continue
                count = backend.nv.nvmlDeviceGetCount()  # type: ignore[attr-defined]
            else:
                from maxinstr.sample import amdsmi

                try:
                    backend = amdsmi.AmdSmiBackend(errors, env=env, pids=pids, interval_s=interval_s)
                except amdsmi.Unavailable as exc:
                    reasons.append(str(exc))
                    continue
                count = len(backend.smi.amdsmi_get_processor_handles())
        except Exception as exc:  # noqa: BLE001 - a vendor module misbehaving: try the next one
            reasons.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if count:
            return backend, ""
        backend.shutdown()
        reasons.append(f"{name}: no GPUs")
    return NullBackend("; ".join(reasons)), "; ".join(reasons) or "no GPU library"


def start_sampler(
    part_dir: Path | str,
    interval_s: float = DEFAULT_INTERVAL_S,
    *,
    pids: Collection[int] | None = None,
    env: Mapping[str, str] | None = None,
    backend: Backend | None = None,
    extra: dict[str, Any] | None = None,
    flush_interval_s: float = 0.1,
    devices: Collection[int] | None = None,
    mode: str | None = None,
) -> Sampler:
    """Start sampling every visible GPU into ``part_dir/samples.bin`` (+ ``samples.json``).

    Rows reach the file every ``flush_interval_s`` (a SIGKILL loses at most that much).
    ``devices``: visible indices to sample (default: all). Under torchrun the session starts
    the sampler in local rank 0 only, which samples every GPU of the node once.
    ``pids``: processes whose GPU memory is recorded as ``proc_mem_bytes`` (default: this
    one). ``backend``: a ready backend (tests, benchmarks); default: :func:`open_backend`.
    Where: by default (``MAXINSTR_SAMPLER_GIL=process``, see :func:`sampler_mode`) NVIDIA GPUs
    are sampled by a child process (:mod:`maxinstr.sample.process`), so the sampler never
    takes this process's GIL; if the child cannot start, and for AMD, mocks and given
    backends, a thread in this process samples (``MAXINSTR_SAMPLER_GIL=auto``/``release`` ask
    for that; ``mode="process"|"auto"|"release"`` overrides the variable's choice of process or
    thread, e.g. ``"auto"`` where no user code shares the GIL). Returns the :class:`~maxinstr.sample.writer.Sampler` (or a
    :class:`~maxinstr.sample.process.ProcessSampler` with the same ``stop()``, ``running``,
    ``devices``, ``unavailable``, ``notes``); call ``.stop()`` when done. With no GPU, nothing
    runs and samples.json says why. Never raises.
    """
    from maxinstr.sample.base import ErrorLog, NullBackend
    from maxinstr.sample.writer import Sampler, clock_ns

    # a given backend already reports into its own log: share it
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
    try:
        if backend is None:
            backend, unavailable = open_backend(errors, interval_s=interval, env=env, pids=pid_list)
            if not unavailable and (mode or sampler_mode()) == "process" and _real_nvml(backend):
                child_extra = {**(extra or {}), **({"parent_notes": notes} if notes else {})}
                child = _start_child(Path(part_dir), interval, pid_list, devices, flush_interval_s, env, notes,
                                     child_extra)
                if child is not None:
                    backend.shutdown()  # the child has its own
                    return child
    except Exception as exc:  # noqa: BLE001 - open_backend never raises, but be sure
        backend, unavailable = NullBackend(str(exc)), str(exc)
    sampler = Sampler(Path(part_dir), interval, backend, unavailable=unavailable, notes=notes, errors=errors,
                      pids=pid_list, extra=extra, flush_interval_s=flush_interval_s, only=devices)
    return sampler.start()


class SessionSampler:
    """The sampler as a session attaches it: the start/flush/stop protocol of
    :class:`maxinstr.kernels.base.Collector`. :meth:`start` runs :func:`start_sampler` (which
    says in samples.json why nothing could be sampled, rather than raising); its own thread, or
    process, writes the samples, so :meth:`flush` has nothing to do."""

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


_VISIBILITY_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def sampler_mode() -> str:
    """``MAXINSTR_SAMPLER_GIL``: ``process`` (default: a child process samples, your GIL is never
    touched), ``auto`` (a thread here: cheap calls with the GIL held, slow ones moved and
    released) or ``release`` (a thread here, GIL released on every call)."""
    from maxinstr import config

    return config.sampler_gil()


def _real_nvml(backend: Any) -> bool:
    """A child process is used for the real NVML library only (not mocks, not AMD yet)."""
    return getattr(backend, "name", "") == "nvml" and getattr(backend, "_released", None) is not None


def _start_child(part_dir: Path, interval: float, pids: list[int], devices: Collection[int] | None,
                 flush_interval_s: float, env: Mapping[str, str] | None, notes: list[str],
                 extra: dict[str, Any]) -> Any:
    """A started :class:`~maxinstr.sample.process.ProcessSampler`, or None (why in ``notes``)."""
    try:
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
    """The samples of one part directory as numpy columns (see :mod:`maxinstr.sample.read`)."""
    from maxinstr.sample.read import read_samples as _read

    return _read(part_dir)
