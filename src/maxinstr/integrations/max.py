"""Modular MAX helpers (docs/max.md): the native stream of a MAX device's default queue (non-blocking: events
on the legacy default stream do not wait for it), and MAX's own markers, which abort the process where
NVTX's v2 entry points are missing (CUDA 13: :func:`provide_nvtx_v2`). `max` is imported only where needed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from maxinstr import config
from maxinstr.errors import MaxinstrError
from maxinstr.integrations.driver import ensure_stream_context
from maxinstr.integrations.driver import nvidia_driver_present as _nvidia_driver_present

ProfilingLevel = Literal["off", "on", "detailed"]
_LEVELS: tuple[str, ...] = ("off", "on", "detailed")


def max_stream_handle(device_or_queue: Any, *, make_context_current: bool = True) -> int | None:
    """The native stream (CUstream / hipStream_t) of a `max.driver.Device`'s or `DeviceQueue`'s queue; None for
    a CPU device or anything else (host times only). With `make_context_current`, the stream's context is
    made current on this thread when none is: call it on the thread that enters the stages."""
    if device_or_queue is None:
        return None
    queue = getattr(device_or_queue, "default_queue", device_or_queue)
    try:
        handle = int(queue.native_stream_handle)
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return None
    if handle and make_context_current:
        ensure_stream_context(handle)
    return handle or None


NVTX_V2_SYMBOL = "nvtxRangeStartEx"
# Libraries exporting NVTX's v2 entry points (as MAX's profiler shim names them): CUDA <= 12.8's libnvToolsExt,
# libnvtx3interop (CUDA 13, nvidia-nvtx-cu12 12.9); the wheels: nvidia-nvtx (CUDA 13), nvidia-nvtx-cu12
NVTX_V2_LIBRARIES = ("libnvToolsExt.so.1", "libnvToolsExt.so", "libnvtx3interop.so.1", "libnvtx3interop.so")
NVTX_V2_WHEEL_DIRS = ("nvidia/cu13/lib", "nvidia/nvtx/lib")
NVTX_V2_TOOLKIT_DIRS = ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
                        "/usr/local/cuda/targets/sbsa-linux/lib")
_nvtx_v2: str | None = None


class MaxProfilingUnavailable(MaxinstrError):
    """MAX's profiling markers were asked for where they would abort the process."""


def nvtx_v2_candidates(search_path: Iterable[str] | None = None, environ: Mapping[str, str] | None = None,
                       toolkit_dirs: Iterable[str] = NVTX_V2_TOOLKIT_DIRS) -> list[str]:
    """Files that may export NVTX's v2 entry points: the wheels' under ``search_path``, then ``CUDA_HOME``'s,
    then the toolkit's."""
    env = os.environ if environ is None else environ
    entries = sys.path if search_path is None else search_path
    dirs = [Path(entry) / sub for entry in entries if entry for sub in NVTX_V2_WHEEL_DIRS]
    cuda_home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if cuda_home:
        dirs += [Path(cuda_home) / "lib64", Path(cuda_home) / "lib"]
    dirs += [Path(d) for d in toolkit_dirs]
    return list(dict.fromkeys(str(d / name) for d in dirs for name in NVTX_V2_LIBRARIES if (d / name).is_file()))


def load_nvtx_v2(names_or_paths: Iterable[str]) -> str | None:
    """Load the first of ``names_or_paths`` exporting NVTX's v2 entry points, ``RTLD_GLOBAL``; its name or None."""
    for name_or_path in names_or_paths:
        try:
            lib = ctypes.CDLL(name_or_path, mode=os.RTLD_NOW | ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        if hasattr(lib, NVTX_V2_SYMBOL):
            return str(getattr(lib, "_name", name_or_path))
    return None


def provide_nvtx_v2() -> str | None:
    """Make NVTX's v2 entry points resolvable in this process: "process" when already, else the library, or None."""
    global _nvtx_v2
    if _nvtx_v2 is not None:
        return _nvtx_v2
    if config.no_nvtx_v2():
        return "disabled"  # diagnosis only: see what MAX does without it (benchmarks/device/65-max.sh)
    with contextlib.suppress(OSError):
        if hasattr(ctypes.CDLL(None), NVTX_V2_SYMBOL):
            _nvtx_v2 = "process"
            return _nvtx_v2
    # the loader's own search path first (LD_LIBRARY_PATH, ldconfig), then known folders
    _nvtx_v2 = load_nvtx_v2((*NVTX_V2_LIBRARIES, *nvtx_v2_candidates()))
    return _nvtx_v2


def max_profiling_problem() -> str | None:
    """Why MAX's markers would abort this process (a driver, no NVTX v2 library found), in one line, or None."""
    if provide_nvtx_v2() is not None or not _nvidia_driver_present():
        return None
    return ("MAX's profiling markers need NVTX's v2 library (one of " + ", ".join(NVTX_V2_LIBRARIES)
            + ") and none was found; without it MAX aborts at its first marker: pip install nvidia-nvtx "
            "(CUDA 13) or nvidia-nvtx-cu12, or put the CUDA toolkit's lib64 on LD_LIBRARY_PATH")


def enable_max_profiling(level: ProfilingLevel = "detailed", session: Any = None) -> None:
    """Turn on MAX's own NVTX ranges (docs/max.md): `MODULAR_ENABLE_PROFILING=level`, MAX's runtime state when
    MAX is imported, with `session` kernel markers for graphs loaded after this. Where they would abort
    MAX, `MaxProfilingUnavailable` is raised before MAX is touched."""
    if level not in _LEVELS:
        raise ValueError(f"MAX profiling level must be one of {', '.join(_LEVELS)}, not {level!r}")
    problem = max_profiling_problem() if level != "off" else None
    if problem is not None:
        raise MaxProfilingUnavailable(problem)
    os.environ["MODULAR_ENABLE_PROFILING"] = level
    # MAX's runtime only when the user has already imported it: importing MAX costs a second
    if "max._core" in sys.modules or "max.engine" in sys.modules:
        try:
            from max._core.profiler import set_gpu_profiling_state
        except ImportError:  # a MAX build without the profiler: the env var is all we can do
            pass
        else:
            set_gpu_profiling_state(level)
    if session is not None:
        session.gpu_profiling(level)


def max_versions() -> dict[str, str]:  # versions of the MAX packages installed (empty without MAX); cheap
    out: dict[str, str] = {}
    for dist in ("max", "max-core", "mojo-compiler"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


__all__ = ["MaxProfilingUnavailable", "enable_max_profiling", "max_profiling_problem", "max_stream_handle",
           "max_versions", "provide_nvtx_v2"]
