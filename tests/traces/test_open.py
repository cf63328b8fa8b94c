"""open_trace: format sniffing and dispatch on every real fixture, and one-line errors."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from pathlib import Path

import pytest
import rocprof_samples as rs

import maxinstr.traces
from maxinstr.errors import TraceError
from maxinstr.traces import open_trace

DATA = Path(__file__).resolve().parents[1] / "data"

try:
    from maxinstr.traces.nsys import read_nsys  # noqa: F401  (H3's reader; may not exist yet)

    HAS_NSYS = True
except ImportError:
    HAS_NSYS = False

CASES = [
    ("kineto/h200_decode.pt.trace.json.gz", "kineto"),
    ("kineto/hta_benchmark_result_493459_1694039959_trace.json.gz", "kineto"),
    ("kineto/hta_mi250_minitoy_train_ROCm6_2_kineto.json.gz", "kineto"),
    ("kineto/hta_triton_example.json.gz", "kineto"),
    ("rocprof/rpd/mytrace.rpd.gz", "rpd"),
    ("rocprof/rpd/matmul_result.rpd", "rpd"),
    ("rocprof/rocprofv3_docs", "rocprofv3-csv"),
    ("rocprof/rocprofv3_docs/marker_api_trace.csv", "rocprofv3-csv"),
    ("rocprof/rocprofv3_llamacpp_decode", "rocprofv3-csv"),
    ("rocprof/rocprofv3_llamacpp_decode/decode_hip_api_trace.csv", "rocprofv3-csv"),
    ("rocprof/rocprof_v1_kokkos/results.db", "rocprof-v1-db"),
    ("rocprof/rocprof_v1_kokkos/results.json", "rocprof-v1-json"),  # was taken for Kineto: 0 ops
    ("rocprof/rocprof_v1_kokkos", "rocprof-v1-db"),  # both files: the database stands for the pair
    ("rocprof/rocprof_v1_mi250x_stats", "rocprof-v1-db"),
    ("rocprof/rpd/matmul_result.json", "rpd-json"),  # was taken for Kineto: 0 ops
    ("rocprof/rpd/mytrace_rpd2tracing.json.gz", "rpd-json"),
]
NSYS = sorted(str(p.relative_to(DATA)) for p in (DATA / "nsys").glob("*.sqlite"))


def test_exported_from_package():
    assert maxinstr.traces.open_trace is open_trace


@pytest.mark.parametrize(("rel", "fmt"), CASES, ids=[c[0] for c in CASES])
def test_every_non_nsys_fixture_dispatches(rel, fmt):
    calls = []
    t = open_trace(DATA / rel, progress=calls.append)
    assert t.format == fmt
    assert len(t.ops) > 0 and calls  # progress was reported
    t.validate()


@pytest.mark.skipif(not HAS_NSYS, reason="maxinstr.traces.nsys not written yet")
@pytest.mark.parametrize("rel", NSYS)
def test_nsys_sqlite_dispatches_to_read_nsys(rel):
    t = open_trace(DATA / rel)
    assert t.format.startswith("nsys")


def test_renamed_files_are_sniffed_by_content(tmp_path):
    # the extension does not decide: magic bytes and keys do
    a = tmp_path / "trace.bin"
    shutil.copy(DATA / "rocprof/rpd/matmul_result.rpd", a)
    assert open_trace(a).format == "rpd"
    b = tmp_path / "trace.data"
    shutil.copy(DATA / "kineto/hta_triton_example.json.gz", b)
    assert open_trace(b).format == "kineto"
    c = tmp_path / "plain.txt"
    c.write_bytes(gzip.decompress((DATA / "kineto/hta_triton_example.json.gz").read_bytes()))
    assert open_trace(c).format == "kineto"


def test_rocprof_json_and_rocpd_dispatch(tmp_path):
    assert open_trace(rs.write_json(tmp_path / "run_results.json")).format == "rocprofv3-json"
    assert open_trace(rs.write_rocpd(tmp_path / "run_results.db")).format == "rocpd"
    only = tmp_path / "only"
    only.mkdir()
    rs.write_rocpd(only / "x_results.db")
    assert open_trace(only).format == "rocpd"  # a folder with one trace in it


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: d / "missing.json", "no such file or folder"),
        (lambda d: _write(d / "empty.json", b""), "empty file"),
        (lambda d: _write(d / "noise.bin", bytes(range(256)) * 4), "unrecognised trace format"),
        (lambda d: _write(d / "t.sqlite", b"SQLite format 2\x00" + bytes(100)), "not a SQLite database"),
        (lambda d: _write(d / "t.json", b'{"traceEvents": [1, 2'), "not valid JSON"),
        (lambda d: _write(d / "t.json", b'{"hello": 1}'), "JSON of an unknown kind"),
        (lambda d: _write(d / "t.json.gz", b"\x1f\x8b\x08\x00garbage"), "gzip"),
        (lambda d: _write(d / "t.json", "\u00e9".encode("latin-1")), "not valid JSON"),
        (lambda d: _sqlite(d / "other.db"), "SQLite database of an unknown kind"),
        (lambda d: _truncated_sqlite(d / "cut.rpd"), "cut.rpd: "),
        (lambda d: _mkdir(d / "nothing"), "no trace found in folder"),
        # rocprofv2's file plugin (rocprofiler plugin/file/file.cpp: "<name>_<pid>.csv", this header)
        (lambda d: _write(d / "hip_api_trace_4242.csv", b"Domain,Function,Start_Timestamp,End_Timestamp,"
                                                        b"Correlation_ID\n\n"), "rocprofv2 file-plugin CSV: not read"),
    ],
)
def test_bad_input_is_one_line_trace_error(tmp_path, setup, message):
    path = setup(tmp_path)
    with pytest.raises(TraceError) as info:
        open_trace(path)
    text = str(info.value)
    assert message in text
    assert str(path) in text and "\n" not in text


def test_chrome_trace_nobody_reads_is_not_zero_ops(tmp_path):
    """A Chrome trace full of events that no reader knows (here: the real RPD export with what
    marks it as rpd2tracing's removed) must not become an empty report: one line says what it holds."""
    import json

    events = json.loads((DATA / "rocprof/rpd/matmul_result.json").read_text())
    plain = [e for e in events if e.get("ph") not in ("M", "s", "f")]
    spans = sum(e.get("ph") == "X" for e in plain)
    path = _write(tmp_path / "unknown.json", json.dumps(plain).encode())
    with pytest.raises(TraceError) as info:
        open_trace(path)
    text = str(info.value)
    assert f"{spans} duration events, none a Kineto GPU op" in text and "\n" not in text
    assert spans == 210


def test_several_traces_in_a_folder_must_be_named():
    with pytest.raises(TraceError, match="several traces"):
        open_trace(DATA / "rocprof/rpd")


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir()
    (path / "readme.txt").write_text("hello")
    return path


def _sqlite(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE people (name TEXT)")
    con.commit()
    con.close()
    return path


def _truncated_sqlite(path: Path) -> Path:
    path.write_bytes((DATA / "rocprof/rpd/matmul_result.rpd").read_bytes()[:12_288])
    return path


def test_errors_stay_on_one_line():
    """A problem quoted from a library can hold newlines (SQLite quotes a corrupt schema's SQL,
    found by the 10k fuzz run on a mutated rocpd file): the message stays one line."""
    from maxinstr.errors import RunDirError, TraceError

    sqlite_text = 'malformed database schema (t) - unrecognized token: ""TABLE t (id INTEGER,\n    name TEXT)"'
    for err in (TraceError("/x/run_results.db", f"SQLite error: {sqlite_text}"), RunDirError("/x/run", "a\n\tb")):
        assert "\n" not in str(err) and "\t" not in str(err)
        assert str(err).startswith("/x/run")
    assert str(TraceError("/x/t.db", "a\n  b")) == "/x/t.db: a b"
