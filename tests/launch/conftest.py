"""Fixtures for the launch tests (helpers live in _launch_helpers.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest


@pytest.fixture
def script(tmp_path: Path):
    """Write a small Python program and return its path."""
    def make(name: str, body: str) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(body), encoding="utf-8")
        return path
    return make
