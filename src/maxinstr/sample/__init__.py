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
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from maxinstr.sample.base import Backend, ErrorLog
    from maxinstr.sample.read import Samples
    from maxinstr.sample.writer import Sampler

__all__ = ["DEFAULT_INTERVAL_S", "open_backend", "read_samples", "start_sampler"]

DEFAULT_INTERVAL_S = 0.01
"""100 Hz: fast enough to see a decode step. Cost measured in docs/benchmarks.md (target <= 1%)."""
MIN_INTERVAL_S = 0.0005


def open_backend(
    errors: "ErrorLog",
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    env: Mapping[str, str] | None = None,
    pids: Collection[int] | None = None,
    prefer: str | None = None,
) -> "tuple[Backend, str]":
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
                count = len(backend.smi.amdsmi_get_processor_handles())  # type: ignore[attr-defined]
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
    backend: "Backend | None" = None,
    extra: dict[str, Any] | None = None,
    flush_interval_s: float = 0.1,
    devices: Collection[int] | None = None,
) -> "Sampler":
    """Start sampling every visible GPU into ``part_dir/samples.bin`` (+ ``samples.json``).

    Rows reach the file every ``flush_interval_s`` (a SIGKILL loses at most that much).
    ``devices``: visible indices to sample (default: all). Under torchrun the session starts
    the sampler in local rank 0 only, which samples every GPU of the node once.
    ``pids``: processes whose GPU memory is recorded as ``proc_mem_bytes`` (default: this
    one). ``backend``: a ready backend (tests, benchmarks); default: :func:`open_backend`.
    Returns the :class:`~maxinstr.sample.writer.Sampler`; call ``.stop()`` when done. With
    no GPU, no thread runs and samples.json says why. Never raises.
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
    except Exception as exc:  # noqa: BLE001 - open_backend never raises, but be sure
        backend, unavailable = NullBackend(str(exc)), str(exc)
    sampler = Sampler(Path(part_dir), interval, backend, unavailable=unavailable, notes=notes, errors=errors,
                      pids=pid_list, extra=extra, flush_interval_s=flush_interval_s, only=devices)
    return sampler.start()


def read_samples(part_dir: Path | str) -> "Samples":
    """The samples of one part directory as numpy columns (see :mod:`maxinstr.sample.read`)."""
    from maxinstr.sample.read import read_samples as _read

    return _read(part_dir)
