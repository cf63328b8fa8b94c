"""Modular MAX helpers: the native stream of a MAX device, and MAX's own profiling markers.

MAX runs a graph on the device's *default queue*, a non-blocking CUDA/HIP stream of its own.
Events on the legacy default stream (maxinstr's default, `stream=0`) do not wait for work on a
non-blocking stream, so a stage around `model.execute(...)` must record its events on MAX's
queue to time the GPU work:

    from max.driver import Accelerator
    from maxinstr.integrations.max import max_stream_handle

    device = Accelerator()
    with maxinstr.stage("decode", stream=max_stream_handle(device)):
        model.execute(...)

`enable_max_profiling()` turns on MAX's own NVTX ranges (its `Tracer` spans and per-op markers),
which then nest under maxinstr's stage ranges in an nsys timeline.

`max` is never imported at module import time: importing this module costs nothing and works
where MAX is not installed.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Literal

ProfilingLevel = Literal["off", "on", "detailed"]
_LEVELS: tuple[str, ...] = ("off", "on", "detailed")


def max_stream_handle(device_or_queue: Any, *, make_context_current: bool = True) -> int | None:
    """The native stream (CUstream / hipStream_t, as an int) of a MAX device's default queue.

    Takes a `max.driver.Device` (Accelerator or CPU) or a `max.driver.DeviceQueue`. Returns
    `None` for a CPU device (its queue has no native handle) or for anything that is not a MAX
    device, so `maxinstr.stage(..., stream=max_stream_handle(device))` records host times only
    there instead of timing the wrong stream.

    With `make_context_current` (default), a CUDA stream's own context is made current on the
    calling thread when none is: maxinstr times stages only on a thread with a current context,
    and MAX's runtime need not leave one on yours. Call it on the thread that enters the stages.
    """
    if device_or_queue is None:
        return None
    queue = getattr(device_or_queue, "default_queue", device_or_queue)
    try:
        handle = int(queue.native_stream_handle)
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return None
    if handle and make_context_current:
        from maxinstr.integrations._cuda import ensure_stream_context

        ensure_stream_context(handle)
    return handle or None


def max_accelerator() -> Any:
    """The first MAX accelerator, or the host CPU device when MAX finds no accelerator.

    Raises ImportError when MAX is not installed (`pip install max`).
    """
    from max.driver import CPU, Accelerator, accelerator_count

    return Accelerator() if accelerator_count() > 0 else CPU()


def enable_max_profiling(level: ProfilingLevel = "detailed", session: Any = None) -> None:
    """Turn on MAX's own NVTX ranges so they nest under maxinstr's stages in nsys.

    - sets `MODULAR_ENABLE_PROFILING=level` in the environment (MAX reads it when it is first
      imported, and child processes inherit it);
    - when MAX is already imported, switches its runtime profiling state now;
    - with `session` (a `max.engine.InferenceSession`), calls `session.gpu_profiling(level)`,
      which adds MAX's kernel-level markers to graphs loaded *after* this call.

    `"detailed"` costs MAX some host time per op: profile with it, measure without it.
    """
    if level not in _LEVELS:
        raise ValueError(f"MAX profiling level must be one of {', '.join(_LEVELS)}, not {level!r}")
    os.environ["MODULAR_ENABLE_PROFILING"] = level
    # Only touch MAX's runtime when the user has already imported it: importing MAX costs
    # about a second and must not happen behind their back.
    if "max._core" in sys.modules or "max.engine" in sys.modules:
        try:
            from max._core.profiler import set_gpu_profiling_state
        except ImportError:  # a MAX build without the profiler: the env var is all we can do
            pass
        else:
            set_gpu_profiling_state(level)
    if session is not None:
        session.gpu_profiling(level)


def max_versions() -> dict[str, str]:
    """Versions of the MAX packages installed (empty when MAX is not installed); cheap."""
    from importlib import metadata

    out: dict[str, str] = {}
    for dist in ("max", "max-core", "mojo-compiler"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


__all__ = ["max_stream_handle", "max_accelerator", "enable_max_profiling", "max_versions"]
