"""Every line of the report true and consistent with the others, on the real H200 captures in
tests/data (issue 28 points 2-6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from maxinstr.analyze.report import build_report

DATA = Path(__file__).parents[1] / "data"


@pytest.fixture(scope="module")
def torch_decode():
    return build_report(DATA / "kineto/h200_torch_decode-run", DATA / "kineto/h200_torch_decode.pt.trace.json.gz")


@pytest.fixture(scope="module")
def kvcache():
    return build_report(DATA / "nsys/h200_kvcache-run", DATA / "nsys/h200_kvcache.sqlite")


def _joins_said(report) -> list[str]:
    return [n for n in report["sources"]["notes"] if "joined" in n]


def test_the_notes_name_the_join_the_header_names(torch_decode, kvcache):
    """Kineto: the records were placed by clock; no note may then say they joined by NVTX payload
    (the placed ranges carry their ids), nor that the trace has none of them."""
    assert torch_decode["sources"]["join"] == "clock"
    said = _joins_said(torch_decode)
    assert len(said) == 1 and said[0].startswith("joined by clock") and "payload" not in said[0]
    assert not any("no maxinstr ranges" in n for n in torch_decode["sources"]["notes"])
    # an nsys capture of a maxinstr program: joined by the NVTX payload, and the note says so
    assert kvcache["sources"]["join"] == "payload"
    assert any(n.endswith("by NVTX payload == record id") for n in _joins_said(kvcache))


def test_the_gpu_tables_cover_the_steady_state_and_say_so(torch_decode):
    """Kineto decode: the weight load (`load`, warm-up only) was 36% of the whole trace's GPU time
    (memcpy HtoD); the family and kernel tables a user reads first cover the steady state."""
    from maxinstr.render import _fmt, markdown, text

    gpu = torch_decode["gpu"]
    whole = {r["family"]: r["share"] for r in gpu["families"]}
    assert whole["memcpy"] > 0.3  # what the tables showed before
    st = gpu["steady"]
    assert st["ops"] + st["startup_ops"] == gpu["ops"]
    assert abs(st["gpu_ns"] + st["startup_gpu_ns"] - gpu["gpu_ns"]) < 1e-3 * gpu["gpu_ns"]
    assert st["families"][0]["family"] == "gemm"
    assert {r["family"]: r["share"] for r in st["families"]}["memcpy"] < 0.01
    assert not any(k["name"].startswith("Memcpy HtoD") for k in st["kernels"][:10])
    fams, ks, scope, caption = _fmt.gpu_tables(torch_decode)
    assert scope == "steady state" and fams == st["families"] and caption.startswith(f"steady state: {st['ops']} ops")
    t = text.render(torch_decode, width=120)
    assert "GPU time by kernel family (steady state)" in t and "Top kernels (steady state)" in t
    assert "## GPU time by kernel family (steady state)" in markdown.render(torch_decode)


def test_a_trace_without_stages_says_its_tables_cover_the_whole_trace():
    from maxinstr.render import text

    report = build_report(None, DATA / "nsys/pipit_cloverleaf_no_nvtx_nsys2024.5.sqlite")
    assert report["gpu"]["steady"] is None
    t = text.render(report, width=100)
    assert "GPU time by kernel family (whole trace)" in t and "whole trace: 1591 ops" in t


def test_a_dense_samplers_top_k_is_not_called_routing(torch_decode):
    """h200_torch_decode is a dense model: torch's top-k in its `sample` stage (mbtopk, 58% of
    the stage by the framework's aten::topk range) is top-k, not MoE routing."""
    sample = next(s for s in torch_decode["stages"] if s["name"] == "sample")
    fams = {f["family"]: f["share"] for f in sample["mix"]["families"]}
    assert "routing" not in fams and fams["top_k"] > 0.4
    assert all(k["family"] == "top_k" for k in sample["mix"]["top_kernels"] if "mbtopk::" in k["name"])
    assert not any(f["id"].startswith("moe_") for f in torch_decode["diagnosis"])


