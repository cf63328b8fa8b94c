"""What reproduces a run: collected once at session start into meta.json.

Cheap and side-effect free: no framework is imported that the program has not imported already
(the others' versions come from installed package metadata), and no CUDA context is created
(GPU facts come from NVML, which creates none). A probe that fails leaves its field empty.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from maxinstr import config
from maxinstr._version import __version__
from maxinstr.rundir import format as fmt

ENV_NAMES = frozenset("""
    MODULAR_ENABLE_PROFILING CUDA_VISIBLE_DEVICES CUDA_LAUNCH_BLOCKING CUDA_DEVICE_MAX_CONNECTIONS CUDA_MODULE_LOADING
    CUBLAS_WORKSPACE_CONFIG NVIDIA_TF32_OVERRIDE PYTORCH_CUDA_ALLOC_CONF PYTORCH_HIP_ALLOC_CONF TORCH_CUDA_ARCH_LIST
    TORCHINDUCTOR_CACHE_DIR HIP_VISIBLE_DEVICES ROCR_VISIBLE_DEVICES GPU_DEVICE_ORDINAL RANK LOCAL_RANK WORLD_SIZE
    LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT OMP_NUM_THREADS XLA_FLAGS XLA_PYTHON_CLIENT_PREALLOCATE
    XLA_PYTHON_CLIENT_MEM_FRACTION JAX_PLATFORMS NVTX_INJECTION64_PATH
""".split())
ENV_PREFIXES = ("NCCL_", "MAXINSTR_", "MODULAR_", "RCCL_", "HSA_")
_SECRET = re.compile(r"TOKEN|SECRET|PASSW|KEY|CREDENTIAL|AUTH", re.IGNORECASE)

# import name -> distributions that provide it (first installed wins)
FRAMEWORKS: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "cupy": ("cupy", "cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy-rocm-6-0", "cupy-rocm-5-0"),
    "jax": ("jax",),
    "jaxlib": ("jaxlib",),
    "max": ("max", "modular"),
    "triton": ("triton", "pytorch-triton-rocm"),
}


def collect(*, warmup: int = 0, user: dict[str, Any] | None = None, requested_path: str | None = None) -> dict[str, Any]:
    """The metadata of docs/formats.md's meta.json for a run starting now."""
    mono, real = _clock_pair()
    meta: dict[str, Any] = {
        "format": fmt.FORMAT_NAME, "version": fmt.FORMAT_VERSION, "status": "running", "warmup": int(warmup),
        "clock": {"host": "CLOCK_MONOTONIC", "monotonic_ns": mono, "realtime_ns": real},
        "command": list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]),
        "argv": list(sys.argv), "cwd": os.getcwd(), "git": git_info(_script_dir()), "host": socket.gethostname(),
        "platform": platform.platform(), "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
        "python_executable": sys.executable, "maxinstr": __version__, "pid": os.getpid(),
    }
    meta.update(gpu_info())
    meta.update(frameworks=framework_versions(), env=relevant_env(), user=dict(user or {}),
                requested_path=requested_path, profiler=_profiler_from_env())
    return meta


def _clock_pair() -> tuple[int, int]:
    """CLOCK_MONOTONIC and wall-clock ns read back to back (the tighter of 3 tries), so
    host times can be placed on the wall clock."""
    tries = [(time.monotonic_ns(), time.time_ns(), time.monotonic_ns()) for _ in range(3)]
    a, r, b = min(tries, key=lambda t: t[2] - t[0])
    return (a + b) // 2, r


def _script_dir() -> Path:
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return Path(path).resolve().parent if path else Path.cwd()


def git_info(where: Path) -> dict[str, Any] | None:
    """``{"commit", "dirty", "root"}`` of the git repo containing ``where``; None outside one."""
    try:
        def git(*args: str) -> str:
            # the repository's config is data: a program it names (fsmonitor, pager) is never run
            safe = ["-c", "core.fsmonitor=false", "-c", "core.pager=cat", "--no-optional-locks"]
            out = subprocess.run(
                ["git", *safe, "-C", str(where), *args], capture_output=True, text=True, timeout=3, check=True
            )
            return out.stdout.strip()

        commit = git("rev-parse", "HEAD")
        root = git("rev-parse", "--show-toplevel")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
        return {"commit": commit, "dirty": dirty, "root": root}
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_info() -> dict[str, Any]:
    """GPU names and driver/CUDA/ROCm versions from NVML / ROCm files, never a CUDA context."""
    out: dict[str, Any] = {"gpus": [], "driver": None, "cuda": None, "rocm": None}
    out.update({k: v for k, v in {**_nvml_info(), "rocm": _rocm_version()}.items() if v})
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):
            out["cuda_runtime"] = getattr(torch.version, "cuda", None)
            hip = getattr(torch.version, "hip", None)
            if hip:
                out["hip_runtime"] = hip
    return out


