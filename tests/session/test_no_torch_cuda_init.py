"""A session must never initialize torch's CUDA state: after ``torch.cuda._lazy_init()`` a
``fork`` child fails with "Cannot re-initialize CUDA in forked subprocess". On the H200
(torch 2.11) ``torch.cuda.is_initialized()`` was True right after ``maxinstr.session(...)``
started: meta.json's cuDNN version came from ``torch.backends.cudnn.version()``, which calls
``torch.cuda.get_device_capability`` (and so ``_lazy_init``) since torch 2.8.

Here ``torch`` is a fake module in ``sys.modules`` built like the real one: ``torch.cuda``
functions that lazily initialize CUDA record being called, and ``torch.backends.cudnn.version``
calls ``torch.cuda.get_device_capability`` the way torch's own ``_init`` does."""

from __future__ import annotations

import importlib.metadata as md
import sys
import types

import pytest

import maxinstr
from maxinstr.rundir import metadata

# torch.cuda functions that run (or may run) torch.cuda._lazy_init / create a CUDA context
LAZY_INIT = (
    "_lazy_init", "init", "current_device", "set_device", "get_device_capability", "get_device_properties",
    "get_device_name", "current_stream", "default_stream", "synchronize", "mem_get_info", "memory_allocated",
    "max_memory_allocated", "memory_reserved", "Event", "Stream", "get_arch_list",
)


def fake_torch(calls: list[str]) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.__version__ = "2.11.0+cu130"
    torch.version = types.SimpleNamespace(cuda="13.0", hip=None, __version__="2.11.0+cu130")
    cuda = types.ModuleType("torch.cuda")

    def recorder(name):
        def fn(*args, **kwargs):
            calls.append(name)
            if name in ("get_device_capability",):
                return (9, 0)
            return None

        return fn

    for name in LAZY_INIT:
        setattr(cuda, name, recorder(name))
    cuda.is_initialized = lambda: bool(calls)
    cuda.is_available = lambda: True  # no lazy init in torch either (device count only)
    cuda.device_count = lambda: 1
    torch.cuda = cuda

    def cudnn_version():  # what torch.backends.cudnn.version() does on first call (torch >= 2.8)
        if cuda.is_available():
            min(cuda.get_device_capability(i) for i in range(cuda.device_count()))
        return 91900

    torch.backends = types.SimpleNamespace(cudnn=types.SimpleNamespace(version=cudnn_version, is_available=lambda: True))
    torch.autograd = types.SimpleNamespace(profiler=types.SimpleNamespace(_is_profiler_enabled=False))
    return torch


def test_session_start_and_close_never_initialize_torch_cuda(tmp_path, native, stage, monkeypatch):
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "torch", fake_torch(calls))
    with maxinstr.session(tmp_path / "run") as s:
        assert calls == [], f"session start called torch.cuda: {calls}"
        with stage("x", step=0):
            pass
    assert calls == [], f"session close called torch.cuda: {calls}"
    meta = maxinstr.load(tmp_path / "run").meta
    assert meta["frameworks"]["torch_imported"] is True
    assert meta["frameworks"]["torch"] == "2.11.0+cu130"
    assert meta["cuda_runtime"] == "13.0"  # torch.version is plain data, read without any call
    assert s is not None


def test_fake_torch_records_what_the_old_cudnn_lookup_did(monkeypatch):
    """The fake is sharp: the lookup the session used to make is caught by it."""
    calls: list[str] = []
    torch = fake_torch(calls)
    torch.backends.cudnn.version()
    assert calls == ["get_device_capability"]


def test_cudnn_version_from_the_installed_wheel(monkeypatch):
    versions = {"nvidia-cudnn-cu12": "9.19.0.56"}

    def version(dist):
        if dist in versions:
            return versions[dist]
        raise md.PackageNotFoundError(dist)

    monkeypatch.setattr(metadata.md, "version", version)
    assert metadata.cudnn_version() == "91900"
    versions["nvidia-cudnn-cu13"] = "9.1.1.17"  # newest CUDA's wheel first
    assert metadata.cudnn_version() == "90101"
    versions.clear()
    versions["nvidia-cudnn-cu11"] = "8.9.7.29"  # cuDNN 8 spelled major*1000
    assert metadata.cudnn_version() == "8907"
    versions.clear()
    assert metadata.cudnn_version() is None


@pytest.mark.parametrize("with_torch", [True, False])
def test_framework_versions_cudnn_only_with_torch_loaded(monkeypatch, with_torch):
    calls: list[str] = []
    if with_torch:
        monkeypatch.setitem(sys.modules, "torch", fake_torch(calls))
    else:
        monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(metadata, "cudnn_version", lambda: "91900")
    out = metadata.framework_versions()
    assert ("cudnn" in out) is with_torch
    assert calls == []


def test_frameworks_imported_after_the_session_began_are_listed_at_close(tmp_path, monkeypatch):
    """Under `maxinstr run` the session begins before the program's first line, so
    ``<name>_imported`` (at start) is False for every framework; ``frameworks_loaded`` (at close)
    says which ones the program used."""
    for name in metadata.FRAMEWORKS:
        monkeypatch.delitem(sys.modules, name, raising=False)
    with maxinstr.session(tmp_path / "run", sample_hz=0):
        monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    meta = maxinstr.load(tmp_path / "run").meta
    assert meta["frameworks_loaded"] == ["cupy"]
    assert meta["frameworks"].get("cupy_imported") is not True
