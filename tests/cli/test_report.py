"""`maxinstr report` and `maxinstr compare` end to end on the real fixtures."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from helpers.fixture_columns import DATA
from maxinstr.cli import main

# every trace fixture the readers accept (a folder of rocprofv3 CSVs counts as one trace)
ALL_TRACES = sorted(
    [str(p.relative_to(DATA)) for p in DATA.glob("nsys/*.sqlite")]
    + [str(p.relative_to(DATA)) for p in DATA.glob("nsys/*.nsys-rep")]
    + [str(p.relative_to(DATA)) for p in DATA.glob("kineto/*.json.gz")]
    + [str(p.relative_to(DATA)) for p in DATA.glob("rocprof/rpd/*.rpd*")]
    + [str(p.relative_to(DATA)) for p in DATA.glob("rocprof/*/*_trace.csv")]
    + ["rocprof/rocprofv3_docs", "rocprof/rocprofv3_llamacpp_decode"]
)


def run_cli(capsys, *args):
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("rel", ALL_TRACES)
def test_report_trace_on_every_fixture(rel, capsys):
    rc, out, err = run_cli(capsys, "report", "--trace", str(DATA / rel), "--format", "json", "--quiet")
    if rel.endswith(".nsys-rep") and rc != 0:
        # needs `nsys export` on PATH; without it the one-line error must say so
        assert rc == 2 and err.count("\n") == 1 and rel.split("/")[-1] in err
        return
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["schema"] == "maxinstr-report" and doc["gpu"]["ops"] > 0


def test_report_text_default(capsys):
    rc, out, _ = run_cli(capsys, "report", "--trace", str(DATA / "nsys/h200_decode.sqlite"))
    assert rc == 0
    assert "Stages (steady state)" in out and "decode" in out and "Diagnosis" in out


def test_report_markdown_to_file_and_rerender_from_json(tmp_path, capsys):
    md, js = tmp_path / "note.md", tmp_path / "r.json"
    rc, _, err = run_cli(capsys, "report", "--trace", str(DATA / "nsys/h200_small.sqlite"), "--format", "md", "-o", str(md))
    assert rc == 0 and "wrote" in err and md.read_text().startswith("# Performance note")
    assert run_cli(capsys, "report", "--trace", str(DATA / "nsys/h200_small.sqlite"), "--format", "json", "-o", str(js))[0] == 0
    rc, out, _ = run_cli(capsys, "report", str(js), "--format", "md")
    assert rc == 0 and "## Stage timings (steady state)" in out and "| decode |" in out.replace("&nbsp;", "")


def test_report_warmup_option(capsys):
    rc, out, _ = run_cli(capsys, "report", "--trace", str(DATA / "nsys/h200_small.sqlite"), "--format", "json", "--warmup", "3")
    doc = json.loads(out)
    assert rc == 0 and doc["warmup"]["n"] == 3
    assert all(s["warmup"] == 3 for s in doc["stages"])  # 20 instances each of step/decode/sample


def test_report_errors_are_one_line(tmp_path, capsys):
    rc, _, err = run_cli(capsys, "report")
    assert rc == 2 and "RUN_DIR" in err
    rc, _, err = run_cli(capsys, "report", "--trace", str(tmp_path / "missing.sqlite"))
    assert rc == 2 and err.strip().count("\n") == 0 and "missing.sqlite" in err
    bad = tmp_path / "bad.sqlite"
    bad.write_text("not a database")
    rc, _, err = run_cli(capsys, "report", "--trace", str(bad))
    assert rc == 2 and err.strip().count("\n") == 0 and "bad.sqlite" in err
    rc, _, err = run_cli(capsys, "report", str(tmp_path))
    assert rc == 2 and err.strip().count("\n") == 0 and "meta.json" in err


def test_report_html_and_perfetto_use_their_modules_or_say_missing(capsys):
    import importlib.util

    for fmt in ("html", "perfetto"):
        rc, out, err = run_cli(capsys, "report", "--trace", str(DATA / "nsys/h200_small.sqlite"), "--format", fmt)
        if importlib.util.find_spec(f"maxinstr.render.{fmt}") is None:
            assert rc == 2 and f"--format {fmt}: not available" in err and err.count("\n") == 1
        else:
            assert rc == 0 and out


def _session_run(path: Path, sleep_s: float, n: int = 12) -> Path:
    import maxinstr

    with maxinstr.session(path, warmup=2):
        for i in range(n):
            with maxinstr.stage("decode", step=i):
                time.sleep(sleep_s)
    return path


# steady steps' spread around a run's level (ns): what a quiet machine shows, pinned
JITTER_NS = (0, 30_000, -20_000, 50_000, 10_000, -40_000, 20_000, 0, -10_000, 40_000)


def _pinned_run(path: Path, level_ns: int, warmup: int = 2, warmup_ns: int = 20_000_000) -> Path:
    """A closed run directory as a session writes it: ``warmup`` warm-up steps of ``warmup_ns``,
    then a ``decode`` step per JITTER_NS of ``level_ns`` + jitter. The durations are the test's,
    not a loaded machine's sleeps."""
    from maxinstr.rundir import format as fmt

    steps = [warmup_ns] * warmup + [level_ns + j for j in JITTER_NS]
    rows = np.zeros(len(steps), dtype=fmt.STAGE_DTYPE)
    rows["id"] = (7 << 32) | np.arange(1, len(steps) + 1)
    rows["parent_id"] = -1
    rows["tid"] = 7
    rows["host_start_ns"] = 10**9 + np.arange(len(steps), dtype=np.int64) * 50_000_000
    rows["host_end_ns"] = rows["host_start_ns"] + np.array(steps, dtype=np.int64)
    rows["gpu_start_ns"] = rows["gpu_end_ns"] = -1
    rows["step"] = np.arange(len(steps))
    part = path / "parts" / "p7"
    part.mkdir(parents=True)
    (part / fmt.STAGES_FILE).write_bytes(rows.tobytes())
    (part / fmt.STRINGS_FILE).write_text(json.dumps({"id": 0, "s": "decode"}) + "\n")
    (part / fmt.PART_FILE).write_text(json.dumps({"pid": 7, "status": "closed", "rows_written": len(steps)}))
    (path / fmt.META_FILE).write_text(json.dumps({"format": fmt.FORMAT_NAME, "version": fmt.FORMAT_VERSION,
                                                  "status": "closed", "warmup": warmup}))
    return path


