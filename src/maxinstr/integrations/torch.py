"""PyTorch helper: the handle of torch's current CUDA stream, or None where there is none.

    from maxinstr.integrations.torch import torch_stream_handle

    with maxinstr.stage("decode", step=i, stream=torch_stream_handle()):
        logits = model(tokens)

torch is imported only when called; without CUDA the answer is None (host times only).
"""

from __future__ import annotations

from typing import Any


def torch_stream_handle(device: Any = None) -> int | None:
    """`torch.cuda.current_stream(device).cuda_stream`, or None without torch or CUDA.

    On ROCm builds of torch this is the HIP stream, which maxinstr's HIP path takes as well.
    """
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    handle = int(torch.cuda.current_stream(device).cuda_stream)
    if handle and not getattr(torch.version, "hip", None):
        # the stream's context current on this thread, so stages entered here get GPU times
        from maxinstr.integrations.driver import ensure_stream_context

        ensure_stream_context(handle)
    return handle


__all__ = ["torch_stream_handle"]
