"""PyTorch helper: ``maxinstr.stage("decode", stream=torch_stream_handle())``."""

from __future__ import annotations

from typing import Any

from maxinstr.integrations.driver import ensure_stream_context


def torch_stream_handle(device: Any = None) -> int | None:
    """torch's current CUDA stream (HIP on ROCm builds), or None without torch or CUDA (host times only)."""
    try:
        import torch  # optional: imported only when called
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    handle = int(torch.cuda.current_stream(device).cuda_stream)
    if handle and not getattr(torch.version, "hip", None):
        # the stream's context current here: stages entered on this thread get GPU times
        ensure_stream_context(handle)
    return handle


__all__ = ["torch_stream_handle"]