def test_report_on_a_recorded_run(tmp_path, capsys):
    run = _session_run(tmp_path / "run", 0.001)
    rc, out, _ = run_cli(capsys, "report", str(run), "--format", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["sources"]["run"] == str(run) and doc["perturbed"] is False
    dec = doc["stages"][0]
    assert dec["name"] == "decode" and dec["warmup"] == 2 and dec["instances"] == 12
    assert dec["host_ns"]["median"] >= 1e6  # slept 1 ms
    assert any(".py" in x["command"] or "pytest" in x["command"] for x in doc["reproduce"])
    ids = [f["id"] for f in doc["diagnosis"]]
    gpu_timed = any(s["gpu_event_ns"]["n"] for s in doc["stages"])  # on a GPU machine events are recorded
    assert ("no_gpu_data" in ids) != gpu_timed and "profiled_timings" not in ids


def test_compare_runs_says_slower_and_within_noise(tmp_path, capsys):
    """One run a side cannot tell a change from run-to-run noise (issue 17, point 5: A/A pairs of
    one CPU command were called 68% faster): beyond the run's own spread it says "cannot tell".
    Folders of fresh-process repeats (maxinstr run --repeat N) are pooled, and the spread of
    their run medians bounds the noise."""
    # A's runs step at 2.0 and 2.1 ms, B's at 8.0 and 8.2 ms (each +- 50 us of pinned jitter)
    a = [_pinned_run(tmp_path / "a" / f"r{i}", lvl) for i, lvl in ((1, 2_000_000), (2, 2_100_000))]
    b = [_pinned_run(tmp_path / "b" / f"r{i}", lvl) for i, lvl in ((1, 8_000_000), (2, 8_200_000))]
    rc, out, _ = run_cli(capsys, "compare", str(a[0]), str(b[0]), "--format", "json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["schema"] == "maxinstr-compare" and doc["baseline"] == str(a[0])
    row = doc["comparisons"][0]["stages"][0]
    assert row["stage"] == "decode" and row["verdict"] == "cannot tell" and row["noise_method"] == "bootstrap"
    assert row["median_delta_ns"] == 6_000_000 and row["run_to_run_bound_ns"] is None
    rc, out, _ = run_cli(capsys, "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--format", "json")
    c = json.loads(out)["comparisons"][0]
    row = c["stages"][0]
    # 2 runs x 10 steady steps, the 2 warm-up steps of each run apart
    assert c["runs"] == {"a": 2, "b": 2} and row["a"]["runs"] == 2 and row["a"]["n"] == 20
    assert row["verdict"] == "slower" and row["noise_method"] == "runs+bootstrap"
    assert row["noise_bound_ns"] >= row["run_to_run_bound_ns"] and row["noise_bound_ns"] < row["median_delta_ns"]
    rc, out, _ = run_cli(capsys, "compare", str(a[0]), str(a[0]), "--format", "json")
    row = json.loads(out)["comparisons"][0]["stages"][0]
    assert row["verdict"] == "within noise" and row["median_delta_ns"] == 0
    rc, out, _ = run_cli(capsys, "compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert rc == 0 and "slower" in out and "Host time per stage" in out and "(2/2 runs)" in out


def test_compare_bound_holds_run_to_run(tmp_path, capsys):
    """Fresh processes of one program differ by more than one run's instances spread: here side
    A's two runs take 3 and 5 ms a step, B's two 4 ms. Pooled, the medians' spread across runs
    bounds the noise (each run alone is tight: its own bootstrap bound would call any pair of
    them a change)."""
    for side, levels in (("a", (3_000_000, 5_000_000)), ("b", (4_000_000, 4_000_000))):
        for i, lvl in enumerate(levels):
            _pinned_run(tmp_path / side / f"r{i}", lvl)
    rc, out, _ = run_cli(capsys, "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--format", "json")
    row = json.loads(out)["comparisons"][0]["stages"][0]
    assert rc == 0 and row["verdict"] == "within noise", row
    assert row["run_to_run_bound_ns"] > 2 * row["within_run_bound_ns"]


def test_compare_traces_kernel_mix_and_saved_report(tmp_path, capsys):
    saved = tmp_path / "nsys.json"
    assert run_cli(capsys, "report", "--trace", str(DATA / "nsys/h200_decode.sqlite"), "--format", "json", "-o", str(saved))[0] == 0
    rc, out, _ = run_cli(capsys, "compare", str(saved), str(DATA / "kineto/h200_decode.pt.trace.json.gz"), "--format", "json")
    assert rc == 0
    c = json.loads(out)["comparisons"][0]
    fam = {f["family"]: f for f in c["families"]}
    assert fam["attention"]["a_share"] == 0 and fam["attention"]["b_share"] > 0.5 and fam["attention"]["changed"]
    assert any(k["name"].startswith("fmha_cutlassF") and k["family"] == "attention" for k in c["kernels_appeared"])
    assert any(k["name"].startswith("nvjet_sm90_tst_128x8") for k in c["kernels_disappeared"])
    dec = next(r for r in c["stages"] if r["stage"] == "decode")
    assert dec["noise_method"] == "mad"  # a saved report has summaries only
    assert next(r for r in c["stages"] if r["stage"] == "request")["verdict"].startswith("only in")
    # what the validation lines ask to check: GPU busy and the findings, on both sides
    chk = next(r for r in c["checks"] if r["stage"] == "decode")
    assert 0 < chk["gpu_busy_frac"]["a"] < 0.6 and chk["gpu_busy_frac"]["b"] is not None
    assert "launch_bound" in chk["findings"]["a"]
    rc, out, _ = run_cli(capsys, "compare", str(saved), str(DATA / "kineto/h200_decode.pt.trace.json.gz"))
    assert "What the diagnosis asks to check" in out and "GPU busy" in out


def test_compare_settings_diff(tmp_path, capsys):
    import maxinstr

    for name, dtype in (("a", "bf16"), ("b", "fp8")):
        with maxinstr.session(tmp_path / name, warmup=0, dtype=dtype):  # extra keywords land in meta "user"
            with maxinstr.stage("step"):
                time.sleep(0.001)
    rc, out, _ = run_cli(capsys, "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--format", "json")
    settings = {s["key"]: s for s in json.loads(out)["comparisons"][0]["settings"]}
    assert rc == 0 and "command" not in settings  # same program, same command line
    assert settings["user.dtype"]["a"] == "bf16" and settings["user.dtype"]["b"] == "fp8"


def test_compare_needs_two(capsys):
    rc, _, err = run_cli(capsys, "compare", "x")
    assert rc == 2 and "at least two" in err


def test_report_finds_trace_and_warm_run_that_maxinstr_run_left(tmp_path, capsys):
    """`maxinstr run` records the profiler's trace in meta.json and may leave an unprofiled
    warm run in RUN/warm-run: `maxinstr report RUN` uses both."""
    import shutil

    from helpers.fixture_columns import run_from_nsys_fixture

    run = run_from_nsys_fixture(tmp_path / "run", "h200_small", warmup=1, mark_steps=None)
    trace = shutil.copy(DATA / "nsys/h200_small.sqlite", run / "profile.sqlite")
    meta = json.loads((run / "meta.json").read_text())
    meta["profiler"]["trace"] = str(trace)
    (run / "meta.json").write_text(json.dumps(meta))
    rc, out, _ = run_cli(capsys, "report", str(run), "--format", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["sources"]["trace"] == str(trace) and doc["gpu"]["ops"] == 242
    assert any("profiler.trace" in n for n in doc["sources"]["notes"])
    assert doc["headline_source"] == "run"
    _session_run(run / "warm-run", 0.001)
    rc, out, _ = run_cli(capsys, "report", str(run), "--format", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["headline_source"] == "unprofiled_run"
    assert doc["sources"]["unprofiled_run"] == str(run / "warm-run")


@pytest.mark.parametrize("args", [
    ["--trace", "nsys/h200_decode.sqlite"],
    ["nsys/h200_threads-run", "--trace", "nsys/h200_threads.sqlite"],
])  # fmt: skip
def test_perfetto_to_a_file_is_streamed_and_equal_to_stdout(args, tmp_path, capsys, monkeypatch):
    """`--format perfetto -o FILE` streams (render(), which builds the whole JSON string, is
    never called) and writes exactly what the string path prints; `.gz` holds the same text."""
    import gzip
    import re

    from maxinstr.render import perfetto

    def same(a: str, b: str) -> bool:  # the report's generation time may tick between runs
        stamp = re.compile(r'"utc": "[^"]*"')
        return stamp.sub('"utc": ""', a) == stamp.sub('"utc": ""', b)

    args = [str(DATA / a) if "/" in a else a for a in args]
    rc, printed, _ = run_cli(capsys, "report", *args, "--format", "perfetto", "--quiet")
    assert rc == 0 and printed.startswith("{")

    def no_render(*a, **k):
        raise AssertionError("the whole-string render() was used for -o")

    monkeypatch.setattr(perfetto, "render", no_render)
    out = tmp_path / "trace.json"
    rc, _, err = run_cli(capsys, "report", *args, "--format", "perfetto", "--quiet", "-o", str(out))
    assert rc == 0 and f"wrote {out}" in err
    assert same(out.read_text(), printed)
    assert len(json.loads(printed)["traceEvents"]) > 1000
    gz = tmp_path / "trace.json.gz"
    rc, _, _ = run_cli(capsys, "report", *args, "--format", "perfetto", "--quiet", "-o", str(gz))
    assert rc == 0
    with gzip.open(gz, "rt") as fh:
        assert same(fh.read(), printed)
    rc, _, err = run_cli(capsys, "report", *args, "--format", "perfetto", "--quiet", "-o", str(tmp_path / "no" / "t.json"))
    assert rc == 2 and err.count("\n") == 1 and "cannot write" in err


def test_report_takes_a_trace_in_run_dirs_place(tmp_path, capsys):
    """`maxinstr report TRACE` reads it as `--trace TRACE` (people type it that way, and the
    diagnosis' own commands did); what is neither a run nor a trace still gets one line."""
    trace = str(DATA / "nsys/h200_decode.sqlite")
    rc, out, err = run_cli(capsys, "report", trace, "--format", "json", "--quiet")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["sources"]["trace"] == trace and not doc["sources"].get("run")
    assert "decode" in {s["name"] for s in doc["stages"]}
    rc, _, err = run_cli(capsys, "report", str(DATA / "rocprof/rocprofv3_docs"), "--format", "json", "--quiet")
    assert rc == 0, err  # a rocprofv3 folder
    rc, _, err = run_cli(capsys, "report", str(DATA / "PROVENANCE.md"), "--quiet")
    assert rc == 2 and err.strip().count("\n") == 0 and "unrecognised trace format" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = run_cli(capsys, "report", str(empty), "--quiet")
    assert rc == 2 and err.strip().count("\n") == 0 and "meta.json" in err and "no trace in it" in err
    broken = tmp_path / "broken"  # a rocprofv3 folder cut short: the reader's error, not "no trace"
    broken.mkdir()
    (broken / "kernel_trace.csv").write_bytes((DATA / "rocprof/rocprofv3_docs/kernel_trace.csv").read_bytes()[:500])
    rc, _, err = run_cli(capsys, "report", str(broken), "--quiet")
    assert rc == 2 and err.strip().count("\n") == 0 and "broken/kernel_trace.csv" in err and "truncated" in err


@pytest.mark.parametrize("args", [
    ("--trace", str(DATA / "nsys/h200_decode.sqlite")),
    (str(DATA / "nsys/h200_threads-run"), "--trace", str(DATA / "nsys/h200_threads.sqlite")),
], ids=["trace", "run+trace"])
def test_diagnosis_commands_run_as_printed(args, capsys, tmp_path):
    """Every `maxinstr report` / `maxinstr deep-dive` command the diagnosis prints works as
    printed (deep-dive with --dry-run: no ncu here): the trace is not dropped, a trace alone is
    passed as a trace."""
    import shlex

    rc, out, err = run_cli(capsys, "report", *args, "--format", "json", "--quiet")
    assert rc == 0, err
    commands = [f["command"] for f in json.loads(out)["diagnosis"] if (f.get("command") or "").startswith("maxinstr ")]
    assert any(c.startswith("maxinstr report") for c in commands) and any("deep-dive" in c for c in commands)
    for c in commands:
        argv = shlex.split(c)[1:]
        if "RUN_WITHOUT_PROFILER" in argv:
            argv[argv.index("RUN_WITHOUT_PROFILER")] = str(DATA / "nsys/h200_threads-run")
        if argv[0] == "report":
            argv += ["--format", "json", "--quiet"]
        else:
            argv += ["--dry-run", "-o", str(tmp_path / "dd")]
        rc, out, err = run_cli(capsys, *argv)
        assert rc == 0, f"{c}: {err}"
        if argv[0] == "report" and "--trace" in c:
            assert json.loads(out)["gpu"]["ops"] > 0  # the trace came along


def test_compare_markdown_keeps_stages_and_kernels_only_on_one_side(capsys):
    """The Markdown comparison says which stages and kernels only one run has (it dropped them)."""
    rc, out, err = run_cli(capsys, "compare", str(DATA / "nsys/h200_decode.sqlite"), str(DATA / "nsys/h200_small.sqlite"),
                           "--format", "md", "--quiet")
    assert rc == 0, err
    assert "| request | - |" in out and "only in A" in out  # h200_small has no request/prefill ranges
    assert "## Kernels only in A" in out and "nvjet_sm90" in out
    assert "captured under a profiler" in out


NAN = re.compile(r"(?i)(?<![a-z_])[+-]?(nan|inf)(?![a-z_(<])")
"""A NaN or infinity as Python prints it ('nan', 'nanx', '-inf', 'nan%'), not a word in a name."""


@pytest.mark.parametrize("pair", [
    ("nsys/h200_decode.sqlite", "nsys/h200_decode.sqlite"),
    ("nsys/h200_decode.sqlite", "kineto/h200_decode.pt.trace.json.gz"),
    ("nsys/h200_reprefill.sqlite", "nsys/h200_kvcache.sqlite"),
    ("max/decoder_run", "max/decoder_run"),
], ids=lambda p: f"{p[0]}~{p[1]}")  # fmt: skip
def test_compare_prints_no_nan_in_any_view(pair, capsys):
    """issue 17 review, point 1: the A/A compare of h200_decode printed `nanx -> nanx` (a matmul
    growth the sample stage cannot have). A value that cannot be computed is '-' in text and
    Markdown and null in JSON, which must parse as strict JSON."""
    args = [str(DATA / p) for p in pair]
    for fmt in ("text", "md", "json"):
        rc, out, err = run_cli(capsys, "compare", *args, "--format", fmt, "--quiet", "--width", "120")
        assert rc == 0, err
        assert not NAN.search(out), (fmt, NAN.search(out))
        if fmt == "json":
            def no_constant(name):
                raise AssertionError(f"{name} in compare's JSON")

            doc = json.loads(out, parse_constant=no_constant)
    sample = next(c for c in doc["comparisons"][0]["checks"] if c["stage"] == "sample")
    assert sample["matmul_growth"] == {"a": None, "b": None}  # none computable: missing, not NaN


def _notes(out: str, title: str) -> str:
    """The note lines under a compare table (up to the next table's title)."""
    block = out.split(title, 1)[1].split("└", 1)[1]
    return block.split("\n", 1)[1].split("┏", 1)[0]


def test_compare_notes_say_what_the_table_shows(tmp_path, capsys):
    """issue 17 review, point 2: the note said 'p90s in --format json/md' beside a p90 delta
    column and explained runs where none were shown. The notes follow the rows."""
    trace = str(DATA / "nsys/h200_decode.sqlite")
    rc, out, _ = run_cli(capsys, "compare", trace, trace, "--quiet", "--width", "200")
    assert rc == 0 and re.search(r"┃\s+p90 ┃", out)  # the p90 delta column (its header over two lines)
    notes = _notes(out, "Host time per stage (steady state)")
    assert "p90s in" not in notes and "runs" not in notes.split("noise")[0]  # one run a side: no (runs)
    assert "cannot tell" not in notes and "too few" not in notes  # no such verdict in this table
    assert "95% bound from the spread of the run's own instances" in notes
    rc, out, _ = run_cli(capsys, "compare", trace, str(DATA / "kineto/h200_decode.pt.trace.json.gz"), "--quiet",
                         "--width", "200")
    notes = _notes(out, "Host time per stage (steady state)")
    assert "│ cannot tell" in out and "cannot tell: beyond the run's own spread" in notes
    assert "too few instances: under 2" in notes
    for side in ("a", "b"):  # two runs a side: (runs) and the run-to-run bound are explained
        for i in (1, 2):
            _session_run(tmp_path / side / f"r{i}", 0.001, n=6)
    rc, out, _ = run_cli(capsys, "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--width", "200")
    notes = _notes(out, "Host time per stage (steady state)")
    assert "(2/2 runs)" in out and "(runs) the fresh-process runs pooled" in notes
    assert "the larger of the spread of the sides' run medians" in notes


def test_compare_reads_the_trace_a_run_recorded(tmp_path, capsys):
    """issue 17 review, point 3: compare ignored the trace `maxinstr run` records in meta.json
    (`report` reads it): the decoder run showed `GPU busy -` and `no_kernels` where report gives
    launch_bound at 42% busy. compare finds it as report does; in a folder of repeats each run
    its own; one --trace for a folder of several runs is refused in one line."""
    import shutil

    run = str(DATA / "max/decoder_run")
    rc, out, err = run_cli(capsys, "compare", run, run, "--format", "json", "--quiet")
    assert rc == 0, err
    c = json.loads(out)["comparisons"][0]
    fwd = next(x for x in c["checks"] if x["stage"] == "forward")
    assert 0.35 < fwd["gpu_busy_frac"]["a"] < 0.5 and fwd["findings"]["a"] == ["launch_bound"]
    assert not any("no_kernels" in x["findings"]["a"] for x in c["checks"])
    assert any("profiler.trace" in n and n.startswith("A: ") for n in c["notes"])
    rc, rep, _ = run_cli(capsys, "report", run, "--format", "json", "--quiet")
    stage = next(s for s in json.loads(rep)["stages"] if s["name"] == "forward")
    assert fwd["gpu_busy_frac"]["a"] == stage["gpu_busy_frac"]["median"]  # the report's own number
    for i in (1, 2):
        shutil.copytree(run, tmp_path / "reps" / f"r{i}")
    reps = str(tmp_path / "reps")
    rc, out, err = run_cli(capsys, "compare", reps, run, "--format", "json", "--quiet")
    assert rc == 0, err
    c = json.loads(out)["comparisons"][0]
    assert c["runs"] == {"a": 2, "b": 1} and c["gpu_total"]["a_ops"] == c["gpu_total"]["b_ops"] > 0
    assert sum("profiler.trace" in n for n in c["notes"]) == 3  # r1, r2 and the run
    rc, _, err = run_cli(capsys, "compare", reps, run, "--trace", run + "/profile.sqlite", "--trace", "-", "--quiet")
    assert rc == 2 and err.count("\n") == 1 and "one --trace cannot belong to 2 runs" in err
    rc, out, err = run_cli(capsys, "compare", reps, run, "--trace", "-", "--trace", run + "/profile.sqlite",
                           "--format", "json", "--quiet")
    assert rc == 0, err
    c = json.loads(out)["comparisons"][0]
    assert not any(n.startswith("B: ") for n in c["notes"])  # B's trace was given, not looked for
    assert c["gpu_total"]["a_ops"] == c["gpu_total"]["b_ops"]


@pytest.mark.parametrize("args,words", [
    (("nsys/h200_reprefill-run", "--trace", "nsys/h200_reprefill.sqlite"), {"matmul"}),
    (("nsys/h200_moe-run", "--trace", "nsys/h200_moe.sqlite"), {"GPU busy", "routing share"}),
    (("--trace", "nsys/h200_decode.sqlite"), {"GPU busy"}),
    (("max/decoder_run",), {"GPU busy"}),
    (("max/block_run",), {"GPU busy", "naive kernel"}),
], ids=["reprefill", "moe", "decode-trace", "decoder_run", "block_run"])  # fmt: skip
def test_suggested_compare_shows_what_it_asks_to_check(args, words, capsys):
    """issue 17 review, point 4: the validation command of a report given a trace beside its run
    left the trace out, so the matmul growth it asked to check read '-'. Every suggested compare
    command, its placeholders filled with this same input, shows on both sides what its finding
    asks to check, for the finding's stage."""
    import shlex

    argv = [str(DATA / a) if "/" in a else a for a in args]
    rc, out, err = run_cli(capsys, "report", *argv, "--format", "json", "--quiet")
    assert rc == 0, err
    doc = json.loads(out)
    asked = {"matmul": ("matmul_growth",), "GPU busy": ("gpu_busy_frac",), "kernels per instance": ("kernels_per_instance",),
             "attention share": ("shares", "attention"), "routing share": ("shares", "routing"),
             "quantization share": ("shares", "quantization"), "naive kernel": ("shares", "naive matmul")}
    cases = [(f, f["validation"]) for f in doc["diagnosis"] if (f.get("validation") or "").startswith("maxinstr compare")]
    cases += [(f, f["command"]) for f in doc["diagnosis"] if (f.get("command") or "").startswith("maxinstr compare")]
    assert cases
    src = doc["sources"]
    fill = {"RUNS_AFTER": src["run"], "RUN_AFTER": src["run"], "TRACE_AFTER": src["trace"]}
    seen, checked = set(), set()
    for f, line in cases:
        command = line.split("  #")[0]
        if command in seen and not any(k in line for k in asked):
            continue
        seen.add(command)
        cargv = [fill.get(a, a) for a in shlex.split(command)[1:]]
        rc, out, err = run_cli(capsys, *cargv, "--format", "json", "--quiet")
        assert rc == 0, f"{command}: {err}"
        c = json.loads(out)["comparisons"][0]
        if src["trace"]:
            assert c["gpu_total"] and c["gpu_total"]["a_ops"] > 0 and c["gpu_total"]["b_ops"] > 0, command
        checks = {x["stage"]: x for x in c["checks"]}
        for word, path in asked.items():
            if word in line.split("#", 1)[-1] and f.get("stage"):
                got = checks[f["stage"]]
                for k in path:
                    got = got[k]
                assert got["a"] is not None and got["a"] == got["b"], (command, word, got)
                checked.add(word)
        if f.get("stage") and "findings" in line:
            assert f["id"] in checks[f["stage"]]["findings"]["a"]
    assert checked >= words


def test_every_validation_is_read_off_compare():
    """Each validation line's words map to a check compare prints (the test above reads them)."""
    from maxinstr.analyze import rules

    source = "".join(p.read_text() for p in Path(rules.__file__).parent.glob("*.py"))
    said = re.findall(r'cmd\.check\(\s*"([^"]*)"', source)
    assert len(said) >= 9
    readable = ("matmul", "GPU busy", "kernels per instance", "attention share", "routing share", "quantization share",
                "naive kernel", "median", "findings")
    for text in said:
        assert any(w in text for w in readable), text


def test_compare_splits_two_population_stages(capsys):
    """issue 17 review, point 6: h200_decode's decode (CUDA graph replay every other step) was
    compared on a pooled median in the gap between its populations. compare says so, and when
    both sides have the same two populations it compares each."""
    trace = str(DATA / "nsys/h200_decode.sqlite")
    rc, out, err = run_cli(capsys, "compare", trace, trace, "--format", "json", "--quiet")
    assert rc == 0, err
    c = json.loads(out)["comparisons"][0]
    for table in ("stages", "gpu_stages"):
        dec = next(r for r in c[table] if r["stage"] == "decode")
        pops = dec["populations"]
        assert pops["a"]["by"] == pops["b"]["by"] == "CUDA graph replay" and pops["a"]["median_in_gap"]
        assert {r["population"] for r in pops["rows"]} == {"CUDA graph replay", "no CUDA graph"}
        graph, eager = sorted(pops["rows"], key=lambda r: r["a"]["median"])
        # each population's own median, both far from the pooled one in the gap between them
        assert graph["a"]["median"] < dec["a"]["median"] < eager["a"]["median"]
        assert graph["a"]["n"] + eager["a"]["n"] == dec["a"]["n"]
        assert all(r["verdict"] == "within noise" and r["median_delta_ns"] == 0 for r in pops["rows"])
        assert graph["noise_bound_ns"] < dec["noise_bound_ns"] / 10  # one population's spread, not the gap
    rc, out, _ = run_cli(capsys, "compare", trace, trace, "--quiet", "--width", "120")
    assert "│   · CUDA graph replay" in out and "│   · no CUDA graph" in out
    assert "decode: two populations on both sides (told apart by CUDA graph replay); its median lies between them" in out
    # one side with two populations, the other with one: said, not split
    rc, out, _ = run_cli(capsys, "compare", trace, str(DATA / "kineto/h200_decode.pt.trace.json.gz"), "--format", "json",
                         "--quiet")
    dec = next(r for r in json.loads(out)["comparisons"][0]["stages"] if r["stage"] == "decode")
    assert dec["populations"]["b"] is None and dec["populations"]["rows"] == []
    assert dec["populations"]["not_split"] == "side B has one"


DEEP_DIVE_INPUTS = [
    ("max/block_run",),
    ("max/decoder_run",),
    ("nsys/h200_threads-run", "--trace", "nsys/h200_threads.sqlite"),
    ("nsys/h200_moe-run", "--trace", "nsys/h200_moe.sqlite"),
    ("--trace", "nsys/h200_decode.sqlite"),
]


def _report_doc(capsys, args) -> dict:
    argv = [str(DATA / a) if "/" in a else a for a in args]
    rc, out, err = run_cli(capsys, "report", *argv, "--format", "json", "--quiet")
    assert rc == 0, err
    return json.loads(out)


@pytest.mark.parametrize("args", DEEP_DIVE_INPUTS, ids=lambda a: a[-1].split("/")[-1])
def test_a_findings_deep_dive_takes_the_kernel_it_names_at_the_share_it_says(args, capsys, tmp_path):
    """issue 20 (CLI): block_run's naive_matmul finding said 25% (its two naive kernels together)
    while the deep dive it suggested printed 14% (the one it takes), and its --kernel regex was cut
    at 60 characters. Every finding that names its kernel (dominant_kernel, naive_matmul): the
    suggested deep dive, run as printed (--dry-run), takes that kernel, and the share it prints is
    in the finding's title; every suggested deep dive takes a kernel whose whole name its regex
    reaches (never a cut one)."""
    import shlex

    doc = _report_doc(capsys, args)
    dives = [f for f in doc["diagnosis"] if "deep-dive" in (f.get("command") or "")]
    if args == ("max/block_run",):
        assert {f["id"] for f in dives} >= {"naive_matmul", "dominant_kernel"}
    for f in dives:
        argv = shlex.split(f["command"])[1:]
        rc, _, err = run_cli(capsys, *argv, "--dry-run", "-o", str(tmp_path / "dd"))
        assert rc == 0, f"{f['command']}: {err}"
        taken = re.search(r"^maxinstr: kernel: (.*)$", err, re.MULTILINE).group(1)
        share = re.search(r", (\d+%) of (?:the stage's|all) GPU time", err).group(1)
        regex = argv[argv.index("--kernel") + 1]
        hit = re.search(regex, taken)
        # the regex reaches the end of the kernel's identifier (before its template/argument lists)
        assert hit and (hit.end() == len(taken) or taken[hit.end()] in "<("), (regex, taken)
        if f["id"] in ("dominant_kernel", "naive_matmul"):
            # the title names it by its label (maxinstr._text.kernel_label: what tells kernels apart)
            from maxinstr._text import kernel_label

            assert kernel_label(taken)[:60] in f["title"] and share in f["title"], (f["title"], taken, share)


@pytest.mark.parametrize("args", DEEP_DIVE_INPUTS, ids=lambda a: a[-1].split("/")[-1])
def test_the_kernel_regex_picks_each_top_kernel_of_its_stage(args, capsys):
    """The deep-dive --kernel regex a finding builds for a stage's kernel: the first of the stage's
    top kernels (deep-dive takes the top match) that it matches is that kernel, for every kernel
    of every stage, and for a copy of those lists where a rival with as much time extends the
    kernel's name (the case a cut or unanchored regex gets wrong)."""
    from maxinstr.analyze.rules.base import kernel_regex as _kernel_regex

    doc = _report_doc(capsys, args)
    checked = 0
    for st in doc["stages"]:
        top = (st.get("mix") or {}).get("top_kernels") or []
        for k in top:
            for kernels in (top, [{"name": k["name"] + "_v2", "share": k["share"]}] + top):  # a rival, listed first
                rivals = [o["name"] for o in kernels if o["share"] >= k["share"]]
                rx = _kernel_regex(k["name"], rivals)
                assert next(o["name"] for o in kernels if re.search(rx, o["name"])) == k["name"], (rx, k["name"])
                checked += 1
    assert checked


def test_compare_kernel_lists_do_not_follow_the_hash_seed():
    """Kernels only on one side with equal GPU time come by name, so the 50 listed and their order
    are the same in every process (they followed the set's order, which the hash seed picks)."""
    from maxinstr.analyze.compare import _kernels

    def report(names, family):
        return {"gpu": {"kernels": [{"name": n, "family": family, "gpu_ns": 1000, "share": 0.01} for n in names]}}

    only_b = [f"kernel_b_{i:02d}" for i in range(60)]
    both = [f"kernel_both_{i:02d}" for i in range(20)]
    appeared, disappeared, refamilied = _kernels(report(both, "gemm"), report(both + only_b, "gemv"))
    assert [k["name"] for k in appeared] == sorted(only_b)
    assert disappeared == []
    assert [r["name"] for r in refamilied] == sorted(both)


def test_o_never_overwrites_what_the_command_reads(tmp_path, capsys, monkeypatch):
    """-o naming an input (a run directory's own file, the trace or report read; through `..` or a
    link too) is one line, exit 2, nothing written; a new file in the run directory is still written,
    and written again."""
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copytree(DATA / "nsys" / "h200_kvcache-run", "o1")
    shutil.copy(DATA / "nsys" / "h200_small.sqlite", "t.sqlite")
    shutil.copy(DATA / "nsys" / "h200_small.nsys-rep", "t.nsys-rep")
    os.utime("t.sqlite", (Path("t.nsys-rep").stat().st_mtime + 1,) * 2)  # its export, read beside it
    stages = next(Path("o1/parts").glob("*/stages.bin"))
    Path("link.json").symlink_to("o1/meta.json")
    assert run_cli(capsys, "report", "o1", "--quiet", "--format", "json", "-o", "saved.json")[0] == 0
    before = {p: p.read_bytes() for p in [*Path("o1").rglob("*"), Path("t.sqlite"), Path("saved.json")] if p.is_file()}
    for args in (["report", "o1", "-o", "o1/meta.json"], ["report", "o1", "-o", "o1/../o1/./meta.json"],
                 ["report", "o1", "-o", str(stages)], ["report", "o1", "-o", "link.json"],
                 ["report", "t.sqlite", "-o", "./t.sqlite"], ["report", "o1", "--trace", "t.sqlite", "-o", "t.sqlite"],
                 ["report", "saved.json", "-o", "saved.json"], ["compare", "o1", "saved.json", "-o", "o1/meta.json"],
                 ["compare", "t.sqlite", "o1", "-o", "t.sqlite"], ["report", "t.nsys-rep", "-o", "t.sqlite"]):
        rc, out, err = run_cli(capsys, *args, "--quiet")
        assert rc == 2 and err.count("\n") == 1 and "nothing written" in err and not out, (args, err)
    assert before == {p: p.read_bytes() for p in before}
    for _ in range(2):  # a report of the user's own beside the run: written, and rewritten
        rc, _, err = run_cli(capsys, "report", "o1", "--quiet", "--format", "md", "-o", "o1/report.md")
        assert rc == 0 and err == "maxinstr: wrote o1/report.md\n"
    assert run_cli(capsys, "report", "o1", "--quiet")[0] == 0


@pytest.mark.parametrize("command", [["report", "nsys/h200_small.sqlite"],
                                     ["compare", "nsys/h200_small.sqlite", "nsys/h200_decode.sqlite"]])
def test_o_dash_is_stdout(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [str(DATA / a) if "/" in a else a for a in command]
    rc, out, err = run_cli(capsys, *args, "--quiet", "--format", "md", "-o", "-")
    assert rc == 0 and out.startswith("# ") and "wrote" not in err and not Path("-").exists()


def test_width_has_an_upper_bound(capsys):
    rc, out, err = run_cli(capsys, "report", str(DATA / "nsys" / "h200_small.sqlite"), "--quiet", "--width", "100000")
    assert rc == 2 and not out and "'--width': 100000 is not in the range 40<=x<=1000" in err
    assert run_cli(capsys, "report", str(DATA / "nsys" / "h200_small.sqlite"), "--quiet", "--width", "1000")[0] == 0


def test_a_number_too_long_says_where_not_how_to_raise_pythons_limit(tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(DATA / "nsys" / "h200_kvcache-run", run)
    meta = (run / "meta.json").read_text()
    (run / "meta.json").write_text(meta.replace("{", '{\n"huge": ' + "7" * 5000 + ",", 1))
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": [\n{"ph": "X", "ts": -' + "9" * 5000 + "}]}")
    for path, line in ((run / "meta.json", 2), (trace, 2)):
        rc, _, err = run_cli(capsys, "report", str(path.parent if path.name == "meta.json" else path), "--quiet")
        assert rc == 2 and err == f"maxinstr: {path}: not valid JSON (a number of more than 4300 digits at line {line})\n"
