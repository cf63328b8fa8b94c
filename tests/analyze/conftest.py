"""Shared fixtures for the report tests: real traces read once per session."""

from __future__ import annotations


import pytest

from helpers.fixture_columns import DATA


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


@pytest.fixture(scope="module")
def joined():
    """name -> the report of tests/data/nsys/<name>-run joined to <name>.sqlite, built once per
    test module (tests may modify what they get)."""
    from maxinstr.analyze.report import build_report

    nsys = DATA / "nsys"
    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in cache:
            cache[name] = build_report(run=nsys / f"{name}-run", trace=nsys / f"{name}.sqlite")
        return cache[name]

    return get
