"""maxinstr.integrations: the helpers import nothing up front, answer None where a framework or
GPU is missing, and work against the real MAX package where it is installed (CI installs it)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from maxinstr.integrations import cupy as mi_cupy
from maxinstr.integrations import max as mi_max
from maxinstr.integrations import torch as mi_torch

from examples_runner import EXAMPLES, child_env, python_with


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
    from maxinstr.integrations.driver import ensure_stream_context

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
from maxinstr.integrations.driver import ensure_stream_context
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


# -- where MAX's markers would abort MAX: no NVTX v2 library on a machine with an NVIDIA driver --------------
# In a child process: no library exporting NVTX's v2 entry points is found (the lookup itself
# is tested over folder layouts below), and an NVIDIA driver is present: a CUDA 13 machine
# without nvidia-nvtx, where MAX aborted at its first marker on the H200 (docs/max.md).
NO_NVTX_V2_HERE = """
import maxinstr.integrations.max as mi_max
mi_max.provide_nvtx_v2 = lambda: None
mi_max._nvidia_driver_present = lambda: True
"""


def _bootstrap_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in child_env(sys.executable).items()
           if not k.startswith("MAXINSTR_") and k != "MODULAR_ENABLE_PROFILING"}
    env.update(extra)
    return env


def test_run_default_markers_are_turned_off_in_one_line(monkeypatch, capsys):
    """`maxinstr run`'s own MODULAR_ENABLE_PROFILING=detailed (marked MAXINSTR_MAX_PROFILING_BY_RUN)
    is turned off by the start-up hook, before MAX is imported, with one line on stderr and
    kept for the run's events: the program runs, without MAX's op ranges."""
    from maxinstr.launch import bootstrap

    monkeypatch.setattr(mi_max, "provide_nvtx_v2", lambda: None)
    monkeypatch.setattr(mi_max, "_nvidia_driver_present", lambda: True)
    monkeypatch.setattr(bootstrap, "_run_warnings", [])
    env = {"MODULAR_ENABLE_PROFILING": "detailed", "MAXINSTR_MAX_PROFILING_BY_RUN": "1"}
    bootstrap._max_markers_step(env)
    assert env["MODULAR_ENABLE_PROFILING"] == "off"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("maxinstr: running without MAX's op ranges"), err
    assert "NVTX's v2 library" in err and "pip install nvidia-nvtx" in err
    assert bootstrap._run_warnings == [err.removeprefix("maxinstr: ").rstrip("\n")]
    # markers off, or a library found, or no NVIDIA driver: nothing changes, nothing is said
    for env, driver in (({"MODULAR_ENABLE_PROFILING": "off", "MAXINSTR_MAX_PROFILING_BY_RUN": "1"}, True),
                        ({"MODULAR_ENABLE_PROFILING": "detailed", "MAXINSTR_MAX_PROFILING_BY_RUN": "1"}, False)):
        monkeypatch.setattr(mi_max, "_nvidia_driver_present", lambda driver=driver: driver)
        before = dict(env)
        bootstrap._max_markers_step(env)
        assert env == before
    assert capsys.readouterr().err == "" and len(bootstrap._run_warnings) == 1


def test_run_default_markers_off_end_to_end_with_real_max(tmp_path):
    """The start-up hook of a `maxinstr run` child (python -m maxinstr.launch.bootstrap, as the
    sitecustomize does) with maxinstr run's default: MAX, imported by the program afterwards,
    has its profiling off; the program runs to the end; the run records the variable as the
    program saw it (meta.json env) and the reason (its events)."""
    python = python_with("max.engine")
    if python is None:
        pytest.skip("MAX is not installed for any candidate interpreter")
    script = tmp_path / "prog.py"
    script.write_text("import os\nfrom max._core.profiler import is_profiling_enabled\n"
                      "print('MAX profiling', is_profiling_enabled(), os.environ['MODULAR_ENABLE_PROFILING'])\n")
    run = tmp_path / "run"
    code = NO_NVTX_V2_HERE + f"import sys\nfrom maxinstr.launch.bootstrap import main\nsys.exit(main(['-o', {str(run)!r}, {str(script)!r}]))\n"
    env = _bootstrap_env(MODULAR_ENABLE_PROFILING="detailed", MAXINSTR_MAX_PROFILING_BY_RUN="1")
    done = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "MAX profiling False off" in done.stdout
    said = [line for line in done.stderr.splitlines() if "MAX's op ranges" in line]
    assert len(said) == 1 and said[0].startswith("maxinstr: running without MAX's op ranges"), done.stderr
    meta = json.loads((run / "meta.json").read_text())
    assert meta["env"]["MODULAR_ENABLE_PROFILING"] == "off"
    events = [json.loads(line) for f in run.glob("parts/*/events.jsonl") for line in f.read_text().splitlines()]
    assert any(e.get("kind") == "warning" and "running without MAX's op ranges" in e.get("message", "") for e in events), events


def test_users_own_markers_are_refused_in_one_line_when_max_is_imported(tmp_path):
    """MODULAR_ENABLE_PROFILING set by the user (no MAXINSTR_MAX_PROFILING_BY_RUN): the program
    stops with one line and exit status 2 when it imports MAX, before MAX loads (MAX would
    abort at its first marker); until then, and in programs that never import MAX, it runs."""
    code = NO_NVTX_V2_HERE + (
        "import os\nfrom maxinstr.launch import bootstrap\nbootstrap.startup(os.environ)\n"
        "import json, sys\nprint('before', flush=True)\nimport max.engine\nprint('after', 'max.engine' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=_bootstrap_env(MODULAR_ENABLE_PROFILING="on"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == "before\n"
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("maxinstr: MODULAR_ENABLE_PROFILING=on: MAX's profiling markers need NVTX's v2 library")
    # the user's own "off" (or none): nothing installed, MAX imports as usual
    code_off = NO_NVTX_V2_HERE + "import os, sys\nfrom maxinstr.launch import bootstrap\nbootstrap.startup(os.environ)\n" \
        "print(any(type(f).__name__ == 'RefuseMaxImport' for f in sys.meta_path))\n"
    done = subprocess.run([sys.executable, "-c", code_off], env=_bootstrap_env(MODULAR_ENABLE_PROFILING="off"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "False\n", done.stderr


@pytest.mark.parametrize("example", ["max_block.py", "max_decoder.py"])
def test_examples_refuse_max_profiling_in_one_line(tmp_path, example):
    """--max-profiling on where MAX's markers would abort MAX: one line, exit status 2, before
    MAX is imported and before a run directory is written."""
    code = NO_NVTX_V2_HERE + (
        "import runpy, sys\n"
        f"sys.argv = [{example!r}, '--max-profiling', 'on', '--run-dir', {str(tmp_path / 'run')!r}]\n"
        f"runpy.run_path({str(EXAMPLES / example)!r}, run_name='__main__')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=_bootstrap_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"{example}: --max-profiling on: MAX's profiling markers need NVTX's v2 library")
    assert not (tmp_path / "run").exists()


# -- the lookup of a library exporting NVTX's v2 entry points --------------------------------------------------
NVTX_V2_ENTRY_POINTS = ("nvtxRangeStartEx", "nvtxRangeEnd", "nvtxRangePushEx", "nvtxRangePop", "nvtxMarkEx")
"""What MAX's profiler shim and Mojo markers look up (strings of modular/lib/libmax_profiler_shim.so)."""


