"""The small ones of issue 28 point 8, as a user meets them: each command line, run for real."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import maxinstr
from helpers.fixture_columns import DATA
from maxinstr.cli import main

REPO = Path(__file__).parents[2]


def _run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_deep_dive_refuses_an_option_it_does_not_know(capsys):
    """`--quiet` is report's and run's: deep-dive took it as the program to profile."""
    code, out, err = _run(capsys, "deep-dive", str(DATA / "nsys/h200_decode.sqlite"), "--stage", "decode", "--quiet",
                          "--dry-run")
    assert code == 2 and "no such option: --quiet (the program to profile goes after --)" in err
    # after --, or from the program's first word on, options are the program's own
    code, _, err = _run(capsys, "deep-dive", str(DATA / "nsys/h200_decode.sqlite"), "--stage", "decode", "--dry-run",
                        "--", "python", "x.py", "--quiet")
    assert code == 0 and err.rstrip().endswith("python x.py --quiet")
    code, _, err = _run(capsys, "deep-dive", str(DATA / "nsys/h200_decode.sqlite"), "--dry-run", "python", "x.py",
                        "--quiet")
    assert code == 0 and err.rstrip().endswith("python x.py --quiet")


@pytest.mark.parametrize(("arg", "what"), [("nothere.sqlite", "trace file"), ("nothere.nsys-rep", "trace file"),
                                           ("nothere", "run directory"), ("nothere.json", "report or trace file")])
def test_report_names_what_is_missing(capsys, tmp_path, arg, what):
    code, _, err = _run(capsys, "report", str(tmp_path / arg))
    assert code == 2 and err == f"maxinstr: {tmp_path / arg}: no such {what}\n"


def test_unprofiled_must_be_the_same_program(capsys):
    run = str(DATA / "nsys/h200_kvcache-run")
    code, _, err = _run(capsys, "report", run, "--unprofiled", str(DATA / "max/block_run"), "--format", "json")
    assert code == 2 and err.count("\n") == 1
    assert "--unprofiled is a run of max_block.py, this run is of reprefill_decode.py" in err
    # the same script with other arguments: kept, and said
    code, out, _ = _run(capsys, "report", run, "--unprofiled", str(DATA / "nsys/h200_reprefill-plain-run"),
                        "--format", "json")
    notes = json.loads(out)["sources"]["notes"]
    assert code == 0 and any("with --mode reprefill (this run: --mode kvcache)" in n for n in notes)
    # its own unprofiled run: nothing to say
    code, out, _ = _run(capsys, "report", run, "--unprofiled", str(DATA / "nsys/h200_kvcache-plain-run"),
                        "--format", "json")
    assert code == 0 and not any("--unprofiled" in n for n in json.loads(out)["sources"]["notes"])


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory):
    """`maxinstr run -- python examples/quickstart.py` on this (CPU) machine, as README's user runs it."""
    cwd = tmp_path_factory.mktemp("quickstart")
    shutil.copy(REPO / "examples" / "quickstart.py", cwd / "quickstart.py")
    env = dict(os.environ, PYTHONPATH=str(Path(maxinstr.__file__).parents[1]), OMP_NUM_THREADS="1", COLUMNS="120")
    for key in ("MAXINSTR_RUN_DIR", "MAXINSTR_SESSION_DIR", "MAXINSTR_WARMUP", "MAXINSTR_CAPTURE"):
        env.pop(key, None)
    p = subprocess.run([sys.executable, "-m", "maxinstr", "run", "-y", "--profiler", "none", "--no-report", "--",
                        sys.executable, "quickstart.py"], cwd=cwd, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    [run] = (cwd / "runs").iterdir()
    return cwd, run, p.stderr


def test_run_says_where_the_scripts_own_directory_went(quickstart_run):
    cwd, run, err = quickstart_run
    assert run.name.startswith("quickstart-")
    assert f"the script's session asked for runs/quickstart: under maxinstr run its records are in runs/{run.name}" in err


def test_the_quickstart_gives_every_stage_a_number(quickstart_run, capsys):
    """README's quickstart ran prefill once, with warmup=2: prefill never got a steady number."""
    cwd, run, _ = quickstart_run
    code, out, _ = _run(capsys, "report", str(run), "--format", "json")
    doc = json.loads(out)
    st = {s["name"]: s for s in doc["stages"]}
    assert code == 0 and {k: s["instances"] for k, s in st.items()} == {"prefill": 5, "decode": 40, "sample": 40}
    # the first two requests are warm-up; the last three steady (a cold start, judged on this
    # machine's timings, may take one more out)
    assert st["prefill"]["warmup"] == 2 and st["decode"]["warmup"] == 16
    assert st["prefill"]["steady"] >= 2 and st["prefill"]["host_ns"]["n"] == st["prefill"]["steady"]
    # no GPU here: the next step is the same command, for a GPU machine, and says so
    f = next(x for x in doc["diagnosis"] if x["id"] == "no_gpu_data")
    assert "this machine has no GPU: run the same command on a GPU machine" in f["next_step"]
    assert f["command"].startswith("maxinstr run ") and "quickstart.py" in f["command"]
