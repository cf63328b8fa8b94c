"""CuPy helper: the handle of CuPy's current stream, or None without CuPy or a GPU.

    from maxinstr.integrations.cupy import cupy_stream_handle

    with copy_stream:
        with maxinstr.stage("h2d", stream=cupy_stream_handle()):
            ...

A `cupy.cuda.Stream` can also be passed as `stream=` directly (maxinstr reads its `.ptr`).
"""

from __future__ import annotations


def cupy_stream_handle() -> int | None:
    """`cupy.cuda.get_current_stream().ptr`, or None when CuPy or a CUDA device is missing.

    0 is a real answer: CuPy's default (legacy) stream.
    """
    try:
        import cupy
    except ImportError:
        return None
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return None
    except cupy.cuda.runtime.CUDARuntimeError:
        return None
    handle = int(cupy.cuda.get_current_stream().ptr)
    if handle and not cupy.cuda.runtime.is_hip:
        # the stream's context current on this thread, so stages entered here get GPU times
        from maxinstr.integrations.driver import ensure_stream_context

        ensure_stream_context(handle)
    return handle


__all__ = ["cupy_stream_handle"]
