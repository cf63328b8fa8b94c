"""In-process kernels per stage (``maxinstr.session(..., kernels=True)``): docs/kernels.md.

:func:`start` picks the collector for this machine and starts it, or returns a
:class:`~maxinstr.kernels.base.NullCollector` holding the one-line reason it cannot run (then
the session warns once and records stages with events only).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from maxinstr.kernels.base import KernelCollector, KernelsUnavailable, NullCollector
from maxinstr.kernels.store import ActivityWriter

__all__ = ["KernelCollector", "KernelsUnavailable", "NullCollector", "start", "AMD_NOTE"]

AMD_NOTE = "AMD GPUs: in-process kernels are not supported yet; run under rocprofv3 (maxinstr run --profiler rocprofv3)"


def _amd() -> bool:
    torch = sys.modules.get("torch")
    if torch is not None and getattr(getattr(torch, "version", None), "hip", None):
        return True
    try:
        with open("/proc/self/maps") as f:
            return "libamdhip64" in f.read()
    except OSError:
        return False


def _tool_attached() -> str | None:
    """Another CUDA profiling tool already in the process (it holds CUPTI): its name, else None."""
    if os.environ.get("NSYS_PROFILING_SESSION_ID"):
        return "nsys (NSYS_PROFILING_SESSION_ID is set)"
    inj = os.environ.get("CUDA_INJECTION64_PATH")
    if inj:
        tool = "nsys/Nsight" if ("nsys" in inj.lower() or "nsight" in inj.lower()) else inj
        return f"{tool} (CUDA_INJECTION64_PATH is set)"
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.autograd.profiler._is_profiler_enabled:  # torch.profiler / Kineto running
                return "torch.profiler (Kineto)"
        except Exception:  # noqa: BLE001
            pass
    return None


def start(part_dir: Path, info: dict[str, Any]) -> tuple[KernelCollector, ActivityWriter]:
    """The running collector for this process and its writer (a NullCollector with the reason
    when none can run; activity.json then says ``status: unavailable``)."""
    writer = ActivityWriter(part_dir, info)
    if _amd():
        return _unavailable(writer, AMD_NOTE)
    holder = _tool_attached()
    if holder:
        return _unavailable(
            writer,
            f"{holder} already holds CUPTI in this process (one subscriber at a time): "
            "stages are recorded with events only; the kernels come from that tool's trace",
        )
    from maxinstr.kernels.cupti import CuptiCollector

    collector = CuptiCollector(writer)
    try:
        collector.start()
    except KernelsUnavailable as exc:
        from maxinstr.integrations._cuda import nvidia_driver_present

        if "already holds CUPTI" not in str(exc) and not nvidia_driver_present():  # the real reason, not what CUPTI lacked on the way
            return _unavailable(writer, "no NVIDIA driver in this process (libcuda.so.1 cannot be loaded): "
                                        "kernels=True collects on NVIDIA GPUs; stages get host times here")
        return _unavailable(writer, str(exc))
    return collector, writer


def _unavailable(writer: ActivityWriter, reason: str) -> tuple[NullCollector, ActivityWriter]:
    writer.write_meta(status="unavailable", reason=reason, collector="none")
    return NullCollector(reason), writer
