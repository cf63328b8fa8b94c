from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def decode_report():
    from helpers.fixture_columns import DATA
    from maxinstr.analyze.report import build_report

    return build_report(trace=str(DATA / "nsys" / "h200_decode.sqlite"))
