"""`maxinstr run` end to end: real child processes, fake profilers first on PATH."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _launch_helpers import base_env, run_cli

ENV_PROBE = """
import json, os, sys
keys = ["MAXINSTR_RUN_DIR", "MAXINSTR_CAPTURE", "MAXINSTR_CAPTURE_WINDOW_S", "MODULAR_ENABLE_PROFILING", "BATCH"]
print("ENV " + json.dumps({k: os.environ.get(k) for k in keys} | {"argv": sys.argv[1:]}), flush=True)
"""


def _env_line(stdout: str) -> dict:
    return json.loads(next(line for line in stdout.splitlines() if line.startswith("ENV "))[4:])


def test_nsys_run_end_to_end(tmp_path, script):
    prog = script("probe.py", ENV_PROBE)
    log = tmp_path / "nsys.jsonl"
    out = tmp_path / "run"
    res = run_cli(["run", "--profiler", "nsys", "--window", "4", "-o", str(out), "--", sys.executable, str(prog)],
                  base_env(FAKE_NSYS_LOG=str(log)))
    assert res.returncode == 0, res.stderr
    seen = _env_line(res.stdout)
    assert seen["MAXINSTR_RUN_DIR"] == str(out.resolve())
    assert seen["MAXINSTR_CAPTURE"] == "1" and seen["MAXINSTR_CAPTURE_WINDOW_S"] == "4"
    assert seen["MODULAR_ENABLE_PROFILING"] is None  # MAX's markers only with --max-ops
    calls = [json.loads(line)["argv"] for line in log.read_text().splitlines()]
    profile = next(c for c in calls if c[0] == "profile")
    assert "--capture-range=cudaProfilerApi" in profile and profile[-2:] == [sys.executable, str(prog)]
    assert any(c[0] == "export" for c in calls)
    # Artifacts, verified and exported, and where they are.
    assert (out / "profile.nsys-rep").exists() and (out / "profile.sqlite").exists()
    launch = json.loads((out / "launch.json").read_text())
    assert launch["run"]["status"] == "ok" and launch["artifact"]["ok"] and launch["artifact"]["kernels"] > 0
    assert launch["profiler"]["capture"] == "steady" and launch["profiler"]["window_s"] == 4
    assert "nsys report: nsys-ui " in res.stderr and str(out / "profile.nsys-rep") in res.stderr
    # The session the bootstrap opened wrote the run directory; the profiler is merged in.
    meta = json.loads((out / "meta.json").read_text())
    assert meta["profiler"]["name"] == "nsys" and meta["profiler"]["trace"] == str(out.resolve() / "profile.sqlite")
    assert meta["command"] == [sys.executable, str(prog)]


def test_user_setting_of_modular_profiling_is_kept(tmp_path, script):
    prog = script("probe.py", ENV_PROBE)
    res = run_cli(["run", "--profiler", "none", "-o", str(tmp_path / "r"), "--", sys.executable, str(prog)],
                  base_env(MODULAR_ENABLE_PROFILING="off"))
    assert res.returncode == 0, res.stderr
    assert _env_line(res.stdout)["MODULAR_ENABLE_PROFILING"] == "off"


def test_missing_profiler_says_the_install_step_before_starting(tmp_path, script):
    marker = tmp_path / "started"
    prog = script("touch.py", f"open({str(marker)!r}, 'w').write('x')\n")
    env = base_env(fakes=False, PATH=str(tmp_path))  # nothing on PATH: no nsys anywhere we look
    env["PATH"] = os.pathsep.join([str(tmp_path), os.path.dirname(sys.executable)])
    res = run_cli(["run", "--profiler", "nsys", "-o", str(tmp_path / "r"), "--", sys.executable, str(prog)], env)
    if "at /" in res.stderr and "nsys:" in res.stderr and "missing" not in res.stderr.split("nsys:")[1].split("\n")[0]:
        pytest.skip("this machine has nsys in a known install folder")
    assert res.returncode == 2
    assert "nsys is not installed: install Nsight Systems: `sudo apt-get install -y nsight-systems`" in res.stderr
    assert not marker.exists()


def test_auto_without_gpu_runs_unprofiled(tmp_path, script):
    from maxinstr.launch.env import detect_vendor

    if detect_vendor()[0] != "none":
        pytest.skip("this machine has a GPU")
    prog = script("ok.py", "print('cpu only')\n")
    res = run_cli(["run", "--no-report", "-o", str(tmp_path / "r"), "--", sys.executable, str(prog)], base_env())
    assert res.returncode == 0, res.stderr
    assert "no GPU found: running without a profiler" in res.stderr
    assert json.loads((tmp_path / "r" / "launch.json").read_text())["profiler"]["name"] == "none"


def test_early_crash_fails_fast_with_the_error(tmp_path, script):
    prog2 = script("crash2.py", "import json\njson.load(open('/no/such/config.json'))\n")
    t0 = time.monotonic()
    res = run_cli(["run", "--profiler", "nsys", "-o", str(tmp_path / "r"), "--", sys.executable, str(prog2)], base_env())
    assert time.monotonic() - t0 < 30
    assert res.returncode == 1
    assert "run exited with status 1" in res.stderr
    assert "FileNotFoundError: [Errno 2] No such file or directory: '/no/such/config.json'" in res.stderr
    launch = json.loads((tmp_path / "r" / "launch.json").read_text())
    assert launch["run"]["fatal"]["label"] == "python traceback"


def test_capture_that_never_started_is_a_failure(tmp_path, script):
    prog = script("ok.py", "print('no GPU work')\n")
    res = run_cli(["run", "--profiler", "nsys", "-o", str(tmp_path / "r"), "--", sys.executable, str(prog)],
                  base_env(FAKE_NSYS_NO_REPORT="1"))
    assert res.returncode == 1
    assert "nsys wrote no report (the capture range may never have started" in res.stderr


@pytest.mark.slow
def test_repeat_and_sweep_give_one_process_and_run_dir_each(tmp_path, script):
    """issue 17, point 5: `--repeat 2 --sweep BATCH=1,4` wrote a flat BATCH=1.r1 .. layout that
    compare could not pool per side, and printed a command comparing every run against the
    first: a 3.8x slowdown read "cannot tell". Each value's repeats are one folder now, the
    printed command compares the values with their repeats pooled, and it gives a verdict."""
    prog = script("probe.py", ENV_PROBE + """
