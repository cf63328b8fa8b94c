"""The vendor tracers `maxinstr run` drives: a :class:`Profiler` wraps the command, says what the child
needs in its environment (maxinstr's session drives the capture range), then finds, verifies and
exports the artifact."""

from __future__ import annotations

import contextlib
import glob
import shutil
import sqlite3
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from maxinstr import config
from maxinstr.errors import MaxinstrError

DEFAULT_WINDOW_S = 10.0  # captured steady-state window. The seeds found ~10 s enough to see the kernel mix

MIN_ARTIFACT_BYTES = 4096  # smaller than this, an .nsys-rep/.sqlite holds no data (empty reports are ~100 KB+)


@dataclass
class Artifact:  # what a profiler left, and whether it is usable
    profiler: str
    files: dict[str, str] = field(default_factory=dict)  # role -> path: report, sqlite, folder, trace (what readers open)
    kernels: int = 0
    ok: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def trace(self) -> str | None:
        return self.files.get("trace")

    def add(self, problem: str | None) -> None:
        if problem is not None:
            self.problems.append(problem)

    def to_json(self) -> dict:
        return {"profiler": self.profiler, "files": self.files, "kernels": self.kernels, "ok": self.ok, "problems": self.problems}


class Profiler:
    """One vendor tracer; as it is, none: stages, GPU events and samples still go to the run directory."""

    name = "none"
    uses_capture_range = False  # the child's session calls profiler start/stop (MAXINSTR_CAPTURE)
    records_markers = False  # its trace holds NVTX/roctx ranges (MAX's op markers among them)
    window_s: float | None = None

    @property
    def capture(self) -> str:
        return "steady" if self.uses_capture_range else "all"

    def wrap(self, command: list[str], output_base: Path) -> list[str]:  # command under it, writing to output_base
        return list(command)

    def child_env(self) -> dict[str, str]:  # what the profiled child needs on top of maxinstr's own
        return {}

    def flags_text(self) -> str:
        return "(no profiler)"

    def collect(self, output_base: Path, *, timeout_s: float = 600.0) -> Artifact:  # found, verified, exported
        return Artifact(profiler=self.name, ok=True)


@dataclass
class NsysOptions:  # what `maxinstr run` lets users change about an Nsight Systems capture
    osrt: bool = False
    capture: str = "steady"  # "steady": cudaProfilerApi range driven by the session; "all": whole run
    window_s: float | None = DEFAULT_WINDOW_S
    cuda_graph_trace: str = "node"  # per-kernel rows for CUDA graph replays (attribution needs them)
    extra: list[str] = field(default_factory=list)


class Nsys(Profiler):
    """Nsight Systems: CUDA + NVTX, no CPU sampling (without it a tiny script wrote a 2 GB .qdstrm);
    ``capture="steady"``: from the session's ``cuProfilerStart`` (after warm-up) to ``cuProfilerStop``."""

    name, records_markers = "nsys", True

    def __init__(self, path: str = "nsys", options: NsysOptions | None = None) -> None:
        self.path = path
        self.options = options or NsysOptions()
        self.uses_capture_range = self.options.capture == "steady"
        self.window_s = self.options.window_s

    def trace_flags_launch(self) -> list[str]:  # what to trace (nsys profile and nsys launch take them)
        graphs = [f"--cuda-graph-trace={self.options.cuda_graph_trace}"] if self.options.cuda_graph_trace else []
        return ["--trace=cuda,nvtx,osrt" if self.options.osrt else "--trace=cuda,nvtx", *graphs]

    def sampling_flags(self) -> list[str]:  # no CPU sampling or context switches (nsys profile and start)
        return ["--sample=none", "--cpuctxsw=none"]

    def trace_flags(self) -> list[str]:
        t = self.trace_flags_launch()
        return t[:1] + self.sampling_flags() + t[1:]

    def capture_flags(self) -> list[str]:
        # stop: end collection at cuProfilerStop and let the app finish normally
        return ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"] if self.uses_capture_range else []

    def wrap(self, command: list[str], output_base: Path) -> list[str]:
        return [self.path, "profile", *self.trace_flags(), *self.capture_flags(), "--force-overwrite=true",
                f"--output={output_base}", *self.options.extra, *command]

    def child_env(self) -> dict[str, str]:
        window = {config.CAPTURE_WINDOW_S: f"{self.window_s:g}"} if self.window_s else {}
        return {config.CAPTURE: "1", **window} if self.uses_capture_range else {}

    def flags_text(self) -> str:
        return " ".join(self.trace_flags() + self.capture_flags() + self.options.extra)

    def collect(self, output_base: Path, *, timeout_s: float = 600.0) -> Artifact:
        art = Artifact(profiler=self.name)
        rep, qdstrm, sqlite_path = (Path(f"{output_base}{ext}") for ext in (".nsys-rep", ".qdstrm", ".sqlite"))
        if not rep.exists() and qdstrm.exists():
            # nsys leaves only the raw stream when its importer is not beside it
            if importer := shutil.which("QdstrmImporter"):
                art.add(run_tool([importer, "-i", str(qdstrm)], timeout_s))
            else:
                art.problems.append(f"{qdstrm}: only the raw stream was written and QdstrmImporter is not on PATH")
        if not rep.exists():
            art.problems.append(
                f"{rep}: nsys wrote no report (the capture range may never have started: it starts when a stage "
                "completes its warm-up instances; a program that opens no maxinstr session needs `--warmup N`, "
                "or use `--capture all`)")
            return art
        art.files["report"] = str(rep)
        if rep.stat().st_size < MIN_ARTIFACT_BYTES:
            art.problems.append(f"{rep}: only {rep.stat().st_size} bytes, nothing was captured")
        art.add(run_tool([self.path, "export", "--type=sqlite", "--force-overwrite=true", f"--output={sqlite_path}",
                          str(rep)], timeout_s))
        if not sqlite_path.exists():
            art.problems.append(f"{sqlite_path}: `nsys export --type=sqlite` wrote nothing")
            return art
        art.files["sqlite"] = art.files["trace"] = str(sqlite_path)
        art.kernels = count_nsys_kernels(sqlite_path)
        if art.kernels == 0:
            art.problems.append(f"{sqlite_path}: no kernels in the capture (the report says what it missed; "
                                "--capture all captures the whole process)")
        art.ok = not art.problems
        return art


