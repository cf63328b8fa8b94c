"""CuPy helper: ``maxinstr.stage("h2d", stream=cupy_stream_handle())`` (a `cupy.cuda.Stream` can be
passed as `stream=` too: maxinstr reads its `.ptr`)."""

from __future__ import annotations

from maxinstr.integrations.driver import ensure_stream_context


def cupy_stream_handle() -> int | None:
    """CuPy's current stream (0: its legacy default stream), or None without CuPy or a CUDA device."""
    try:
        import cupy  # optional: imported only when called
    except ImportError:
        return None
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return None
    except cupy.cuda.runtime.CUDARuntimeError:
        return None
    handle = int(cupy.cuda.get_current_stream().ptr)
    if handle and not cupy.cuda.runtime.is_hip:
        # the stream's context current here: stages entered on this thread get GPU times
        ensure_stream_context(handle)
    return handle


__all__ = ["cupy_stream_handle"]
