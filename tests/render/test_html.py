"""The HTML report: self-contained, every plot present with the report's numbers, facts apart
from hypotheses. (Rendering in a real browser: test_html_browser.py.)"""

from __future__ import annotations

import re

import numpy as np
from html.parser import HTMLParser

import pytest

import maxinstr
from maxinstr.analyze.report import analyze
from maxinstr.render import _fmt
from maxinstr.render import html as rhtml
from views_data import DATA, recorded_run


class _Tags(HTMLParser):
    """Counts start tags and checks that every opened element is closed in order."""

    VOID = {"meta", "br", "img", "input", "link", "hr", "col", "wbr"}
    SVG_LEAVES = {"rect", "line", "polyline", "polygon", "circle", "path", "text"}

    def __init__(self) -> None:
        super().__init__()
        self.count: dict[str, int] = {}
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.attrs: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.count[tag] = self.count.get(tag, 0) + 1
        self.attrs.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
            return
        self.stack.pop()


def _parse(doc: str) -> _Tags:
    p = _Tags()
    p.feed(doc)
    p.close()
    return p


@pytest.fixture(scope="module")
def decode_html():
    a = analyze(trace=str(DATA / "nsys" / "h200_decode.sqlite"))
    return a, rhtml.render(a.report, analysis=a)


def test_self_contained_and_well_formed(decode_html):
    _, doc = decode_html
    assert doc.startswith("<!DOCTYPE html>")
    # nothing fetched from anywhere: no external script, stylesheet, image or font
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", doc)
    assert "@import" not in doc and "url(" not in doc
    tags = _parse(doc)
    assert tags.errors == [] and tags.stack == []
    assert tags.count.get("script", 0) == 0


def test_plots_carry_the_report_numbers(decode_html):
    a, doc = decode_html
    tags = _parse(doc)
    svgs = [attrs.get("aria-label") for tag, attrs in tags.attrs if tag == "svg"]
    assert "per-stage time breakdown" in svgs
    assert "GPU metrics over time with stage bands" in svgs
    assert svgs.count("kernel family mix") >= 3  # one per stage with kernels + the whole input
    dec = next(s for s in a.report["stages"] if s["name"] == "decode")
    # breakdown row: host median, GPU (projected) median, busy fraction, steady instances
    busy = _fmt.pct(dec["gpu_busy_frac"]["median"])
    assert f"{_fmt.ns(dec['host_ns']['median'])} · {_fmt.ns(dec['gpu_proj_ns']['median'])} · {busy} · {dec['steady']}" in doc
    # the trace-derived busy share is drawn (no samples in a trace), with as many points as bins
    polys = [attrs for tag, attrs in tags.attrs if tag == "polygon" and attrs.get("class") == "series"]
    assert polys and int(polys[0]["data-points"]) >= 50
    # one stage band strip per stage, and its instances drawn
    for name in ("request", "prefill", "decode", "sample"):
        assert f"<title>{name}: " in doc
    # top kernels per stage: the dominant decode kernel with its family colour
    top = dec["mix"]["top_kernels"][0]
    assert top["name"] in doc and rhtml.FAMILY_COLORS[top["family"]] in doc


def test_facts_apart_from_hypotheses():
    a = analyze(trace=str(DATA / "kineto" / "h200_decode.pt.trace.json.gz"))
    doc = rhtml.render(a.report, analysis=a)
    facts_at, hyps_at = doc.index("Facts (measured)"), doc.index("Hypotheses (to confirm)")
    also_at = doc.index("Also noted (nothing at stake)")
    assert facts_at < hyps_at < also_at
    for d in a.report["diagnosis"]:
        at = doc.index(f'data-id="{d["id"]}"')
        if d["score"] < 0.005:  # nothing at stake (profiled timings): after the hypotheses
            assert at > also_at, d["id"]
        else:
            assert (hyps_at < at < also_at) == (d["verdict"] == "hypothesis"), d["id"]
    hyp = next(d for d in a.report["diagnosis"] if d["verdict"] == "hypothesis")
    assert "Validate:" in doc[doc.index(f'data-id="{hyp["id"]}"'):]
    assert "attention_dominated_decode" in doc


