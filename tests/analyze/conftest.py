"""Shared fixtures for the report tests: real traces read once per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fixture_columns import DATA  # noqa: E402


@pytest.fixture(scope="session")
def trace_of():
    from maxinstr.traces import open_trace

    cache: dict[str, object] = {}

    def get(rel: str):
        if rel not in cache:
            cache[rel] = open_trace(DATA / rel)
        return cache[rel]

    return get


@pytest.fixture(scope="session")
def analysis_of(trace_of):
    from maxinstr.analyze.report import analyze

    cache: dict[str, object] = {}

    def get(rel: str):
        if rel not in cache:
            cache[rel] = analyze(trace=trace_of(rel))
        return cache[rel]

    return get


@pytest.fixture(scope="session")
def report_of(analysis_of):
    return lambda rel: analysis_of(rel).report
