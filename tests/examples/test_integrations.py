"""maxinstr.integrations: the helpers import nothing up front, answer None where a framework or
GPU is missing, and work against the real MAX package where it is installed (CI installs it)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

from maxinstr.integrations import cupy as mi_cupy
from maxinstr.integrations import max as mi_max
from maxinstr.integrations import torch as mi_torch

from examples_runner import child_env, python_with


def test_importing_helpers_imports_no_framework():
    code = (
        "import sys, maxinstr.integrations.max, maxinstr.integrations.torch, maxinstr.integrations.cupy; "
        "print(sorted(m for m in ('max', 'torch', 'cupy') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=child_env(sys.executable), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_stream_handle_of_non_max_objects_is_none():
    assert mi_max.max_stream_handle(None) is None
    assert mi_max.max_stream_handle(object()) is None


class _Queue:  # the one attribute maxinstr reads from a MAX DeviceQueue
    def __init__(self, handle):
        self.native_stream_handle = handle


class _Device:
    def __init__(self, handle):
        self.default_queue = _Queue(handle)


def test_stream_handle_reads_default_queue():
    # make_context_current=False: these handles are not real streams to hand the driver
    assert mi_max.max_stream_handle(_Device(0x7F00), make_context_current=False) == 0x7F00
    assert mi_max.max_stream_handle(_Queue(0x7F00), make_context_current=False) == 0x7F00
    assert mi_max.max_stream_handle(_Device(0)) is None  # 0: no native stream (a CPU device)


def test_ensure_stream_context_without_a_stream_or_driver():
    from maxinstr.integrations._cuda import ensure_stream_context

    assert ensure_stream_context(None) is False and ensure_stream_context(0) is False


@pytest.mark.gpu
def test_fresh_thread_gets_the_streams_context_and_gpu_times(tmp_path):
    """A thread that never made a CUDA call has no current context, so its stages get host times
    only; ensure_stream_context (what max_stream_handle calls) makes the stream's context
    current there, and the same stage is GPU-timed."""
    python = python_with("torch")
    if python is None:
        pytest.skip("needs torch to make a CUDA stream")
    code = f"""
import threading, torch, maxinstr
from maxinstr.integrations._cuda import ensure_stream_context
from maxinstr.rundir import format as fmt
stream = torch.cuda.Stream()
a = torch.randn(2048, 2048, device="cuda")
torch.cuda.synchronize()
result = {{}}
def worker(fix):
    if fix:
        result["ensured"] = ensure_stream_context(stream.cuda_stream)
    # the stage is entered before this thread's first CUDA call
    with maxinstr.stage("fixed" if fix else "plain", stream=stream.cuda_stream):
        with torch.cuda.stream(stream):
            for _ in range(20):
                a @ a
with maxinstr.session({str(tmp_path / "run")!r}):
    for fix in (False, True):
        t = threading.Thread(target=worker, args=(fix,)); t.start(); t.join()
    torch.cuda.synchronize()