def test_run_directory_with_samples(tmp_path, monkeypatch):
    run = recorded_run(tmp_path / "run", monkeypatch)
    a = analyze(run=str(run))
    doc = rhtml.render(a.report, analysis=a)
    tags = _parse(doc)
    assert tags.errors == []
    lines: dict[str, int] = {}
    for tag, attrs in tags.attrs:
        if tag == "polyline" and attrs.get("class") == "series":
            lines[attrs["stroke"]] = max(lines.get(attrs["stroke"], 0), int(attrs["data-points"]))
    # util, SM active, tensor active, power, memory: every sampler row of the replayed H200 that
    # has the metric (GPM ones ~1 in 10); how many rows there are depends on the machine's load
    [samples] = maxinstr.load(run).samples.values()
    have = [int(np.isfinite(samples.rows[m]).sum())
            for m in ("gpu_util_pct", "sm_active_pct", "tensor_active_pct", "power_w", "mem_used_bytes")]
    assert sorted(lines.values()) == sorted(have) and min(have) > 0, (lines, have)
    for label in ("utilization / activity (%)", "power (W)", "memory used (GiB"):
        assert label in doc
    assert "Perturbed" not in doc  # no profiler: not perturbed
    for name in ("idle", "matmul", "tiny"):
        assert f"<title>{name}: " in doc


def test_saved_report_renders_without_timeline(decode_html):
    a, _ = decode_html
    doc = rhtml.render(a.report)  # what `maxinstr report saved.json --format html` does
    assert "keeps statistics, not the timeline" in doc
    assert 'aria-label="per-stage time breakdown"' in doc
    assert _parse(doc).errors == []


def test_every_fixture_renders():
    for path in ("nsys/cs336_2_7B_nvtx_nsys2024.6.sqlite", "rocprof/rpd/matmul_result.rpd",
                 "nsys/pipit_cloverleaf_no_nvtx_nsys2024.5.sqlite", "kineto/hta_triton_example.json.gz"):
        a = analyze(trace=str(DATA / path))
        doc = rhtml.render(a.report, analysis=a)
        tags = _parse(doc)
        assert tags.errors == [] and tags.stack == [], path
        assert len(doc) < 2_000_000, path


def test_kernel_busy_share_is_exact_on_a_real_trace():
    a = analyze(trace=str(DATA / "nsys" / "h200_decode.sqlite"))
    s, e = a.trace.ops.start_ns.astype(float), a.trace.ops.end_ns.astype(float)
    edges = np.linspace(s.min() - 1e3, e.max() + 1e3, 97)
    got = np.diff(rhtml.busy_before(s, e, edges))
    want = np.array([np.clip(np.minimum(e, hi) - np.maximum(s, lo), 0, None).sum() for lo, hi in zip(edges, edges[1:])])
    assert np.allclose(got, want, rtol=1e-9, atol=1e-3)
    assert got.sum() == pytest.approx((e - s).sum())


def test_cli_writes_html(tmp_path):
    from click.testing import CliRunner

    from maxinstr.cli.report import command

    out = tmp_path / "r.html"
    res = CliRunner().invoke(command, ["--trace", str(DATA / "nsys" / "h200_decode.sqlite"), "--format", "html",
                                       "-o", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    doc = out.read_text()
    assert 'aria-label="GPU metrics over time with stage bands"' in doc and "launch_bound" in doc


def test_run_joined_to_its_trace(tmp_path):
    from test_perfetto import _shifted_fixture_run

    a = _shifted_fixture_run(tmp_path, 10**12)
    doc = rhtml.render(a.report, analysis=a)
    assert _parse(doc).errors == []
    assert "axis: host clock" in doc and "150 records joined by payload" in doc
    # under each stage's host strip, its projected GPU spans
    gpu = [attrs for tag, attrs in _parse(doc).attrs if tag == "rect" and attrs.get("class") == "gpu"]
    assert len(gpu) >= 20 and "decode projected GPU span" in doc
    # the kernels' busy share is drawn inside the stage window (trace moved onto the host clock)
    poly = next(attrs for tag, attrs in _parse(doc).attrs if tag == "polygon" and attrs.get("class") == "series")
    ys = [float(p.split(",")[1]) for p in poly["points"].split()]
    assert max(ys) - min(ys) > 10  # not a flat line: kernels fall inside the framed window


def test_breakdown_bars_compare_stages(decode_html):
    """The bars share one scale (total time over steady instances): a stage that takes 40x less
    time gets a 40x shorter bar (each row was normalised to itself, so all bars were one length)."""
    a, doc = decode_html
    svg = doc.split('aria-label="per-stage time breakdown"', 1)[1].split("</svg>", 1)[0]
    host = {}
    for m in re.finditer(r'<rect x="240\.00" y="[\d.]+" width="([\d.]+)" height="16\.00" fill="([^"]+)"><title>([^:<]+):',
                         svg):
        if m.group(2) != "#f1f3f7":
            host[m.group(3)] = float(m.group(1))
    st = {s["name"]: s for s in a.report["stages"]}
    assert set(host) == set(st)
    want = {k: st[k]["host_ns"]["total"] for k in host}
    longest = max(want.values())
    for k, w in host.items():
        assert w == pytest.approx(470 * want[k] / longest, abs=0.02), k
    assert host["prefill"] < host["request"] / 10
