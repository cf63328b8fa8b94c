from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "analyze"))


@pytest.fixture(scope="module")
def decode_report():
    from fixture_columns import DATA
    from maxinstr.analyze.report import build_report

    return build_report(trace=str(DATA / "nsys" / "h200_decode.sqlite"))