def _nvml_info() -> dict[str, Any]:
    try:
        import pynvml  # optional (nvidia-ml-py), and imported only here, at session start

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - not installed or broken, no driver, no GPU: no NVIDIA facts
        return {}

    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    info: dict[str, Any] = {"gpus": []}
    try:
        driver = _quietly(pynvml.nvmlSystemGetDriverVersion)
        if driver is not None:
            info["driver"] = text(driver)
        v = _quietly(lambda: int(pynvml.nvmlSystemGetCudaDriverVersion_v2()))
        if v is not None:
            info["cuda"] = f"{v // 1000}.{(v % 1000) // 10}"
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            gpu: dict[str, Any] = {"index": index}
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(index)
                gpu["name"] = text(pynvml.nvmlDeviceGetName(h))
                gpu["uuid"] = text(pynvml.nvmlDeviceGetUUID(h))
                gpu["memory_total_bytes"] = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
                bus = _quietly(lambda h=h: text(pynvml.nvmlDeviceGetPciInfo(h).busId))
                if bus is not None:
                    gpu["pci_bus_id"] = bus
            except Exception as exc:  # noqa: BLE001 - one GPU's facts: the error instead
                gpu["error"] = str(exc)
            info["gpus"].append(gpu)
    except Exception:  # noqa: BLE001 - the facts gathered so far
        pass
    finally:
        _quietly(pynvml.nvmlShutdown)
    return info


def _quietly(fn: Any) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - a fact this driver does not give: left out
        return None


def _rocm_version() -> str | None:
    for base in (os.environ.get("ROCM_PATH"), "/opt/rocm"):
        if base:
            with contextlib.suppress(OSError):
                return Path(base, ".info", "version").read_text().strip() or None
    return None


def framework_versions() -> dict[str, Any]:
    """Versions of the GPU frameworks: the module's when imported, else the installed metadata's."""
    out: dict[str, Any] = {}
    for module, dists in FRAMEWORKS.items():
        loaded = sys.modules.get(module)
        version = getattr(loaded, "__version__", None) if loaded is not None else None
        for dist in dists if version is None else ():
            version = _quietly(lambda dist=dist: md.version(dist))  # not installed, or broken metadata: None
            if version is not None:
                break
        if version is not None:
            out[module] = str(version)
            out[f"{module}_imported"] = loaded is not None
    if sys.modules.get("torch") is not None:
        cudnn = cudnn_version()
        if cudnn:
            out["cudnn"] = cudnn
    return out


def frameworks_loaded() -> list[str]:
    """The frameworks the program has imported by now (meta.json ``frameworks_loaded``, written at
    close: under `maxinstr run` the session starts before the program's first import)."""
    return [m for m in FRAMEWORKS if sys.modules.get(m) is not None]


# cuDNN's wheels, newest CUDA first (torch's pip wheels depend on one of them)
CUDNN_DISTS = ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn-cu11", "nvidia-cudnn")


def cudnn_version() -> str | None:
    """cuDNN's version as ``CUDNN_VERSION`` spells it (9.19.0 -> "91900", 8.9.7 -> "8907"), from
    the installed wheel's metadata. Never through torch: ``torch.backends.cudnn.version()`` runs
    ``torch.cuda._lazy_init()`` (torch >= 2.8), and a session started before ``fork`` then made the
    child fail with "Cannot re-initialize CUDA in forked subprocess" (H200, torch 2.11)."""
    for dist in CUDNN_DISTS:
        try:
            version = md.version(dist)
        except Exception:  # noqa: BLE001 - not installed, or broken metadata
            continue
        m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
        if not m:
            continue
        major, minor, patch = (int(x) for x in m.groups())
        return str(major * 10000 + minor * 100 + patch if major >= 9 else major * 1000 + minor * 100 + patch)
    return None


def relevant_env() -> dict[str, str]:
    """Environment variables that change what a GPU program does (secrets left out)."""
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if (k in ENV_NAMES or k.startswith(ENV_PREFIXES)) and not _SECRET.search(k)
    }


def _profiler_from_env() -> Any:
    """``maxinstr run`` says which profiler wraps the process through MAXINSTR_PROFILER (JSON)."""
    raw = config.profiler_json()
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"name": raw}
