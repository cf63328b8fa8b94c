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