import time, maxinstr
print('PID', os.getpid())
with maxinstr.session("ignored", warmup=1):
    for i in range(12):
        with maxinstr.stage("step"):
            time.sleep(0.001 * int(os.environ["BATCH"]))  # BATCH=4: 4x the time of BATCH=1
""")
    out = tmp_path / "sweep"
    res = run_cli(["run", "--profiler", "none", "--no-report", "--repeat", "2", "--sweep", "BATCH=1,4", "-o", str(out),
                   "--", sys.executable, str(prog)], base_env())
    assert res.returncode == 0, res.stderr
    runs = sorted(str(p.relative_to(out)) for p in out.glob("*/*") if (p / "meta.json").is_file())
    assert runs == ["BATCH=1/r1", "BATCH=1/r2", "BATCH=4/r1", "BATCH=4/r2"]
    batches = [json.loads(l[4:])["BATCH"] for l in res.stdout.splitlines() if l.startswith("ENV ")]
    pids = {l.split()[1] for l in res.stdout.splitlines() if l.startswith("PID ")}
    assert batches == ["1", "1", "4", "4"] and len(pids) == 4
    for r in runs:
        launch = json.loads((out / r / "launch.json").read_text())
        assert launch["run"]["status"] == "ok" and launch["label"] == r.replace("/", ".")
    # the printed command, run as printed: each value's two repeats pooled into a side
    (line,) = [l for l in res.stdout.splitlines() if "maxinstr compare " in l]
    argv = shlex.split(line.split("maxinstr compare ", 1)[1])
    assert argv == [str(out / "BATCH=1"), str(out / "BATCH=4")]
    cmp = run_cli(["compare", *argv, "--format", "json"], base_env())
    assert cmp.returncode == 0, cmp.stderr
    c = json.loads(cmp.stdout)["comparisons"][0]
    row = next(r for r in c["stages"] if r["stage"] == "step")
    assert c["runs"] == {"a": 2, "b": 2} and row["noise_method"] == "runs+bootstrap"
    assert row["verdict"] == "slower" and row["median_delta_rel"] > 1.5, row
    # compare lists the sweep value among the settings that differ, not each run's own directory
    settings = {r["key"]: (r["a"], r["b"]) for r in c["settings"]}
    assert settings.get("sweep.BATCH") == ("1", "4") and "env.MAXINSTR_RUN_DIR" not in settings
    # the sweep folder is not one side, and a folder mixing two values' runs is not pooled
    bad = run_cli(["compare", str(out), str(out / "BATCH=4")], base_env())
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--sweep folder" in bad.stderr
    assert f"maxinstr compare {out / 'BATCH=1'} {out / 'BATCH=4'}" in bad.stderr
    flat = tmp_path / "flat"  # the layout of earlier versions: BATCH=1.r1 .. side by side
    for r in runs:
        shutil.copytree(out / r, flat / r.replace("/", "."))
    bad = run_cli(["compare", str(flat), str(out / "BATCH=4")], base_env())
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "holds runs of 2 --sweep values (BATCH=1, BATCH=4)" in bad.stderr


def test_plan_layout_and_the_compare_it_suggests(tmp_path):
    """Where each run of --repeat/--sweep goes, and the compare command printed after them."""
    from maxinstr.launch.runner import compare_hint, plan_runs, sweep_label

    out = tmp_path / "o"
    both = plan_runs(["p"], out, repeat=2, sweep="BATCH=1,4")
    assert [s.run_dir for s in both] == [out / "BATCH=1/r1", out / "BATCH=1/r2", out / "BATCH=4/r1", out / "BATCH=4/r2"]
    assert [s.label for s in both] == ["BATCH=1.r1", "BATCH=1.r2", "BATCH=4.r1", "BATCH=4.r2"]
    assert compare_hint(both).endswith(f"maxinstr compare {out / 'BATCH=1'} {out / 'BATCH=4'}")
    reps = plan_runs(["p"], out, repeat=3)
    assert [s.run_dir for s in reps] == [out / "r1", out / "r2", out / "r3"]
    assert compare_hint(reps).endswith(f"maxinstr compare {out} RUNS_AFTER")  # one side: not r1 against r2
    flags = plan_runs(["p"], out, sweep="--batch-size=2,4")
    assert [s.run_dir for s in flags] == [out / "batch-size=2", out / "batch-size=4"]
    assert "--repeat 3" in compare_hint(flags)  # one run a value cannot tell a change from noise
    assert compare_hint(plan_runs(["p"], out)) is None
    assert [sweep_label(x) for x in ("BATCH=8.r2", "r2", "BATCH=8", "", "batch-size=2.r10")] == [
        "BATCH=8", "", "BATCH=8", "", "batch-size=2"]


def test_sweep_over_a_flag(tmp_path, script):
    prog = script("probe.py", ENV_PROBE)
    res = run_cli(["run", "--profiler", "none", "--sweep=--batch-size=2,4", "-o", str(tmp_path / "s"), "--",
                   sys.executable, str(prog), "--steps", "3"], base_env())
    assert res.returncode == 0, res.stderr
    argvs = [json.loads(l[4:])["argv"] for l in res.stdout.splitlines() if l.startswith("ENV ")]
    assert argvs == [["--steps", "3", "--batch-size", "2"], ["--steps", "3", "--batch-size", "4"]]
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["batch-size=2", "batch-size=4"]


@pytest.mark.slow
def test_warm_run_is_unprofiled_and_reported_as_startup(tmp_path, script):
    prog = script("slow.py", "import time; time.sleep(0.3); print('done')\n")
    log = tmp_path / "nsys.jsonl"
    out = tmp_path / "r"
    res = run_cli(["run", "--profiler", "nsys", "--warm-run", "-o", str(out), "--", sys.executable, str(prog)],
                  base_env(FAKE_NSYS_LOG=str(log)))
    assert res.returncode == 0, res.stderr
    profiles = [l for l in log.read_text().splitlines() if json.loads(l)["argv"][0] == "profile"]
    assert len(profiles) == 1  # the warm run was not under nsys
    launch = json.loads((out / "launch.json").read_text())
    assert launch["startup"]["warm_run_wall_s"] >= 0.3 and launch["startup"]["status"] == "ok"
    assert (out / "warm-run" / "child.log").read_text() == "done\n"
    assert "startup (unprofiled warm run): finished in" in res.stderr


def test_rocprofv3_run(tmp_path, script):
    prog = script("ok.py", "print('hip work')\n")
    out = tmp_path / "r"
    res = run_cli(["run", "--profiler", "rocprofv3", "--no-report", "-o", str(out), "--", sys.executable, str(prog)], base_env())
    assert res.returncode == 0, res.stderr
    art = json.loads((out / "launch.json").read_text())["artifact"]
    assert art["ok"] and art["kernels"] == 144 and art["files"]["trace"] == str((out / "profile").resolve())
    traces = pytest.importorskip("maxinstr.traces")
    trace = traces.open_trace(art["files"]["trace"])  # the folder we hand on is one the readers take
    assert trace.format == "rocprofv3-csv" and len(trace.ops) == 144


def test_stage_injection_records_third_party_code(tmp_path, script):
    pytest.importorskip("maxinstr.record")
    lib = tmp_path / "vendorlib.py"
    lib.write_text("class Engine:\n    def step(self, i):\n        return i * 2\n\ndef load():\n    return Engine()\n")
    prog = script("main.py", """
        import sys
        sys.path.insert(0, sys.argv[1])
        from vendorlib import Engine, load
        e = load()
        print(sum(e.step(i) for i in range(7)))
    """)
    out = tmp_path / "r"
    res = run_cli(["run", "--profiler", "none", "--no-report", "--stage", "vendorlib:Engine.step=decode",
                   "--stage", "vendorlib:load", "-o", str(out), "--", sys.executable, str(prog), str(tmp_path)], base_env())
    assert res.returncode == 0, res.stderr
    assert "42" in res.stdout
    import maxinstr

    run = maxinstr.load(out)
    names, counts = __import__("numpy").unique(run["name"].astype(str), return_counts=True)
    assert dict(zip(names.tolist(), counts.tolist())) == {"decode": 7, "load": 1}


def test_bad_stage_spec_is_rejected_before_starting(tmp_path, script):
    prog = script("ok.py", "print(1)\n")
    res = run_cli(["run", "--profiler", "none", "--stage", "nocolon", "--", sys.executable, str(prog)], base_env())
    assert res.returncode == 2 and "expected MODULE:QUALNAME[=name]" in res.stderr


def test_ctrl_c_leaves_a_usable_partial_result(tmp_path, script):
    pidfile = tmp_path / "child.pid"
    prog = script("serve.py", f"""
        import os, time
        open({str(pidfile)!r}, "w").write(str(os.getpid()))
        print("serving", flush=True)
        time.sleep(120)
    """)
    out = tmp_path / "r"
    proc = subprocess.Popen([sys.executable, "-m", "maxinstr", "run", "--profiler", "nsys", "--no-report", "-o", str(out),
                             "--", sys.executable, str(prog)], env=base_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pidfile.exists(), proc.stderr.read() if proc.poll() is not None else "child never started"
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to maxinstr (the child is in its own group)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    launch = json.loads((out / "launch.json").read_text())
    assert launch["run"]["status"] == "interrupted"
    assert launch["artifact"]["ok"]  # nsys wrote its report on SIGINT; exported and verified
    assert (out / "profile.sqlite").exists()
    child = int(pidfile.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists() or open(f"/proc/{child}/stat").read().rsplit(")", 1)[-1].split()[0] == "Z"


def test_on_a_terminal_the_plan_is_shown_and_asked(tmp_path, script):
    import pty

    marker = tmp_path / "ran"
    prog = script("touch.py", f"open({str(marker)!r}, 'w').write('x')\n")
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "maxinstr", "run", "--profiler", "none", "-o", str(tmp_path / "r"),
                             "--", sys.executable, str(prog)], env=base_env(), stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 30
    while b"Start?" not in seen and time.monotonic() < deadline:
        try:
            seen += os.read(master, 4096)
        except OSError:
            break
    assert b"Start?" in seen and b"plan" in seen
    os.write(master, b"n\n")
    assert proc.wait(timeout=30) == 130
    os.close(master)
    assert not marker.exists()  # declined: nothing ran


@pytest.mark.slow
def test_a_second_run_in_the_same_directory_replaces_the_first(tmp_path, script):
    pytest.importorskip("maxinstr.record")
    prog = script("st.py", """
        import sys, maxinstr
        with maxinstr.session("ignored", warmup=0):
            for i in range(int(sys.argv[1])):
                with maxinstr.stage("step"):
                    pass
    """)
    out = tmp_path / "r"
    (tmp_path / "keep.txt").write_text("x")
    for n in (3, 5):
        res = run_cli(["run", "--profiler", "none", "--no-report", "-o", str(out), "--", sys.executable, str(prog), str(n)], base_env())
        assert res.returncode == 0, res.stderr
    import maxinstr

    assert len(maxinstr.load(out)) == 5  # not 8: the first run's parts were replaced
    assert (tmp_path / "keep.txt").exists()


def test_a_folder_that_holds_no_run_is_never_cleared(tmp_path):
    from maxinstr.launch.layout import clear_previous_run

    (tmp_path / "profile.py").write_text("x")
    (tmp_path / "child.log").write_text("mine")
    assert clear_previous_run(tmp_path) == []
    assert (tmp_path / "profile.py").exists() and (tmp_path / "child.log").exists()
    (tmp_path / "launch.json").write_text("{}")
    assert sorted(clear_previous_run(tmp_path)) == ["child.log", "launch.json"]
    assert (tmp_path / "profile.py").exists()


def test_a_run_a_live_process_still_writes_is_never_cleared(tmp_path):
    """issue 20, class 1: `maxinstr run -o DIR` on the run of a live process refuses (one line
    naming it) instead of deleting its records; once that process is gone the run is replaced."""
    import socket

    from maxinstr.errors import MaxinstrError
    from maxinstr.launch.layout import clear_previous_run

    part = tmp_path / "parts" / "p1"
    part.mkdir(parents=True)
    (part / "stages.bin").write_bytes(b"")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        doc = {"pid": live.pid, "host": socket.gethostname(), "status": "running", "started_unix_ns": time.time_ns()}
        (part / "part.json").write_text(json.dumps(doc))
        (tmp_path / "meta.json").write_text(json.dumps({"format": "maxinstr-run", "version": 1, "status": "closed"}))
        with pytest.raises(MaxinstrError, match=rf"still written by a live process \(pid {live.pid} \(part p1\)\)"):
            clear_previous_run(tmp_path)
        assert (part / "stages.bin").exists()
    finally:
        live.kill()
        live.wait()
    assert "parts" in clear_previous_run(tmp_path)  # gone now: a previous run
