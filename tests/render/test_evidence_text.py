"""Evidence for people (issue 17, point 4): on every real capture, each finding's evidence line
is a few named numbers with units: no key=value dumps, no Python literals, no raw field names,
no NaN; and the rule id appears only as the tag, never in the prose."""

from __future__ import annotations

import re

import pytest

from helpers.fixture_columns import DATA

from maxinstr.analyze.report import build_report
from maxinstr.render import _fmt as f

CASES = [
    {"run": DATA / "nsys/h200_kvcache-run", "trace": DATA / "nsys/h200_kvcache.sqlite"},
    {"run": DATA / "nsys/h200_reprefill-run", "trace": DATA / "nsys/h200_reprefill.sqlite"},
    {"run": DATA / "nsys/h200_moe-run", "trace": DATA / "nsys/h200_moe.sqlite"},
    {"run": DATA / "nsys/h200_kvcache-plain-run"},
    {"run": DATA / "nsys/h200_window-run"},
    {"trace": DATA / "nsys/h200_decode.sqlite"},
    {"run": DATA / "max/decoder_run"},
    {"run": DATA / "kineto/h200_torch_decode-run"},
    {"run": DATA / "kineto/h200_torch_decode-run", "trace": DATA / "kineto/h200_torch_decode.pt.trace.json.gz"},
]
RAW = re.compile(r"[{}\[\]]|=|\b\w+_(?:ns|frac|pct|share|median)\b|\bNone\b|\bnan\b|\binf\b")


@pytest.mark.parametrize("case", CASES, ids=lambda c: "+".join(p.name for p in c.values()))
def test_every_finding_reads_as_named_numbers(case):
    report = build_report(**case)
    assert report["diagnosis"], "each of these captures has findings"
    ids = {x["id"] for x in report["diagnosis"]}
    for x in report["diagnosis"]:
        text = f.evidence_text(x.get("evidence") or {}, x["id"])
        assert not RAW.search(text), (x["id"], text)
        for prose in (x["title"], x.get("next_step") or ""):
            # another rule's id in prose would be jargon (a stage name may hold an underscore)
            assert not any(re.search(rf"\b{i}\b", prose) for i in ids if "_" in i), (x["id"], prose)
