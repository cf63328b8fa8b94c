"""What this machine can profile with (GPU vendor, profilers installed), asked before anything starts. Every
probe is best effort: one that fails or hangs makes the answer "absent", never an exception."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

# Where vendors install profilers off PATH (seen on real machines: the lent H200 has nsys
# only inside Nsight Compute's host folder).
_KNOWN_LOCATIONS: dict[str, tuple[str, ...]] = {
    "nsys": ("/usr/local/cuda/bin/nsys", "/opt/nvidia/nsight-systems/*/bin/nsys",
             "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys"),
    "ncu": ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu"),
    "rocprofv3": ("/opt/rocm/bin/rocprofv3", "/opt/rocm-*/bin/rocprofv3"),
    "rocprof-compute": ("/opt/rocm/bin/rocprof-compute", "/opt/rocm-*/bin/rocprof-compute"),
}

INSTALL_STEPS: dict[str, str] = {
    "nsys": "install Nsight Systems: `sudo apt-get install -y nsight-systems` from NVIDIA's CUDA apt repository (or "
            "the .run/.deb from https://developer.nvidia.com/nsight-systems), then make sure `nsys` is on PATH",
    "ncu": "install Nsight Compute: `sudo apt-get install -y nsight-compute` from NVIDIA's CUDA apt repository (it "
           "also ships with the CUDA toolkit as /usr/local/cuda/bin/ncu), then make sure `ncu` is on PATH",
    "rocprofv3": "install the ROCm profiler SDK: `sudo apt-get install -y rocprofiler-sdk` (ROCm >= 6.2; it provides "
                 "/opt/rocm/bin/rocprofv3), then add /opt/rocm/bin to PATH",
    "rocprof-compute": "install ROCm Compute Profiler: `sudo apt-get install -y rocprofiler-compute` (ROCm >= 6.3; it "
                       "provides /opt/rocm/bin/rocprof-compute)",
}

_VERSION_RE = re.compile(r"\b(\d{4}\.\d+(?:\.\d+)*|\d+\.\d+\.\d+(?:\.\d+)*)\b")


@dataclass
class Tool:  # one profiler executable: where it is and which version it says it is
    name: str
    path: str | None = None
    version: str | None = None
    off_path: bool = False  # found in a known install folder but not on PATH (usable; PATH should be fixed)

    @property
    def found(self) -> bool:
        return self.path is not None

    def install_hint(self) -> str:  # the exact step that makes this tool usable
        if self.path and self.off_path:
            return f"{self.name} is at {self.path} but not on PATH: export PATH={os.path.dirname(self.path)}:$PATH"
        return INSTALL_STEPS.get(self.name, f"install {self.name}")


@dataclass
class Environment:  # the GPU vendor of this machine and the profilers present
    vendor: str  # "nvidia" | "amd" | "none"
    vendor_source: str  # how the vendor was detected ("nvml", "nvidia-smi", ...)
    devices: list[str] = field(default_factory=list)
    tools: dict[str, Tool] = field(default_factory=dict)

    def tool(self, name: str) -> Tool:
        return self.tools.get(name) or Tool(name)

    def default_profiler(self) -> str:  # --profiler auto: the vendor's tracer when installed, else none
        if self.vendor == "nvidia" and self.tool("nsys").found:
            return "nsys"
        return "rocprofv3" if self.vendor == "amd" and self.tool("rocprofv3").found else "none"

    def summary_lines(self, install_hints: bool = True) -> list[str]:
        """Vendor, devices, each profiler's version or install step (just "missing" without ``install_hints``)."""
        lines = [f"GPU vendor: {self.vendor} (from {self.vendor_source})" + (": " + ", ".join(self.devices) if self.devices else "")]
        for name, tool in self.tools.items():
            lines.append(f"{name}: {tool.version or 'version unknown'} at {tool.path}" if tool.found and not tool.off_path
                         else f"{name}: missing; {tool.install_hint()}" if install_hints else f"{name}: missing")
        return lines

    def to_json(self) -> dict:
        return {"vendor": self.vendor, "vendor_source": self.vendor_source, "devices": self.devices,
                "tools": {n: {"path": t.path, "version": t.version, "on_path": t.found and not t.off_path}
                          for n, t in self.tools.items()}}


def find_tool(name: str, *, probe_version: bool = True, search_known: bool = True) -> Tool:  # PATH, known folders
    path, off_path = shutil.which(name), False
    if path is None and search_known:
        for pattern in _KNOWN_LOCATIONS.get(name, ()):
            hits = sorted(glob.glob(pattern))
            if hits and os.access(hits[-1], os.X_OK):
                path, off_path = hits[-1], True
                break
    return Tool(name, path=path, off_path=off_path, version=tool_version(path) if path and probe_version else None)


def tool_version(path: str, timeout_s: float = 20.0) -> str | None:  # what --version prints (None: nothing)
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _VERSION_RE.search(out.stdout + "\n" + out.stderr)
    return match.group(1) if match else None


def _nvml_devices() -> list[str] | None:
    try:
        import pynvml  # nvidia-ml-py: optional

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML here: not installed, NVML_ERROR_LIBRARY_NOT_FOUND, no driver...
        return None
    try:
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
        return [name.decode() if isinstance(name, bytes) else str(name) for name in names]
    except Exception:  # noqa: BLE001
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _smi_devices(tool: str, args: list[str], pattern: str) -> list[str] | None:
    if (path := shutil.which(tool)) is None:
        return None
    try:
        out = subprocess.run([path, *args], capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return None if out.returncode != 0 else re.findall(pattern, out.stdout, flags=re.MULTILINE)


def detect_vendor() -> tuple[str, str, list[str]]:
    """(vendor, how it was detected, device names). NVML first, then the SMI tools (not amdsmi:
    its import prints and can fail in odd ways; ``rocm-smi`` answers from a subprocess)."""
    if names := _nvml_devices():
        return "nvidia", "nvml", names
    if names := _smi_devices("nvidia-smi", ["-L"], r"^GPU \d+: (.+?) \(UUID"):
        return "nvidia", "nvidia-smi", names
    if (names := _smi_devices("rocm-smi", ["--showproductname"], r"Card [Ss]eries:\s*(.+)$")) is not None:
        return "amd", "rocm-smi", names
    if os.path.exists("/dev/kfd"):
        return "amd", "/dev/kfd", []
    return "none", "no NVML, nvidia-smi or rocm-smi answered", []


def detect_environment(tools: tuple[str, ...] = ("nsys", "ncu", "rocprofv3"), *, probe_versions: bool = True) -> Environment:
    vendor, source, devices = detect_vendor()
    return Environment(vendor=vendor, vendor_source=source, devices=devices,
                       tools={name: find_tool(name, probe_version=probe_versions) for name in tools})
