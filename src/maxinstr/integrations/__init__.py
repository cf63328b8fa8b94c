"""Small helpers for the frameworks maxinstr users run: MAX, PyTorch, CuPy.

None of these frameworks is a dependency of maxinstr. Each helper module imports its framework
lazily, inside the function that needs it, and answers `None` (or does nothing) where the
framework or a GPU is missing, so the same script runs on a laptop and on an H200.

    from maxinstr.integrations.max import max_stream_handle, enable_max_profiling
    from maxinstr.integrations.torch import torch_stream_handle
    from maxinstr.integrations.cupy import cupy_stream_handle
"""