def _touch(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return str(path)


def test_candidates_over_the_wheel_and_toolkit_layouts(tmp_path):
    """The folders the wheels and toolkits use, in order: nvidia-nvtx (CUDA 13) nvidia/cu13/lib,
    nvidia-nvtx-cu12 nvidia/nvtx/lib (libnvToolsExt.so.1 up to 12.8, libnvtx3interop.so.1 from
    12.9), per sys.path entry in its order; then CUDA_HOME's lib64/lib; then the toolkit's."""
    site_a, site_b, home, toolkit = (tmp_path / n for n in ("site-a", "site-b", "cuda-home", "toolkit"))
    cu13 = _touch(site_a / "nvidia/cu13/lib/libnvtx3interop.so.1")
    cu12_old = _touch(site_b / "nvidia/nvtx/lib/libnvToolsExt.so.1")
    cu12_new = _touch(site_b / "nvidia/nvtx/lib/libnvtx3interop.so.1")
    home_lib = _touch(home / "lib64/libnvToolsExt.so")
    tk = _touch(toolkit / "libnvToolsExt.so.1")
    _touch(site_a / "nvidia/nvtx/lib/libnvToolsExt.so.2")  # not a name MAX or its shim looks for
    (site_b / "nvidia/cu13/lib/libnvtx3interop.so.1").mkdir(parents=True)  # a folder, not a library
    found = mi_max.nvtx_v2_candidates([str(site_a), "", str(site_b), str(site_a)], environ={"CUDA_HOME": str(home)},
                                      toolkit_dirs=[str(toolkit), str(tmp_path / "missing")])
    assert found == [cu13, cu12_old, cu12_new, home_lib, tk]
    assert mi_max.nvtx_v2_candidates([str(tmp_path / "missing")], environ={}, toolkit_dirs=()) == []
    # CUDA_PATH when CUDA_HOME is unset
    assert mi_max.nvtx_v2_candidates([], environ={"CUDA_PATH": str(home)}, toolkit_dirs=()) == [home_lib]


def _wheel_library(dist: str, folder: str) -> Path | None:
    from importlib import metadata

    try:
        files = metadata.distribution(dist).files or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f).startswith(folder) and ".so" in str(f).rsplit("/", 1)[-1]:
            return Path(str(f.locate()))
    return None


