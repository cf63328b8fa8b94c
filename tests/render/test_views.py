"""Text, JSON and Markdown views of a real report: content, not byte-equal formatting."""

from __future__ import annotations

import json
import re

import pytest

from maxinstr.errors import MaxinstrError
from maxinstr.render import _fmt
from maxinstr.render import json as rjson
from maxinstr.render import markdown, text


def test_text_view_has_stage_table_and_diagnosis(decode_report):
    out = text.render(decode_report, width=140)
    for name in ("request", "prefill", "decode", "sample"):
        assert re.search(rf"\b{name}\b", out)
    dec = next(s for s in decode_report["stages"] if s["name"] == "decode")
    assert _fmt.ns(dec["host_ns"]["median"]) in out  # 813.7 us
    assert _fmt.ns(dec["gpu_proj_ns"]["median"]) in out  # 505.4 us
    assert "Facts" in out and "[launch_bound]" in out and "[healthy_dense_decode]" in out
    assert "maxinstr deep-dive" in out
    assert "perturbed" in out
    assert "\x1b[" not in out  # no colour codes unless asked


def test_text_color_is_opt_in(decode_report):
    assert "\x1b[" in text.render(decode_report, color=True)


def test_json_round_trip_is_strict(decode_report):
    doc = rjson.render(decode_report)
    assert "NaN" not in doc and "Infinity" not in doc
    back = rjson.load(doc, "x.json")
    assert back["schema"] == "maxinstr-report" and back["version"] == 1
    assert [s["name"] for s in back["stages"]] == [s["name"] for s in decode_report["stages"]]
    assert back["stages"][2]["gpu_proj_ns"]["median"] == decode_report["stages"][2]["gpu_proj_ns"]["median"]


def test_json_load_errors_are_one_line():
    with pytest.raises(MaxinstrError, match=r"^r\.json: not JSON"):
        rjson.load("{", "r.json")
    with pytest.raises(MaxinstrError, match="not a maxinstr report"):
        rjson.load(json.dumps({"schema": "other"}), "r.json")
    with pytest.raises(MaxinstrError, match="version 7 is not supported"):
        rjson.load(json.dumps({"schema": "maxinstr-report", "version": 7}), "r.json")


def test_markdown_note_sections(decode_report):
    md = markdown.render(decode_report)
    heads = re.findall(r"^## (.+)$", md, re.M)
    for want in ("Baseline", "Stage timings (steady state)", "Ranked bottlenecks", "Facts (measured)",
                 "Hypotheses (to confirm)", "Candidate optimisations", "Reproduce"):
        assert want in heads, heads
    assert heads.index("Facts (measured)") < heads.index("Hypotheses (to confirm)")
    facts = md.split("## Facts (measured)")[1].split("## Hypotheses")[0]
    also = md.split("## Also noted (nothing at stake)")[1].split("\n## ")[0]
    # what is at stake first; a healthy mix (nothing at stake) after the hypotheses
    assert "**launch_bound**" in facts and "**healthy_dense_decode**" in also
    assert heads.index("Hypotheses (to confirm)") < heads.index("Also noted (nothing at stake)")
    # the stage table carries median and p90 per stage
    dec = next(s for s in decode_report["stages"] if s["name"] == "decode")
    row = next(line for line in md.splitlines() if re.match(r"\| (&nbsp;)*decode \|", line))
    assert _fmt.ns(dec["host_ns"]["median"]) in row and _fmt.ns(dec["host_ns"]["p90"]) in row
    assert "```sh\nmaxinstr report" in md
    # each candidate optimisation says how to validate it
    opts = md.split("## Candidate optimisations")[1].split("\n## ")[0]
    assert opts.count("validation:") >= 1 and opts.count("validation:") == opts.count("(from **")


def test_format_helpers():
    assert _fmt.ns(None) == "-" and _fmt.ns(float("nan")) == "-"
    assert _fmt.ns(950) == "950 ns" and _fmt.ns(1500) == "1.5 us"
    assert _fmt.ns(2.5e6) == "2.50 ms" and _fmt.ns(3e9) == "3.000 s"
    assert _fmt.pct(0.123) == "12%" and _fmt.pct(None) == "-"
    # evidence for people: named numbers with the unit the key names, no raw key=value dump
    ev = {"gpu_busy_frac_median": 0.178, "idle_gap_ns_median": 432062.0, "secondary": ["dominant_kernel"],
          "kernels_per_instance_median": 19.0, "instances": 72}
    assert _fmt.evidence_text(ev, "launch_bound") == (
        "GPU busy 18%, kernels per instance 19, GPU idle per instance 432.1 us, instances 72")
    assert _fmt.evidence_text({"reasons": {"sw_power_cap": 3}, "share": 0.5}) == "share 50%"
    assert _fmt.at_stake(0.4213) == "42% at stake"
