"""The real pynvml code over a stand-in libnvidia-ml (C, compiled here; skipped without a C
compiler): ctypes structs, field names and units as pynvml really returns them, and the
GIL-held fast path."""

from __future__ import annotations

import ctypes
import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

pynvml = pytest.importorskip("pynvml")

from maxinstr.sample import nvml  # noqa: E402
from maxinstr.sample.base import COL, FLAG_GPM, ErrorLog, nan_values  # noqa: E402
from maxinstr.sample.writer import clock_ns  # noqa: E402

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "sampler_cost.py"


@pytest.fixture
def fake_lib(tmp_path, monkeypatch):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    spec = importlib.util.spec_from_file_location("sampler_cost_src", BENCH)
    src = spec.loader.get_data(str(BENCH)).decode()
    code = src.split('FAKE_NVML_C = r"""', 1)[1].split('"""', 1)[0]
    (tmp_path / "fake.c").write_text(code)
    lib = tmp_path / "libfake-nvml.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "fake.c")], check=True)
    monkeypatch.setenv("FAKE_NVML_SPIN_NS", "1000")
    monkeypatch.setattr(pynvml, "nvmlLib", ctypes.CDLL(str(lib)))
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    return lib


def test_real_pynvml_over_stub_library(fake_lib):
    b = nvml.NvmlBackend(ErrorLog(clock_ns), nv=pynvml, env={}, interval_s=0.01)
    assert b.gil.startswith("held")
    assert b.versions() == {"driver": "fake-nvml", "cuda_driver": "13.0"}
    [dev] = b.devices()
    assert dev.info.name == "fake NVML device" and dev.info.mem_total_bytes == 2.0**37 and dev.info.gpm
    assert dev.info.uuid.startswith("GPU-fa4e")
    v = nan_values()
    dev.read(v, 0, 0)
    assert v[COL["gpu_util_pct"]] == 50 and v[COL["mem_used_bytes"]] == 2**30
    assert v[COL["power_w"]] == pytest.approx(300.0) and v[COL["energy_j"]] == pytest.approx(123456.789)
    assert v[COL["sm_clock_mhz"]] == 1500 and v[COL["temp_c"]] == 40 and v[COL["proc_mem_bytes"]] == 0
    v = nan_values()
    flags, _, _ = dev.read(v, 1, 200_000_000)  # second GPM sample, 200 ms later
    assert flags & FLAG_GPM and v[COL["sm_active_pct"]] == 42.0 and v[COL["dram_bw_util_pct"]] == 42.0
    assert b.errors.snapshot() == []
    dev.close()
    b.shutdown()


def test_per_row_calls_hold_the_gil_and_leave_pynvml_alone(fake_lib):
    lib = nvml.direct_library(pynvml)
    assert isinstance(lib, ctypes.PyDLL)  # PyDLL: called with the GIL held
    assert lib.nvmlDeviceGetPowerUsage._flags_ & ctypes._FUNCFLAG_PYTHONAPI
    b = nvml.NvmlBackend(ErrorLog(clock_ns), nv=pynvml, env={}, interval_s=0.01)
    [dev] = b.devices()
    dev.read(nan_values(), 0, 0)
    # pynvml's own function cache still holds CDLL functions (GIL released for other users)
    for fn in pynvml._nvmlGetFunctionPointer_cache.values():
        assert not fn._flags_ & ctypes._FUNCFLAG_PYTHONAPI
    assert nvml.direct_library(object()) is None  # not pynvml: nothing done


def test_direct_calls_translate_errors(fake_lib, monkeypatch):
    monkeypatch.setenv("FAKE_NVML_POWER_RET", str(pynvml.NVML_ERROR_NOT_SUPPORTED))
    b = nvml.NvmlBackend(ErrorLog(clock_ns), nv=pynvml, env={}, interval_s=0.01)
    [dev] = b.devices()
    for tick in range(3):
        v = nan_values()
        dev.read(v, tick, 0)
        assert v[COL["gpu_util_pct"]] == 50
    assert "power_w" in dev.info.absent
    [e] = b.errors.snapshot()
    assert e["kind"] == "absent" and "Not Supported" in e["message"]


def test_release_mode_uses_pynvml(fake_lib, monkeypatch):
    monkeypatch.setenv("MAXINSTR_SAMPLER_GIL", "release")
    b = nvml.NvmlBackend(ErrorLog(clock_ns), nv=pynvml, env={}, interval_s=0.01)
    assert b.gil.startswith("released")
    [dev] = b.devices()
    v = nan_values()
    dev.read(v, 0, 0)
    assert v[COL["power_w"]] == pytest.approx(300.0)