LOADS_AND_RESOLVES = f"""
import ctypes, json, sys
from maxinstr.integrations.max import load_nvtx_v2, nvtx_v2_candidates
site, expected = sys.argv[1], sys.argv[2]
found = nvtx_v2_candidates([site], environ={{}}, toolkit_dirs=()) if site else nvtx_v2_candidates()
assert expected in found, found
where = load_nvtx_v2([expected])
process = ctypes.CDLL(None)
print(json.dumps({{"where": where, "resolved": [hasattr(process, s) for s in {NVTX_V2_ENTRY_POINTS!r}]}}))
"""


def test_a_cuda12_wheel_layout_is_found_loaded_and_resolves(tmp_path):
    """nvidia-nvtx-cu12 (<= 12.8) puts libnvToolsExt.so.1 under nvidia/nvtx/lib, a name MAX does
    not open itself (it opens libnvToolsExt.so): the lookup finds it there, loads it globally,
    and the entry points MAX looks up by name resolve in the process. The library is the CUDA 13
    wheel's libnvtx3interop (a test dependency, the same v2 entry points) copied under the CUDA
    12 name and folder: one stated change to a real file."""
    real = _wheel_library("nvidia-nvtx", "nvidia/cu13/lib/")
    if real is None:
        pytest.skip("nvidia-nvtx (the test dependency shipping libnvtx3interop) is not installed")
    site = tmp_path / "site"
    lib = site / "nvidia/nvtx/lib/libnvToolsExt.so.1"
    lib.parent.mkdir(parents=True)
    shutil.copyfile(real, lib)
    done = subprocess.run([sys.executable, "-c", LOADS_AND_RESOLVES, str(site), str(lib)],
                          env=_bootstrap_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["where"] == str(lib) and all(out["resolved"]), out


def test_the_real_nvidia_nvtx_cu12_wheel_is_found_loaded_and_resolves():
    """The CUDA 12 wheel itself (what torch's CUDA 12 wheels install), where it is installed:
    found on sys.path by the lookup, loaded, the v2 entry points resolve."""
    lib = _wheel_library("nvidia-nvtx-cu12", "nvidia/nvtx/lib/")
    if lib is None:
        pytest.skip("nvidia-nvtx-cu12 is not installed (pip install nvidia-nvtx-cu12 to run this)")
    done = subprocess.run([sys.executable, "-c", LOADS_AND_RESOLVES, "", str(lib)],
                          env=_bootstrap_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["where"] == str(lib) and all(out["resolved"]), out
