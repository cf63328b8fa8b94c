from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from maxinstr.errors import MaxinstrError
from maxinstr.launch.profilers import Nsys, NsysOptions, Rocprofv3, count_nsys_kernels, make_profiler

from _launch_helpers import FAKES

DATA = Path(__file__).resolve().parents[1] / "data"


def _kernels_in(path: Path) -> int:
    con = sqlite3.connect(path)
    try:
        return con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    finally:
        con.close()


def test_nsys_steady_capture_is_driven_by_the_session():
    nsys = Nsys("nsys", NsysOptions(window_s=7.5))
    cmd = nsys.wrap(["python", "x.py", "--n", "3"], Path("/r/profile"))
    assert cmd[:2] == ["nsys", "profile"]
    assert cmd[-4:] == ["python", "x.py", "--n", "3"]  # the user's command, untouched, last
    for flag in ("--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none", "--capture-range=cudaProfilerApi",
                 "--capture-range-end=stop", "--output=/r/profile", "--cuda-graph-trace=node"):
        assert flag in cmd
    assert nsys.child_env() == {"MAXINSTR_CAPTURE": "1", "MAXINSTR_CAPTURE_WINDOW_S": "7.5"}


def test_nsys_whole_run_and_osrt():
    nsys = Nsys("nsys", NsysOptions(capture="all", osrt=True, extra=["--stats=true"]))
    cmd = nsys.wrap(["./app"], Path("out"))
    assert "--trace=cuda,nvtx,osrt" in cmd and "--stats=true" in cmd
    assert not any(c.startswith("--capture-range") for c in cmd)
    assert nsys.child_env() == {}  # nothing asks the session to start a capture


def test_rocprofv3_traces_kernels_markers_and_hip_as_csv():
    cmd = Rocprofv3("rocprofv3").wrap(["python", "x.py"], Path("/r/profile"))
    assert cmd[:1] == ["rocprofv3"] and cmd[-3:] == ["--", "python", "x.py"]
    for flag in ("--kernel-trace", "--marker-trace", "--hip-runtime-trace"):
        assert flag in cmd
    assert cmd[cmd.index("--output-format") + 1] == "csv"
    assert cmd[cmd.index("-d") + 1] == "/r/profile"


def test_unknown_profiler_is_one_line():
    with pytest.raises(MaxinstrError, match="unknown profiler 'perf'"):
        make_profiler("perf")


def test_nsys_collect_exports_and_counts_kernels(tmp_path):
    base = tmp_path / "profile"
    shutil.copyfile(DATA / "nsys" / "h200_small.nsys-rep", f"{base}.nsys-rep")
    art = Nsys(str(FAKES / "nsys")).collect(base)
    assert art.ok, art.problems
    assert art.trace == f"{base}.sqlite" and Path(art.trace).exists()
    assert art.kernels == _kernels_in(DATA / "nsys" / "h200_small.sqlite") > 0


def test_nsys_collect_says_when_nothing_was_captured(tmp_path):
    art = Nsys(str(FAKES / "nsys")).collect(tmp_path / "profile")
    assert not art.ok
    assert len(art.problems) == 1 and art.problems[0].startswith(f"{tmp_path}/profile.nsys-rep: nsys wrote no report (the capture range may never have started")
    assert "--warmup N" in art.problems[0]
    (tmp_path / "profile.nsys-rep").write_bytes(b"\0" * 100)
    art = Nsys(str(FAKES / "nsys")).collect(tmp_path / "profile")
    assert not art.ok and "only 100 bytes" in art.problems[0]


def test_nsys_collect_flags_a_capture_without_kernels(tmp_path, monkeypatch):
    # A real export with no kernel table at all (the cloverleaf fixture has kernels; build
    # an empty-schema copy from a real file by dropping its kernel table).
    empty = tmp_path / "nokernels.sqlite"
    shutil.copyfile(DATA / "nsys" / "h200_small.sqlite", empty)
    con = sqlite3.connect(empty)
    con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    con.commit()
    con.close()
    assert count_nsys_kernels(empty) == 0
    monkeypatch.setenv("FAKE_NSYS_SQLITE", str(empty))
    shutil.copyfile(DATA / "nsys" / "h200_small.nsys-rep", tmp_path / "p.nsys-rep")
    art = Nsys(str(FAKES / "nsys")).collect(tmp_path / "p")
    assert not art.ok and "no kernels in the capture" in art.problems[0]


