"""Make the CUDA context owning a stream current on this thread, as the CUDA runtime would: the core times
a stage on the GPU only where a context is current, and a framework may keep its own current only inside
its calls."""

from __future__ import annotations

import ctypes
import threading

from maxinstr import config

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


def _libcuda() -> ctypes.CDLL | None:
    global _lib, _tried
    with _lock:
        if not _tried:
            _tried = True
            try:
                _lib = ctypes.CDLL(config.cuda_library() or "libcuda.so.1")
                for name in ("cuCtxGetCurrent", "cuCtxSetCurrent", "cuStreamGetCtx"):
                    getattr(_lib, name)
            except (OSError, AttributeError):
                _lib = None
        return _lib


def nvidia_driver_present() -> bool:  # libcuda can be loaded in this process
    return _libcuda() is not None


def ensure_stream_context(stream_handle: int | None) -> bool:
    """Whether a CUDA context is current on this thread afterwards (the stream's own if none was). Never raises."""
    if not stream_handle:
        return False
    if (lib := _libcuda()) is None:
        return False
    current = ctypes.c_void_p()
    if lib.cuCtxGetCurrent(ctypes.byref(current)) != 0:
        return False
    if current.value:
        return True
    owner = ctypes.c_void_p()
    if lib.cuStreamGetCtx(ctypes.c_void_p(stream_handle), ctypes.byref(owner)) != 0 or not owner.value:
        return False
    return lib.cuCtxSetCurrent(owner) == 0


__all__ = ["ensure_stream_context"]