run = maxinstr.load({str(tmp_path / "run")!r})
names = run.stage_names()
timed = {{n: bool(run.stages["flags"][names == n][0] & fmt.GPU_TIMED) for n in ("plain", "fixed")}}
print("ensured", result["ensured"], "timed", timed)
assert result["ensured"] and timed["fixed"], timed
"""
    done = subprocess.run([python, "-c", code], env=child_env(python), capture_output=True, text=True, timeout=180)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


def test_enable_max_profiling_sets_env_and_rejects_bad_level(monkeypatch):
    # setenv first so teardown restores the variable even though the code under test sets it itself
    monkeypatch.setenv("MODULAR_ENABLE_PROFILING", "off")
    monkeypatch.delenv("MODULAR_ENABLE_PROFILING")
    mi_max.enable_max_profiling("on")
    import os

    assert os.environ["MODULAR_ENABLE_PROFILING"] == "on"
    with pytest.raises(ValueError, match="off, on, detailed"):
        mi_max.enable_max_profiling("verbose")  # type: ignore[arg-type]


def test_enable_max_profiling_passes_level_to_session(monkeypatch):
    # setenv first so teardown restores the variable even though the code under test sets it itself
    monkeypatch.setenv("MODULAR_ENABLE_PROFILING", "off")
    monkeypatch.delenv("MODULAR_ENABLE_PROFILING")
    seen = []

    class Session:
        def gpu_profiling(self, mode):
            seen.append(mode)

    mi_max.enable_max_profiling("detailed", session=Session())
    assert seen == ["detailed"]


def test_with_real_max_on_cpu():
    """Against the installed MAX: a CPU device has no native stream, and turning profiling on
    after MAX is imported switches MAX's runtime state (its Tracer spans become live)."""
    python = python_with("max.engine")
    if python is None:
        pytest.skip("MAX is not installed for any candidate interpreter")
    code = """
import os
os.environ.pop("MODULAR_ENABLE_PROFILING", None)
from max.driver import CPU
from max._core.profiler import is_profiling_enabled
from maxinstr.integrations.max import enable_max_profiling, max_stream_handle, max_versions
assert max_stream_handle(CPU()) is None
assert max_stream_handle(CPU().default_queue) is None
assert not is_profiling_enabled()
enable_max_profiling("detailed")
assert is_profiling_enabled() and os.environ["MODULAR_ENABLE_PROFILING"] == "detailed"
enable_max_profiling("off")
assert not is_profiling_enabled()
print(max_versions()["max"])
"""
    done = subprocess.run([python, "-c", code], env=child_env(python), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().split(".")[0].isdigit()


def test_torch_and_cupy_helpers_without_gpu():
    """Where the framework is missing or there is no GPU, the helpers answer None."""
    for module, helper in (("torch", mi_torch.torch_stream_handle), ("cupy", mi_cupy.cupy_stream_handle)):
        try:
            fw = importlib.import_module(module)
        except ImportError:
            assert helper() is None
            continue
        if module == "torch" and not fw.cuda.is_available():
            assert helper() is None


def test_provide_nvtx_v2_makes_the_entry_points_global():
    """MAX's kernel-level markers look nvtxRangeStartEx up by name in the process (after failing
    to open libnvToolsExt.so, which CUDA 13 no longer ships: seen with LD_DEBUG on the H200) and
    abort when it is missing. provide_nvtx_v2 loads a library exporting it (the nvidia-nvtx
    wheel's libnvtx3interop, a test dependency) into the global scope."""
    code = """
import ctypes
def visible():
    try:
        ctypes.CDLL(None).nvtxRangeStartEx
        return True
    except AttributeError:
        return False
assert not visible()
from maxinstr.integrations.max import provide_nvtx_v2
where = provide_nvtx_v2()
assert where and visible(), where
assert provide_nvtx_v2() == where  # once per process
print(where)
"""
    env = {k: v for k, v in os.environ.items() if k != "MAXINSTR_NO_NVTX_V2"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "nvtx" in done.stdout.lower() or "nvtoolsext" in done.stdout.lower(), done.stdout


def test_enable_max_profiling_refuses_where_max_would_abort(monkeypatch):
    """An NVIDIA driver and no NVTX v2 library: one line, raised before MAX or the environment
    is touched (MAX would abort at its first marker)."""
    monkeypatch.setenv("MODULAR_ENABLE_PROFILING", "off")
    monkeypatch.setattr(mi_max, "provide_nvtx_v2", lambda: None)
    monkeypatch.setattr(mi_max, "_nvidia_driver_present", lambda: True)
    with pytest.raises(mi_max.MaxProfilingUnavailable, match="NVTX's v2 library") as err:
        mi_max.enable_max_profiling("on")
    assert "\n" not in str(err.value) and "pip install nvidia-nvtx" in str(err.value)
    assert os.environ["MODULAR_ENABLE_PROFILING"] == "off"
    mi_max.enable_max_profiling("off")  # turning it off needs nothing