def count_nsys_kernels(path: Path) -> int:
    """Kernel rows in an nsys SQLite export (0 when the table is absent)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
            return int(con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0])
    except sqlite3.Error:
        return 0


class Rocprofv3(Profiler):
    """rocprofv3: kernel, marker and HIP runtime traces as CSV, the whole run (the report keeps warm-up apart)."""

    name, records_markers = "rocprofv3", True

    def __init__(self, path: str = "rocprofv3", extra: list[str] | None = None) -> None:
        self.path = path
        self.extra = list(extra or [])

    def trace_flags(self) -> list[str]:
        return ["--kernel-trace", "--marker-trace", "--hip-runtime-trace", "--memory-copy-trace", "--output-format", "csv"]

    def wrap(self, command: list[str], output_base: Path) -> list[str]:
        return [self.path, *self.trace_flags(), "-d", str(output_base), "-o", "trace", *self.extra, "--", *command]

    def flags_text(self) -> str:
        return " ".join(self.trace_flags() + self.extra)

    def collect(self, output_base: Path, *, timeout_s: float = 600.0) -> Artifact:
        art = Artifact(profiler=self.name)
        kernel_csvs = sorted(glob.glob(str(Path(output_base) / "**" / "*kernel_trace.csv"), recursive=True))
        if not kernel_csvs:
            art.problems.append(f"{Path(output_base)}: rocprofv3 wrote no kernel_trace.csv")
            return art
        art.files["folder"] = art.files["trace"] = str(Path(kernel_csvs[0]).parent)
        with open(kernel_csvs[0], "rb") as fh:
            art.kernels = max(sum(1 for _ in fh) - 1, 0)  # one header line
        if art.kernels == 0:
            art.problems.append(f"{kernel_csvs[0]}: no kernel rows")
        art.ok = not art.problems
        return art


def run_tool(cmd: list[str], timeout_s: float, *, words: int = 2) -> str | None:
    """Run a profiler's command quietly: None, or what went wrong in one line (its last line of output)."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{' '.join(cmd[:2])}: {exc}"
    tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or [""]
    return f"{' '.join(cmd[:words])} exited {out.returncode}: {tail[0]}" if out.returncode != 0 else None


def make_profiler(name: str, path: str | None = None, **options) -> Profiler:  # ``options``: its options
    if name == "nsys":
        return Nsys(path or "nsys", NsysOptions(**options))
    if name == "rocprofv3":
        return Rocprofv3(path or "rocprofv3", extra=options.get("extra"))
    if name == "none":
        return Profiler()
    raise MaxinstrError(f"unknown profiler {name!r} (choose nsys, rocprofv3 or none)")
