"""In-process kernels per stage (``maxinstr.session(..., kernels=True)``): docs/kernels.md.
:class:`SessionKernels` starts this machine's collector or raises :class:`KernelsUnavailable`
with the one-line reason (the session then warns once and records stages with events only).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from maxinstr.integrations.driver import nvidia_driver_present
from maxinstr.kernels.base import Collector, KernelsUnavailable, NullCollector
from maxinstr.rundir.activity import ActivityWriter

__all__ = ["Collector", "KernelsUnavailable", "NullCollector", "SessionKernels", "start", "AMD_NOTE"]

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
    """The name of another CUDA profiling tool already in the process (it holds CUPTI)."""
    if os.environ.get("NSYS_PROFILING_SESSION_ID"):
        return "nsys (NSYS_PROFILING_SESSION_ID is set)"
    inj = os.environ.get("CUDA_INJECTION64_PATH")
    if inj:
        tool = "nsys/Nsight" if ("nsys" in inj.lower() or "nsight" in inj.lower()) else inj
        return f"{tool} (CUDA_INJECTION64_PATH is set)"
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):  # a torch without that flag: no profiler known to run
            if torch.autograd.profiler._is_profiler_enabled:  # torch.profiler / Kineto running
                return "torch.profiler (Kineto)"
    return None


class SessionKernels:
    """``kernels=True`` as a session attaches it; when no collector can run, activity.json says
    ``status: unavailable`` and why."""

    def __init__(self, part_dir: Path, info: dict[str, Any]) -> None:
        self.writer = ActivityWriter(part_dir, info)
        self.active: Collector | None = None
        self.name = "none"

    def start(self) -> None:
        reason = _reason_before_start()
        if reason is None:
            from maxinstr.kernels.cupti import CuptiCollector  # the CUPTI collector loads only for kernels=True

            collector = CuptiCollector(self.writer)
            try:
                collector.start()
            except KernelsUnavailable as exc:
                reason = _reason_after(exc)
            else:
                self.active, self.name = collector, collector.name
                return
        self.writer.write_meta(status="unavailable", reason=reason, collector="none")
        raise KernelsUnavailable(reason)

    def flush(self, final: bool = False) -> None:
        if self.active is not None:
            self.active.flush(final)

    def stop(self) -> dict[str, Any]:
        return self.active.stop() if self.active is not None else {"rows": 0}


def start(part_dir: Path, info: dict[str, Any]) -> tuple[Collector, ActivityWriter]:
    """The running collector and its writer (a NullCollector with the reason when none can run)."""
    kernels = SessionKernels(part_dir, info)
    try:
        kernels.start()
    except KernelsUnavailable as exc:
        return NullCollector(str(exc)), kernels.writer
    assert kernels.active is not None
    return kernels.active, kernels.writer


def _reason_before_start() -> str | None:  # None: try CUPTI
    if _amd():
        return AMD_NOTE
    holder = _tool_attached()
    if holder:
        return (f"{holder} already holds CUPTI in this process (one subscriber at a time): "
                "stages are recorded with events only; the kernels come from that tool's trace")
    return None


def _reason_after(exc: KernelsUnavailable) -> str:
    """CUPTI's reason, or the real one when there is no NVIDIA driver at all."""
    if "already holds CUPTI" not in str(exc) and not nvidia_driver_present():
        return ("no NVIDIA driver in this process (libcuda.so.1 cannot be loaded): "
                "kernels=True collects on NVIDIA GPUs; stages get host times here")
    return str(exc)
