"""Views of a report. Every view module has the one call shape of :class:`View`, and the views of
a comparison that of :class:`CompareView`, so the commands call them all the same way: each view
takes what it needs (the timeline views the analysis, the terminal the width and colour)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:
    from maxinstr.analyze.compare import CompareResult
    from maxinstr.analyze.report import Analysis
    from maxinstr.analyze.schema import Report

VIEWS = {"text": "text", "json": "json", "md": "markdown", "html": "html", "perfetto": "perfetto"}
"""``--format`` name -> module of this package."""


class View(Protocol):
    def render(self, report: Report, analysis: Analysis | None = None, *, width: int = 120, color: bool = False
               ) -> str: ...


class CompareView(Protocol):
    def render_compare(self, result: CompareResult, *, width: int = 120, color: bool = False) -> str: ...


def view(fmt: str) -> View:
    """The view of ``--format fmt``, imported when asked for: a view's imports (rich, numpy) are
    paid only by the commands that render with it."""
    return cast("View", importlib.import_module(f"maxinstr.render.{VIEWS[fmt]}"))


def compare_view(fmt: str) -> CompareView:
    return cast("CompareView", importlib.import_module(f"maxinstr.render.{VIEWS[fmt]}"))


if TYPE_CHECKING:  # mypy holds every view to its protocol
    from maxinstr.render import html, json, markdown, perfetto, text

    _VIEWS: tuple[View, ...] = (text, json, markdown, html, perfetto)
    _COMPARE_VIEWS: tuple[CompareView, ...] = (text, json, markdown)