@pytest.fixture(scope="module")
def reprefill():
    return build_report(DATA / "nsys/h200_reprefill-run", DATA / "nsys/h200_reprefill.sqlite")


def _stage(report, name):
    return next(s for s in report["stages"] if s["name"] == name)


def test_a_stage_and_what_it_holds_draw_one_power(kvcache):
    """kvcache: `request` read ~246 W (NVML's lagging reading: the sampler stopped before the
    last request ended, so it had no energy value) while its `decode`, 90% of it, drew 530 W by the
    energy counter. Power is the energy over the time the counter covered, for both."""
    req, dec = _stage(kvcache, "request")["samples"], _stage(kvcache, "decode")["samples"]
    assert req["power_source"] == dec["power_source"] == "energy"
    assert abs(req["power_w_mean"] - dec["power_w_mean"]) < 0.05 * dec["power_w_mean"]
    assert req["power_reading_w_mean"] < 0.6 * req["power_w_mean"]  # the reading it showed before


def test_the_findings_quote_only_the_power_the_table_prints(reprefill, kvcache):
    from maxinstr.render import text

    for report in (reprefill, kvcache):
        t = text.render(report, width=200)
        for f in report["diagnosis"]:
            power = f["evidence"].get("power_w_mean") if f["id"] == "throttled" else None
            if power is None:
                continue
            smp = _stage(report, f["stage"])["samples"]
            assert not smp["power_limited"] and f"{power:.0f} W" in t
            row = next(line for line in t.splitlines() if line.startswith(f"│   {f['stage']} "))
            assert f"{power:.0f} W" in row
    # reprefill: decode's 704 W is shown and quoted; sample's (70 us between decode steps) is neither
    assert not _stage(reprefill, "decode")["samples"]["power_limited"]
    assert _stage(reprefill, "sample")["samples"]["power_limited"]
    note = next(line for line in text.render(reprefill, width=400).splitlines() if line.startswith("power not shown"))
    assert note.startswith("power not shown for prefill, sample:")


def test_util_and_power_are_not_shown_together_without_cause(reprefill):
    """reprefill: NVML's utilization never changed (90%), so its windows cannot be placed over the
    last request: util is not shown for any stage, but power, from the energy counter, is for the
    stages that fill its readings' intervals."""
    from maxinstr.render import text

    t = text.render(reprefill, width=400)
    assert "util not shown for request, prefill, sample, decode:" in t and "cannot be placed" in t
    row = next(line for line in t.splitlines() if line.startswith("│ request "))
    assert " 705 W " in row


def test_what_is_at_stake_comes_first(reprefill):
    """reprefill: the 0%-at-stake profiler note stood above the 23%-at-stake re-prefill hypothesis."""
    from maxinstr.render import text

    t = text.render(reprefill, width=160)
    panel = t.split("Diagnosis", 1)[1]
    assert panel.index("[reprefill_quadratic]") < panel.index("Also noted (nothing at stake)") < panel.index(
        "[profiled_timings]")


def test_one_stage_one_busy_number():
    """h200_decode: decode has two populations (with and without a CUDA graph); launch_bound
    measured the no-graph one at 9% busy, while dominant_kernel said "busy only 24%" (the whole
    stage). Every finding quotes the pace finding's number, and says whose it is."""
    import re

    report = build_report(None, DATA / "nsys/h200_decode.sqlite")
    said = {f["id"]: f["title"] for f in report["diagnosis"] if f.get("stage") == "decode"}
    pace = next(f for f in report["diagnosis"] if f["id"] == "launch_bound" and f["stage"] == "decode")
    busy = f"{pace['evidence']['gpu_busy_frac_median']:.0%}"
    for fid in ("dominant_kernel", "healthy_dense_decode"):
        assert re.findall(r"busy only (\d+%)", said[fid]) == [busy], said[fid]
        assert f"of its {pace['evidence']['population']} instances" in said[fid]