def test_rocprofv3_collect_finds_the_kernel_csv(tmp_path):
    folder = tmp_path / "profile" / "host" / "1234"
    folder.mkdir(parents=True)
    shutil.copyfile(DATA / "rocprof" / "rocprofv3_llamacpp_decode" / "decode_kernel_trace.csv", folder / "trace_kernel_trace.csv")
    art = Rocprofv3().collect(tmp_path / "profile")
    assert art.ok and art.trace == str(folder)
    assert art.kernels == 144  # PROVENANCE.md: 144 kernels
    assert not Rocprofv3().collect(tmp_path / "empty").ok


@pytest.mark.parametrize("profiler, max_ops, expected", [
    ("nsys", None, None), ("rocprofv3", None, None),  # off unless asked: they change what is watched
    ("nsys", "detailed", "detailed"), ("rocprofv3", "on", "on"), ("none", "detailed", None)])
def test_maxs_markers_only_when_asked_and_a_profiler_records_them(tmp_path, monkeypatch, profiler, max_ops, expected):
    """MAX's own ranges (MODULAR_ENABLE_PROFILING) nest under the stages in an nsys/rocprofv3 trace,
    but MAX recompiles its graphs with them and they cost it host time (H200 decoder: 915 against
    1527 tokens/s): `maxinstr run` turns them on only with --max-ops, and only where a profiler
    records them. A user's own MODULAR_ENABLE_PROFILING stands either way."""
    from maxinstr.launch.runner import RunOptions, RunSpec, child_env

    monkeypatch.delenv("MODULAR_ENABLE_PROFILING", raising=False)
    options = RunOptions(profiler=make_profiler(profiler), max_ops=max_ops)
    spec = RunSpec(command=["python3", "x.py"], run_dir=tmp_path, label="", env={})
    env = child_env(spec, options, tmp_path, base={})
    assert env.get("MODULAR_ENABLE_PROFILING") == expected
    # ours is marked as ours: the start-up hook may turn it off where MAX's markers would abort MAX
    assert env.get("MAXINSTR_MAX_PROFILING_BY_RUN") == ("1" if expected else None)
    # the user's own (from the environment, or a --sweep value) stands, unmarked, also when a
    # parent maxinstr run's mark is inherited
    base = {"MODULAR_ENABLE_PROFILING": "off", "MAXINSTR_MAX_PROFILING_BY_RUN": "1"}
    env = child_env(spec, options, tmp_path, base=base)
    assert env["MODULAR_ENABLE_PROFILING"] == "off" and "MAXINSTR_MAX_PROFILING_BY_RUN" not in env
    swept = RunSpec(command=["python3", "x.py"], run_dir=tmp_path, label="", env={"MODULAR_ENABLE_PROFILING": "on"})
    env = child_env(swept, options, tmp_path, base={})
    assert env["MODULAR_ENABLE_PROFILING"] == "on" and "MAXINSTR_MAX_PROFILING_BY_RUN" not in env



def test_the_plan_says_what_became_of_max_ops(tmp_path):
    """--max-ops asks for MAX's markers; where `maxinstr run` leaves them as they are (no profiler
    records them, or the user's own MODULAR_ENABLE_PROFILING stands) the plan says so in one
    line, instead of dropping the option without a word. Real runs (nsys: the test fake)."""
    import sys

    from _launch_helpers import base_env, run_cli

    def run(env, *args):
        out = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        res = run_cli(["run", "-y", "-q", "--no-report", "-o", str(out), *args, "--", sys.executable, "-c",
                       "import os; print(os.environ.get('MODULAR_ENABLE_PROFILING'))"], env)
        assert res.returncode == 0, res.stderr
        plan = [line.strip() for line in res.stderr.splitlines()]
        return plan, (out / "child.log").read_text().split()[0]

    env = {k: v for k, v in base_env().items() if k != "MODULAR_ENABLE_PROFILING"}
    plan, seen = run(env, "--profiler", "none", "--max-ops", "detailed")
    assert seen == "None" and "--max-ops detailed: left off, no profiler records MAX's markers (--profiler none)" in plan
    plan, seen = run({**env, "MODULAR_ENABLE_PROFILING": "off"}, "--profiler", "nsys", "--max-ops", "on")
    assert seen == "off" and "--max-ops on: not used, MODULAR_ENABLE_PROFILING=off as you set it" in plan, plan
    plan, seen = run(env, "--profiler", "nsys", "--max-ops", "detailed")
    assert seen == "detailed" and any(line.startswith("MAX's op markers: MODULAR_ENABLE_PROFILING=detailed") for line in plan)
    plan, seen = run(env, "--profiler", "nsys")
    assert seen == "None" and not any("max-ops" in line or "MAX's op markers" in line for line in plan), plan
