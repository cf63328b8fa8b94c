from __future__ import annotations

import os

from maxinstr.launch.env import INSTALL_STEPS, Environment, Tool, find_tool, tool_version

from _launch_helpers import FAKES


def test_versions_read_from_the_tools_own_output():
    assert tool_version(str(FAKES / "nsys")) == "2025.3.1.90"
    assert tool_version(str(FAKES / "ncu")) == "2025.3.0.0"
    assert tool_version(str(FAKES / "rocprofv3")) == "1.0.0"


def test_find_tool_on_path(monkeypatch):
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    tool = find_tool("nsys", search_known=False)
    assert tool.found and not tool.off_path
    assert tool.path == str(FAKES / "nsys")
    assert tool.version == "2025.3.1.90"


def test_missing_tool_gives_the_exact_install_step(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    tool = find_tool("ncu", search_known=False)
    assert not tool.found
    hint = tool.install_hint()
    assert "apt-get install -y nsight-compute" in hint and hint == INSTALL_STEPS["ncu"]


def test_off_path_tool_says_how_to_fix_path():
    tool = Tool("nsys", path="/opt/nvidia/nsight-compute/2025.3/host/target-linux-x64/nsys", off_path=True)
    assert tool.install_hint() == "nsys is at /opt/nvidia/nsight-compute/2025.3/host/target-linux-x64/nsys but not on PATH: export PATH=/opt/nvidia/nsight-compute/2025.3/host/target-linux-x64:$PATH"


def test_auto_profiler_follows_vendor_and_installed_tools():
    nsys, roc = Tool("nsys", path="/x/nsys"), Tool("rocprofv3", path="/x/rocprofv3")
    assert Environment("nvidia", "nvml", tools={"nsys": nsys}).default_profiler() == "nsys"
    assert Environment("nvidia", "nvml", tools={"nsys": Tool("nsys")}).default_profiler() == "none"
    assert Environment("amd", "rocm-smi", tools={"rocprofv3": roc}).default_profiler() == "rocprofv3"
    assert Environment("none", "-", tools={"nsys": nsys, "rocprofv3": roc}).default_profiler() == "none"
    lines = Environment("nvidia", "nvml", ["NVIDIA H200"], tools={"nsys": nsys, "ncu": Tool("ncu")}).summary_lines()
    assert lines[0] == "GPU vendor: nvidia (from nvml): NVIDIA H200"
    assert lines[2].startswith("ncu: missing; install Nsight Compute")


def test_no_install_steps_when_no_profiler_was_asked_for():
    env = Environment("none", "-", tools={"nsys": Tool("nsys"), "rocprofv3": Tool("rocprofv3")})
    assert any("apt-get" in ln for ln in env.summary_lines())
    quiet = env.summary_lines(install_hints=False)
    assert "nsys: missing" in quiet and not any("apt-get" in ln or "install" in ln for ln in quiet)
