"""The CUPTI collector end to end on a CPU machine: session(kernels=True) -> native push/pop ->
collector -> activity files -> reader -> attribution -> report, with a stand-in for
cupti-python (tests/kernels/fake_cupti/) over the real external-correlation stack the stage
core pushes to (tests/core/native/fake_cupti.c, compiled here). What CUPTI itself does on a GPU
is checked on the H200 (benchmarks/device/15-cupti.sh) and by the fixture test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("maxinstr._native", reason="maxinstr._native is not built")

HERE = Path(__file__).resolve().parent
NATIVE_SRC = HERE.parent / "core" / "native" / "fake_cupti.c"

SCRIPT = textwrap.dedent(
    """
    import json, sys, threading, time
    import maxinstr
    from maxinstr import _native
    from cupti import cupti as fake
    import maxinstr.kernels.convert as convert
    convert.FAST_CHECK_ROWS = 30        # trust the fast path after ~one step's records (FAST_CHECK_ROWS on a GPU)
    run = sys.argv[1]
    assert fake.launch("before_session") is None        # activity is off before the session
    with maxinstr.session(run, kernels=True, sample_hz=0, warmup=1):
        fake.launch("outside_any_stage")
        for i in range(4):
            with maxinstr.stage("step", step=i):
                with maxinstr.stage("a"):
                    fake.launch("gemm", dur_ns=2000)
                    fake.launch("relu", api="driver", dur_ns=500)
                fake.launch("between_children", dur_ns=300)
                with maxinstr.stage("b"):
                    fake.launch("", kind="memcpy", nbytes=4096, dur_ns=700)
                    fake.launch("", kind="memset", nbytes=64, dur_ns=100)
                with maxinstr.stage("g"):
                    fake.launch("graph_node", api="driver", graph_nodes=3, dur_ns=400)
                def worker():
                    with maxinstr.stage("w"):
                        fake.launch("worker_kernel", dur_ns=900)
                t = threading.Thread(target=worker)
                t.start()
                t.join()
            if i == 1:
                time.sleep(0.4)                          # the flusher delivers a buffer mid-run
        mid_buffers = fake.buffers()
    print("@@" + json.dumps(dict(mid_buffers=mid_buffers, buffers=fake.buffers(), enabled=sorted(fake.STATE["enabled"]),
                                 subscribed=fake.STATE["sub"] is not None, quiet=fake.STATE["quiet"],
                                 from_ptr=fake.STATE.get("from_ptr", 0),
                                 native=_native.cupti_stats())))
    """
)


def _compile(tmp_path_factory, *flags: str) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("fakecupti") / "libcupti.so.13-fake"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", *flags, "-o", str(out), str(NATIVE_SRC), "-lpthread"], check=True,
                   capture_output=True)  # fmt: skip
    return out


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory):
    """A stand-in libcupti with activity buffers (the stage core's native buffer path)."""
    return _compile(tmp_path_factory)


@pytest.fixture(scope="module")
def fake_lib_no_buffers(tmp_path_factory):
    """One without cuptiActivityRegisterCallbacks: the collector uses cupti-python's Python callbacks."""
    return _compile(tmp_path_factory, "-DFAKE_NO_BUFFERS")


def _dist_info(run_dir: Path, version: str) -> Path:
    """A folder holding cupti-python's installed metadata for the release the stand-in plays, as
    pip would leave it (importlib.metadata then names that release, not the one installed here)."""
    if version.endswith(".json"):
        version = json.loads(Path(version).read_text())["cupti_python"]
    where = run_dir.parent / f"dist-{version}"
    meta = where / f"cupti_python-{version}.dist-info" / "METADATA"
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(f"Metadata-Version: 2.1\nName: cupti-python\nVersion: {version}\n")
    return where


def _run(fake_lib: Path, run_dir: Path, script: str = SCRIPT, **env: str | None) -> tuple[dict | None, str]:
    """The collector with the stand-in libcupti; its activity-record path unless MAXINSTR_CUPTI_TAGS
    is given (None: unset, the default: launch tags). FAKE_CUPTI_VERSION picks the cupti-python
    release the stand-in plays (default 13.0.1), FAKE_CUPTI_WRITES the libcupti release under it."""
    import maxinstr

    src = str(Path(maxinstr.__file__).resolve().parent.parent)
    e = dict(os.environ)
    for k in ("CUDA_INJECTION64_PATH", "NSYS_PROFILING_SESSION_ID", "MAXINSTR_RUN_DIR", "MAXINSTR_SESSION_DIR"):
        e.pop(k, None)
    e["MAXINSTR_CUPTI_TAGS"] = "0"
    e.update(env)
    e = {k: v for k, v in e.items() if v is not None}
    e["FAKE_CUPTI_LIB"] = str(fake_lib)
    dist = _dist_info(run_dir, e.get("FAKE_CUPTI_VERSION") or "13.0.1")
    e["PYTHONPATH"] = os.pathsep.join([str(HERE / "fake_cupti"), str(dist), src, e.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-c", script, str(run_dir)], env=e, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("@@")]
    return (json.loads(line[-1][2:]) if line else None), p.stderr


@pytest.mark.parametrize("records", ["native", "native_bad_layout", "python_with_bytes", "python_attributes_only",
                                     "python_bad_layout"])  # fmt: skip
def test_collector_end_to_end_with_a_stand_in_cupti(fake_lib, fake_lib_no_buffers, tmp_path, records):
    """``native``: CUPTI's buffers are handled by the stage core's C callbacks (no Python on
    CUPTI's thread); the flusher takes them and converts with numpy, checked against
    cupti-python's record objects (from_ptr) on the first records, then trusted.
    ``python_*``: a libcupti without those symbols: cupti-python's Python callback copies the
    buffer's bytes (``with_bytes``), or, records without bytes, converts by attribute
    (``attributes_only``). ``*_bad_layout``: the struct dtype disagrees with the bytes; the check
    catches it and the record objects are used. The run's numbers are the same every way."""
    run_dir = tmp_path / "run"
    env = {"FAKE_CUPTI_NO_PTR": "1"} if records.endswith("attributes_only") else {}
    if records.endswith("bad_layout"):
        env["FAKE_CUPTI_BAD_LAYOUT"] = "1"
    out, err = _run(fake_lib if records.startswith("native") else fake_lib_no_buffers, run_dir, **env)
    assert err == "", err  # a profiler prints nothing into the program (cupti-python's record objects included)
    assert out["mid_buffers"] >= 1 and out["buffers"] > out["mid_buffers"]  # flushed while running, and at close
    assert out["enabled"] == [] and out["subscribed"] is False  # everything given back at close
    # the API functions that never launch work (and the stand-in knows) are switched off; launches are not
    assert sorted(map(tuple, out["quiet"])) == [("driver", 119, 0), ("runtime", 10, 0)]
    assert out["native"] == {"on": False, "pushes": 20, "errors": 0}  # 4 x (step, a, b, g, w)

    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["kernels"]["status"] == "closed" and meta["kernels"]["collector"] == "cupti"
    (act_path,) = run_dir.glob("parts/*/activity.json")
    act = json.loads(act_path.read_text())
    assert act["status"] == "closed" and act["stage_pushes"] == 20 and act["push_errors"] == 0
    assert act["dropped_cupti"] == 0 and act["dropped_queue"] == 0 and len(act["clock_pairs"]) >= 2
    assert act["buffers_by"] == ("native" if records.startswith("native") else "python")
    assert act["convert_errors"] == 0 and not act.get("errors"), act
    if records.startswith("native"):
        nb = act["native_buffers"]
        assert nb["registered"] and nb["completed"] >= out["buffers"] and nb["dropped_records"] == 0 and nb["walk_errors"] == 0
        assert act["buffers"] == out["buffers"] and act["callback_s"] == 0  # no Python ran on CUPTI's behalf
    if records in ("native", "python_with_bytes"):
        assert act["fast_path"] == "fast path on (checked against the attribute path on 30 records)", act["fast_path"]
        assert out["from_ptr"] == 30  # record objects only for the records checked, not the whole buffer
    elif records == "python_attributes_only":
        assert act["fast_path"].startswith("fast path off: AttributeError"), act["fast_path"]
    else:
        assert act["fast_path"] == "fast path off: differs from the attribute path in ['start_ns', 'end_ns']", act["fast_path"]

    _check_attribution(run_dir)


def _check_attribution(run_dir: Path) -> Any:
    """What SCRIPT's run must read as, however the ops were tied to their stages."""
    from maxinstr.analyze.report import analyze
    from maxinstr.attribute.model import Rule
    from maxinstr.traces.model import OpKind

    an = analyze(run=run_dir)
    trace, att, run = an.trace, an.attribution, an.run
    assert trace.format == "maxinstr-inprocess" and an.report["sources"]["join"] == "payload"
    names = np.array([trace.name(int(i)) for i in trace.ops.name_id], dtype=object)
    assert "before_session" not in set(names)
    assert int((att.op_range < 0).sum()) == 1 and names[att.op_range < 0][0] == "outside_any_stage"

    st, snames = run.stages, run.stage_names()
    by_id = {int(i): k for k, i in enumerate(st["id"])}
    per: dict[str, list[tuple[int, int, int, int]]] = {}
    for r in np.flatnonzero(att.range_record_id >= 0):
        k = by_id[int(att.range_record_id[r])]
        per.setdefault(str(snames[k]), []).append(
            (int(att.kernel_count[r]), int(att.kernel_ns[r]), int(att.op_count[r]), int(att.launch_count[r])))
    assert per["a"] == [(2, 2500, 2, 2)] * 4
    assert per["b"] == [(0, 0, 2, 2)] * 4
    assert per["g"] == [(3, 1200, 3, 1)] * 4  # one graph launch, three node kernels
    assert per["w"] == [(1, 900, 1, 1)] * 4  # launched on the worker thread, inside its own stage
    # step: its own launch between children + a + b + g (w is on another thread: not a child)
    assert per["step"] == [(6, 2500 + 300 + 1200, 8, 6)] * 4
    graph = trace.ops.graph_node_id >= 0
    assert graph.sum() == 12 and (att.op_rule[graph] == Rule.GRAPH).all()
    assert int((trace.ops.kind == OpKind.MEMCPY).sum()) == 4 and int(trace.ops.bytes[trace.ops.kind == OpKind.MEMCPY].sum()) == 4 * 4096

    # CUPTI's clock mapped onto the stage records' clock: each op starts 5 us after its launch
    # call, which was made inside its stage.
    own = np.flatnonzero(att.op_range >= 0)
    rs = trace.ranges.start_ns[att.op_range[own]]
    re_ = trace.ranges.end_ns[att.op_range[own]]
    lag = trace.ops.start_ns[own] - rs
    assert (lag >= 4_000).all() and (trace.ops.start_ns[own] <= re_ + 6_000_000).all()
    calls = trace.calls
    assert len(calls) == len(np.unique(trace.ops.correlation_id))
    assert set(trace.strings[calls.name_id]) >= {"cudaLaunchKernel", "cuLaunchKernel", "cuGraphLaunch", "cudaMemcpyAsync"}
    return an


def test_launch_tags_mode_reads_the_same(fake_lib, tmp_path):
    """The default (MAXINSTR_CUPTI_TAGS unset): no API or external-correlation activity records;
    the core's callback on the launch functions (CUPTI's callback API) tags each call with the
    calling thread's innermost stage, and the run reads exactly as with CUPTI's records."""
    run_dir = tmp_path / "run"
    out, err = _run(fake_lib, run_dir, MAXINSTR_CUPTI_TAGS=None)
    assert err == "", err  # a profiler prints nothing into the program
    assert out["enabled"] == [] and out["subscribed"] is False and out["native"]["pushes"] == 0
    act = json.loads(next(run_dir.glob("parts/*/activity.json")).read_text())
    assert act["status"] == "closed" and act["stage_correlation"].startswith("launch tags")
    # the stand-in program launches through the driver API too: the driver callbacks stay on
    assert act["driver_api_records"] == "needed" and not act.get("errors"), act
    assert act["driver_api_note"].startswith("driver API launch callbacks kept"), act["driver_api_note"]
    # each of the session's 29 launch calls tagged once, none dropped
    assert act["launch_tags"] == {"calls": 29, "dropped": 0}, act["launch_tags"]
    an = _check_attribution(run_dir)
    assert any("tied to their stage by the stage id" in n and "launch tags" in n for n in an.attribution.notes), an.attribution.notes
    # each op's launch call, timed on the core's clock, mapped onto CUPTI's through the clock
    # pairs and back by the reader, lies inside the op's stage (1 us for the mapping's rounding)
    trace, att = an.trace, an.attribution
    own = np.flatnonzero(att.op_range >= 0)
    rs, re_ = trace.ranges.start_ns[att.op_range[own]], trace.ranges.end_ns[att.op_range[own]]
    calls = trace.calls
    by_corr = dict(zip(calls.correlation_id.tolist(), range(len(calls))))
    ci = np.array([by_corr[int(c)] for c in trace.ops.correlation_id[own]])
    assert (calls.start_ns[ci] >= rs - 1_000).all() and (calls.end_ns[ci] <= re_ + 1_000).all()
    assert (calls.start_ns[ci] <= calls.end_ns[ci]).all()


@pytest.mark.parametrize("tags", ["0", "1"])
def test_collects_where_nothing_loaded_libcupti_before_the_session(fake_lib, tmp_path, tags):
    """A MAX (or CuPy) process: no torch, so no libcupti is mapped when the session starts, and
    cupti-python loads its library only at its first call. Seen on the H200 with MAX 26.7:
    "could not tell which loaded libcupti cupti-python uses (none mapped)" and no kernels."""
    run_dir = tmp_path / "run"
    script = SCRIPT.replace('assert fake.launch("before_session") is None', "pass")
    assert script != SCRIPT
    out, err = _run(fake_lib, run_dir, script=script, MAXINSTR_CUPTI_TAGS=tags)
    assert err == "", err
    act = json.loads(next(run_dir.glob("parts/*/activity.json")).read_text())
    assert act["status"] == "closed" and not act.get("errors"), act
    _check_attribution(run_dir)


@pytest.mark.parametrize("tags", ["0", "1"])
def test_another_subscriber_means_one_warning_and_events_only_stages(fake_lib, tmp_path, tags):
    from maxinstr.rundir import load

    run_dir = tmp_path / "run"
    out, err = _run(fake_lib, run_dir, FAKE_CUPTI_HELD="1", MAXINSTR_CUPTI_TAGS=tags)
    warn = err.splitlines()  # the one warning, nothing else
    assert len(warn) == 1 and "maxinstr: kernels=True:" in warn[0], err
    assert "already holds CUPTI" in warn[0] and "MULTIPLE_SUBSCRIBERS" in warn[0]
    assert out["native"]["pushes"] == 0 and out["enabled"] == []
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["kernels"]["status"] == "unavailable"
    assert len(load(run_dir).stages) == 20


def test_an_injected_profiler_is_left_alone(fake_lib, tmp_path):
    run_dir = tmp_path / "run"
    out, err = _run(fake_lib, run_dir, CUDA_INJECTION64_PATH="/opt/nvidia/nsight-systems/target-linux-x64/libToolsInjection64.so")
    warn = err.splitlines()  # the one warning, nothing else
    assert len(warn) == 1 and "maxinstr: kernels=True:" in warn[0], err
    assert "nsys/Nsight (CUDA_INJECTION64_PATH is set) already holds CUPTI" in warn[0]
    assert out["subscribed"] is False and out["native"]["pushes"] == 0  # CUPTI never touched


RELEASES_DIR = HERE.parent / "data" / "cupti" / "cupti_python"
# every cupti-python release maxinstr[cupti] allows, each described from its real wheel
RELEASES = sorted((p.stem for p in RELEASES_DIR.glob("[0-9]*.json")), key=lambda v: tuple(map(int, v.split("."))))


def _release(version: str) -> dict:
    return json.loads((RELEASES_DIR / f"{version}.json").read_text())


def _newest_class(desc: dict, stem: str) -> str:
    return max((c for c in desc["classes"] if c.startswith(f"Activity{stem}") and c[len(f"Activity{stem}"):].isdigit()),
               key=lambda c: int(c[len(f"Activity{stem}"):]))  # fmt: skip


@pytest.mark.parametrize("tags", ["1", "0"], ids=["tags", "records"])
@pytest.mark.parametrize("release", RELEASES)
def test_every_allowed_cupti_python_release_collects_the_same(fake_lib, tmp_path, release, tags):
    """The stand-in plays each cupti-python release the extra allows, as its description recorded
    from the real wheel has it (record layouts and classes, functions; 13.0.x's tracebacks on
    freeing a record object), over a libcupti writing that release's newest structs. Each reads
    the run exactly, prints nothing, and says which structs it read. (13.2.0 and 13.3.0 have no
    ActivityKernel10, which the collector used to ask for by name: it started, then dropped
    every buffer.)"""
    run_dir = tmp_path / "run"
    out, err = _run(fake_lib, run_dir, FAKE_CUPTI_VERSION=release, MAXINSTR_CUPTI_TAGS=tags)
    assert err == "", err
    desc = _release(release)
    act = json.loads(next(run_dir.glob("parts/*/activity.json")).read_text())
    assert act["status"] == "closed" and act["cupti_python"] == release
    assert act["convert_errors"] == 0 and act["dropped_queue"] == 0 and not act.get("errors"), act
    assert act["record_layouts"]["kernel"] == _newest_class(desc, "Kernel")
    assert act["record_layouts"]["memcpy"] == _newest_class(desc, "Memcpy")
    assert act["fast_path"] == "fast path on (checked against the attribute path on 30 records)", act["fast_path"]
    assert act["record_free_errors"] == (30 if desc["record_free_prints"] else 0)  # 13.0.x: counted, not printed
    _check_attribution(run_dir)


@pytest.mark.parametrize("buffers", ["native", "python"])
@pytest.mark.parametrize(("reads", "writes"), [("13.0.1", "13.4.0"), ("13.4.0", "13.0.1")], ids=["newer_libcupti", "older_libcupti"])
def test_libcupti_of_another_release_than_cupti_python(fake_lib, fake_lib_no_buffers, tmp_path, reads, writes, buffers):
    """cupti-python 13.0.1 requires nvidia-cuda-cupti~=13.0, which pip meets with 13.5: its
    records are newer structs (ActivityKernel13 and up) than the one that release describes
    (ActivityKernel10), read by the leading fields they share. The other way, a libcupti older
    than cupti-python (a framework's own, loaded first): each record is shorter than the struct
    described (ActivityKernel13: 248 bytes, written 216), read only up to its last field read,
    never past the buffer."""
    run_dir = tmp_path / "run"
    out, err = _run(fake_lib if buffers == "native" else fake_lib_no_buffers, run_dir, FAKE_CUPTI_VERSION=reads,
                    FAKE_CUPTI_WRITES=writes)  # fmt: skip
    assert err == "", err
    act = json.loads(next(run_dir.glob("parts/*/activity.json")).read_text())
    assert act["record_layouts"]["kernel"] == _newest_class(_release(reads), "Kernel")
    assert act["convert_errors"] == 0 and act["dropped_queue"] == 0 and not act.get("errors"), act
    assert act["fast_path"] == "fast path on (checked against the attribute path on 30 records)", act["fast_path"]
    _check_attribution(run_dir)


@pytest.mark.parametrize("tags", ["1", "0"], ids=["tags", "records"])
def test_an_unsupported_cupti_python_means_one_warning_and_events_only_stages(fake_lib, tmp_path, tags):
    """A cupti-python the collector cannot read records from: here 13.4.0's recorded description
    with its kernel records (layouts and classes) taken out (what 13.2.0 and 13.3.0 were to the collector that asked
    for ActivityKernel10 by name). One warning saying what it lacks and which releases to
    install, CUPTI left untouched, the stages recorded with events; nothing else on stderr."""
    from maxinstr.rundir import load

    desc = _release("13.4.0")
    desc["layouts"] = {k: v for k, v in desc["layouts"].items() if not k.startswith("activity_kernel")}
    desc["classes"] = [c for c in desc["classes"] if not c.startswith("ActivityKernel")]
    hostile = tmp_path / "13.4.0-no-kernel-records.json"
    hostile.write_text(json.dumps(desc))
    run_dir = tmp_path / "run"
    # a machine with an NVIDIA driver (without one, the warning names that first: test_without_an_nvidia_driver...)
    script = "import maxinstr.integrations.driver as cuda\ncuda.nvidia_driver_present = lambda: True\n" + SCRIPT
    out, err = _run(fake_lib, run_dir, script=script, FAKE_CUPTI_VERSION=str(hostile), FAKE_CUPTI_WRITES="13.4.0",
                    MAXINSTR_CUPTI_TAGS=tags)  # fmt: skip
    (line,) = err.splitlines()
    assert "RuntimeWarning: maxinstr: kernels=True: cupti-python 13.4.0 is not supported: no kernel record layout" in line, line
    assert "pip install 'maxinstr[cupti]' (cupti-python" in line, line
    assert out["enabled"] == [] and out["subscribed"] is False and out["native"]["pushes"] == 0 and out["from_ptr"] == 0
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["kernels"]["status"] == "unavailable" and meta["kernels"]["reason"] in line
    act = json.loads(next(run_dir.glob("parts/*/activity.json")).read_text())
    assert act["status"] == "unavailable"
    assert len(load(run_dir).stages) == 20


ADAPT_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    import maxinstr
    from cupti import cupti as fake
    import maxinstr.kernels.cupti as collector
    collector.DRIVER_PROBE_OPS = 50
    collector.FLUSH_EVERY_S = 0.01
    run, mode = sys.argv[1], sys.argv[2]
    DRIVER = int(fake.ActivityKind.DRIVER)
    seen = {}
    with maxinstr.session(run, kernels=True, sample_hz=0):
        seen["at_start"] = DRIVER in fake.STATE["enabled"]
        for i in range(80):
            with maxinstr.stage("rt", step=i):
                fake.launch("rt_kernel")
        time.sleep(0.3)                                   # the flusher takes the buffers: the probe decides
        seen["after_probe"] = DRIVER in fake.STATE["enabled"]
        if mode == "driver":
            with maxinstr.stage("drv"):
                fake.launch("drv_kernel_lost", api="driver")
            with maxinstr.stage("rt2"):
                fake.launch("rt_kernel2")
            time.sleep(0.3)
            seen["after_driver_launch"] = DRIVER in fake.STATE["enabled"]
            with maxinstr.stage("drv2"):
                fake.launch("drv_kernel_kept", api="driver")
    print("@@" + json.dumps(seen))
    """
)


@pytest.mark.parametrize("tags", ["0", "1"], ids=["records", "tags"])
@pytest.mark.parametrize("mode", ["runtime", "driver"])
def test_driver_api_records_go_off_when_nothing_needs_them(fake_lib, tmp_path, mode, tags):
    """A program launching through the runtime only: after DRIVER_PROBE_OPS GPU ops without a
    driver API record, driver records go off (they cost every API call). A driver-API launch
    afterwards leaves an op with no API record: driver records come back on, the lost op is
    counted and said, and later driver launches are attributed to their stage again. The launch
    tags (the default) do the same with the callback on the driver's launch functions."""
    import maxinstr

    src = str(Path(maxinstr.__file__).resolve().parent.parent)
    e = dict(os.environ)
    for k in ("CUDA_INJECTION64_PATH", "NSYS_PROFILING_SESSION_ID", "MAXINSTR_RUN_DIR", "MAXINSTR_SESSION_DIR"):
        e.pop(k, None)
    e["FAKE_CUPTI_LIB"] = str(fake_lib)
    e["MAXINSTR_CUPTI_TAGS"] = tags
    e["PYTHONPATH"] = os.pathsep.join([str(HERE / "fake_cupti"), src, e.get("PYTHONPATH", "")])
    run_dir = tmp_path / "run"
    p = subprocess.run([sys.executable, "-c", ADAPT_SCRIPT, str(run_dir), mode], env=e, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    seen = json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("@@")][-1][2:])
    act = json.loads(next(run_dir.glob("parts/*/activity.json")).read_text())
    if tags == "0":  # DRIVER activity records themselves (the tags keep them off throughout)
        assert seen["at_start"] is True and seen["after_probe"] is False
    what = "driver API launch callbacks" if tags == "1" else "driver API records"
    if mode == "runtime":
        assert act["driver_api_records"] == "off" and act["ops_without_api"] == 0
        assert act["driver_api_note"].startswith(f"{what} off after"), act["driver_api_note"]
        return
    assert tags == "1" or seen["after_driver_launch"] is True
    assert act["driver_api_records"] == "needed" and act["ops_without_api"] == 1
    assert "back on" in act["driver_api_note"]
    from maxinstr.rundir.activity import ACTIVITY_DTYPE

    rows = np.fromfile(next(run_dir.glob("parts/*/activity.bin")), dtype=ACTIVITY_DTYPE)
    run = maxinstr.load(run_dir)
    ids = dict(zip(run.stage_names().tolist(), run["id"].tolist()))
    ext = set(rows["external_id"][rows["kind"] == 5].tolist())
    assert ids["drv2"] in ext and ids["drv"] not in ext and ids["rt2"] in ext


def test_real_cupti_python_record_objects_leave_stderr_alone(tmp_path):
    """cupti-python <= 13.0.1 prints two KeyError tracebacks for every record object made with
    ``from_ptr`` over a buffer it did not allocate, when the object is freed (7,000 stderr lines
    in a PyTorch decoder on the H200). The collector makes such objects to check its fast path:
    with the real cupti-python (no GPU needed to make and free one), nothing reaches stderr and
    the reports are counted."""
    pytest.importorskip("cupti.cupti")
    code = textwrap.dedent(
        """
        import numpy as np
        from cupti import cupti
        from maxinstr.kernels.convert import _quiet_record_objects, record_layouts
        kernel = record_layouts(cupti)["kernel"].record_class  # the struct the collector reads with
        buf = np.zeros(4096, np.uint8)
        counter = [0]
        with _quiet_record_objects(counter):
            objs = [kernel.from_ptr(buf.ctypes.data + 256 * i, True) for i in range(5)]
            del objs
        print(counter[0])
        """
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stderr == "", p.stderr
    import importlib.metadata as md

    buggy = tuple(int(x) for x in md.version("cupti-python").split(".")[:3]) <= (13, 0, 1)
    assert int(p.stdout) == (5 if buggy else 0)


REAL_RECORDS_SCRIPT = textwrap.dedent(
    """
    import ctypes, json, sys
    from pathlib import Path
    import numpy as np
    from cupti import cupti
    from maxinstr.kernels.convert import Converter, rows_from_bytes
    from maxinstr.rundir.activity import ACTIVITY_DTYPE
    conv = Converter(cupti)
    K = cupti.ActivityKind
    kinds = [K.CONCURRENT_KERNEL, K.MEMCPY, K.MEMSET, K.RUNTIME, K.DRIVER, K.EXTERNAL_CORRELATION]
    names = [ctypes.create_string_buffer(b"gemm_kernel"), ctypes.create_string_buffer(b"relu_kernel")]
    values = dict(start=10**15, end=10**15 + 999, correlation_id=7, stream_id=3, device_id=1, graph_node_id=2**40 + 5,
                  bytes=4096, copy_kind=1, cbid=211, thread_id=4242, external_kind=5, external_id=2**33 + 9)
    chunks = []
    for i in range(61):  # the last one a kernel record
        kind = int(kinds[i % 6])
        layout = conv.kinds.records[kind]
        rec = np.zeros(1, layout.dtype)
        rec["kind"] = kind
        for f, v in values.items():
            if f in layout.dtype.names:
                rec[f] = v + (i if f in ("start", "end", "correlation_id", "external_id") else 0)
        if "name" in layout.dtype.names:
            rec["name"] = ctypes.addressof(names[(i // 6) % 2])
        raw = rec.tobytes()
        # the last record as short as a libcupti older than this cupti-python writes it: its
        # struct cut after the last field read
        chunks.append(raw[: -(-layout.read_bytes // 8) * 8] if i == 60 else raw)
    data = b"".join(chunks)
    offs = np.cumsum([0] + [len(c) for c in chunks[:-1]]).astype(np.int64)
    fast = rows_from_bytes(data, offs, conv.kinds, conv.names)
    slow = conv.from_objects(data, offs)
    assert len(fast) == len(slow) == 61, (len(fast), len(slow))
    differ = [f for f in ACTIVITY_DTYPE.names if not np.array_equal(fast[f], slow[f])]
    kernel_names = sorted({conv.names.names[i] for i in fast["name_id"][fast["kind"] == 0]})
    print(json.dumps(dict(differ=differ, kernel_names=kernel_names, record_free_errors=conv.record_free_errors[0],
                          kernel=conv.kinds.records[int(K.CONCURRENT_KERNEL)].name)))
    """
)


def test_real_cupti_python_record_objects_read_what_the_fast_path_reads(tmp_path):
    """With the installed cupti-python (its compiled record classes; no GPU needed): records of
    every kind written in the structs the collector picked, and the last one cut short after its
    last field read (a libcupti older than cupti-python), read the same through numpy and through
    the record objects, and nothing reaches stderr."""
    pytest.importorskip("cupti.cupti")
    import importlib.metadata as md

    p = subprocess.run([sys.executable, "-c", REAL_RECORDS_SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stderr == "", p.stderr
    got = json.loads(p.stdout)
    assert got["differ"] == [] and got["kernel_names"] == ["gemm_kernel", "relu_kernel"]
    buggy = tuple(int(x) for x in md.version("cupti-python").split(".")[:3]) <= (13, 0, 1)
    assert got["record_free_errors"] == (61 if buggy else 0)


def test_without_an_nvidia_driver_the_reason_says_so(tmp_path):
    """kernels=True on a machine with no NVIDIA driver: the reason names that, not whatever the
    CUPTI path lacked on the way (it said to install cupti-python, which would not help)."""
    from maxinstr.integrations.driver import nvidia_driver_present
    from maxinstr.kernels import start

    if nvidia_driver_present():
        pytest.skip("an NVIDIA driver is present here")
    collector, _ = start(tmp_path, {"part": "p1", "pid": 1})
    act = json.loads((tmp_path / "activity.json").read_text())
    assert act["status"] == "unavailable" and act["reason"].startswith("no NVIDIA driver in this process"), act
    assert collector.name != "cupti"
