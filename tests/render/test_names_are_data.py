"""Names are data in every view (issue 20, class 3): a stage, range or kernel name holding markup
of any view (rich's ``[/]``, ``[link=...]``, Markdown, raw HTML), control characters or a lone
surrogate is shown as itself (control characters and surrogates as visible escapes) and never
breaks, styles or links anything.

Markdown is checked by rendering it with markdown-it-py (rich's own Markdown parser, a
CommonMark implementation) and reading the HTML it produces."""

from __future__ import annotations

import os
import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from hostile_inputs import KNOWN_BAD, NAMES, kineto_doc, write_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml

from maxinstr._text import visible
from maxinstr.analyze.compare import Side, compare
from maxinstr.analyze.report import analyze
from maxinstr.cli import main
from maxinstr.render import html as rhtml
from maxinstr.render import markdown, text
from maxinstr.rundir import load
from maxinstr.traces import open_trace

_MD = MarkdownIt("commonmark").enable("table")


def _reports(tmp: Path, names: list[str]):
    run_dir = write_run(tmp / "run", names)
    trace = tmp / "trace.json"
    trace.write_text(json.dumps(kineto_doc(names, names[::-1])))
    a = analyze(run=load(run_dir))
    b = analyze(trace=open_trace(trace))
    return run_dir, trace, a.report, b.report


def _md_html(md: str) -> str:
    return _MD.render(md)


def _check_views(tmp: Path, names: list[str]) -> None:
    _, _, run_report, trace_report = _reports(tmp, names)
    shown = [visible(n) for n in names]
    for report in (run_report, trace_report):
        out = text.render(report, width=400)
        # every name appears as itself (escaped), and no markup was applied: a styled render
        # (colour on) holds no hyperlink escape and no style the names asked for
        for s in shown:
            assert s in out, (s, out)
        colored = text.render(report, width=400, color=True)
        assert "\x1b]8;" not in colored  # no terminal hyperlink
        assert "\udcff" not in out and "\x1b[31m" not in out
        page = _md_html(markdown.render(report))
        for s in shown:
            assert escapeHtml(s.strip()) in page, (s, page)
        assert "<img" not in page and "<script" not in page and "</td></tr><tr>" not in page
        h = rhtml.render(report)
        assert "<img src=x" not in h and "<script>alert" not in h
        # no control character or line separator reaches the page raw (a newline is markup's own)
        assert not re.search("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029]", h)
        for s in shown:
            assert rhtml.e(s) in h, s
    result = compare([Side("A", run_report), Side("B", trace_report)])
    out = text.render_compare(result, width=400)
    for s in shown:
        assert s in out
    page = _md_html(markdown.render_compare(result))
    assert "<img" not in page and "<script" not in page


def test_known_hostile_names_in_every_view(tmp_path):
    _check_views(tmp_path, list(KNOWN_BAD))


_TMP = Path(tempfile.mkdtemp(prefix="maxinstr-names-"))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None,
          derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1")
@given(names=st.lists(NAMES, min_size=1, max_size=5, unique_by=visible).filter(
    lambda ns: len({visible(n).strip() for n in ns}) == len(ns) and all(visible(n).strip() for n in ns)))
def test_any_names_in_every_view(names):
    tmp = _TMP / "x"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _check_views(tmp, names)


def test_report_and_compare_commands_print_markup_names(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run", ["[/]", "[pl][profile]Strategy.training_step", "[link=http://x]y"])
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "[pl][profile]Strategy.training_step" in out and "[/]" in out and "[link=http://x]y" in out
    assert main(["compare", str(run_dir), str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "[pl][profile]Strategy.trainin" in out and "[link=http://x]y " in out  # (cut to the width)


@pytest.mark.parametrize("raw, shown", [
    ("a\nb", "a\\nb"), ("t\tx", "t\\tx"), ("\x1b[31m", "\\x1b[31m"), ("f-\udcff", "f-\\udcff"), ("plain", "plain"),
    ("\u2028", "\\u2028"), ("\x85", "\\x85"), ("é中", "é中"),
])
def test_visible_escapes_only_what_cannot_be_shown(raw, shown):
    assert visible(raw) == shown
    assert re.fullmatch(r"[^\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]*", visible(raw))


_DATA = Path(__file__).resolve().parents[1] / "data"
MARKUP_DIRS = ["r[", "[link=http://example.com]x", "[bold red]y", ":smile:", "t\x1b[31m"]


def _spinner_shows(messages: list[str]) -> None:
    from maxinstr.cli.report import Progress

    with Progress() as progress:
        assert progress._status is not None  # the spinner really runs
        for message in messages:
            progress.update(message)
            assert progress._status.renderable.text.plain == visible(message)


def test_progress_shows_a_message_as_text_not_markup(monkeypatch, capsys):
    """The spinner (rich Status) shows paths and a reader's words: as text, escaped like a name."""
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich's terminal test passes, as on a terminal
    _spinner_shows(["reading /tmp/x/r[/] ...", "/x/[link=http://example.com]y: parsing", *KNOWN_BAD])
    assert "\x1b]8;" not in capsys.readouterr().err  # no terminal hyperlink was written


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck), database=None,
          derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1")
@given(names=st.lists(NAMES, min_size=1, max_size=4))
def test_any_path_in_the_spinner_is_text(names):
    old = os.environ.get("FORCE_COLOR")
    os.environ["FORCE_COLOR"] = "1"
    try:
        _spinner_shows([f"reading /tmp/{n} ..." for n in names])
    finally:
        if old is None:
            del os.environ["FORCE_COLOR"]
        else:
            os.environ["FORCE_COLOR"] = old


@pytest.mark.parametrize("folder", MARKUP_DIRS)
def test_report_on_a_terminal_takes_paths_holding_markup(folder, tmp_path, monkeypatch, capsys):
    """`maxinstr report '/tmp/x/r[/]'` with the spinner on (FORCE_COLOR, as on a terminal): the
    run directory and trace paths go into the spinner's messages, and made rich raise
    MarkupError ("closing tag '[/]'") before they were text."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    where = tmp_path / folder / "]"
    where.mkdir(parents=True)
    run_dir = where / "run"
    shutil.copytree(_DATA / "nsys" / "h200_window-run", run_dir)
    trace = where / "trace.pt.trace.json.gz"
    shutil.copy(_DATA / "kineto" / "h200_decode.pt.trace.json.gz", trace)
    for args in (["report", str(run_dir), "--format", "json"], ["report", "--trace", str(trace), "--format", "json"],
                 ["report", str(trace), "--format", "json"]):
        rc = main(args)
        out = capsys.readouterr()
        assert rc == 0, out.err
        assert json.loads(out.out)["schema"] == "maxinstr-report"
