"""Terminal layout on every fixture at 80, 100, 120 and 200 columns (issue 17, point 7).

Before: at 120 columns the stage column showed ``forw…`` and rows wrapped (``elementwi…`` over
``40%``); at 80, numbers and headers were cut (``228…``, ``med…``); piped output ignored
COLUMNS. Now stage names and numbers are never cut or split, columns that do not fit move to a
continuation table that says so, and the width comes from --width, else COLUMNS.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from helpers.fixture_columns import DATA
from maxinstr.analyze.report import build_report
from maxinstr.render import _fmt
from maxinstr.render.text import _shown_stages, render

TRACES = sorted([str(p.relative_to(DATA)) for p in DATA.glob("nsys/*.sqlite")]
                + [str(p.relative_to(DATA)) for p in DATA.glob("kineto/*.json.gz")]
                + [str(p.relative_to(DATA)) for p in DATA.glob("rocprof/rpd/*.rpd*")]
                + ["rocprof/rocprofv3_llamacpp_decode"])
RUNS = ["h200_kvcache", "h200_reprefill", "h200_moe", "h200_threads"]
WIDTHS = (80, 100, 120, 200)
NUMBER = re.compile(r"^-?[\d.]+( (ns|us|ms|s|W))?%?( \(\+\d+\))?\*?$")


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    out = {rel: build_report(trace=DATA / rel) for rel in TRACES}
    for name in RUNS:
        out[name] = build_report(run=DATA / "nsys" / f"{name}-run", trace=DATA / "nsys" / f"{name}.sqlite")
    return out


def _stage_rows(text: str) -> list[list[str]]:
    """Cells of the rows of the stage table(s), continuation tables included."""
    rows = []
    for block in text.split("Stages (steady state)")[1:]:
        for line in block.split("\n┗")[0].split("└")[0].splitlines():
            if line.startswith("│"):
                rows.append([c.strip() for c in line.strip("│").split("│")])
    return rows


@pytest.mark.parametrize("width", WIDTHS)
def test_every_fixture_fits_without_cutting_names_or_numbers(reports, width):
    for name, report in reports.items():
        text = render(report, width=width)
        lines = text.splitlines()
        assert max(len(ln) for ln in lines) <= width, (name, width)
        # headers whole (they wrap at spaces, never end in an ellipsis)
        assert not [ln for ln in lines if ln.startswith("┃") and "…" in ln], (name, width)
        rows = _stage_rows(text)
        # each stage name is whole: one cell, or (longer than half the width) folded over the
        # lines of its row, never cut
        keys = "".join(r[0] for r in rows).replace(" ", "")  # folding breaks lines at spaces
        # the terminal shows the stages with the most steady host time (issue 20) and says so
        shown = _shown_stages(report["stages"])
        if len(shown) < len(report["stages"]):
            assert f"{len(report['stages']) - len(shown):,} more stages not shown" in text, (name, width)
        for s in shown:
            assert s["name"].replace(" ", "") in keys, (name, width, s["name"])
        # every numeric cell is a whole number with its unit: none cut, none split over lines
        for r in rows:
            for cell in r[1:]:
                assert "…" not in cell, (name, width, r)
                if cell and cell[0].isdigit() and not cell.endswith("%") or cell.endswith(("us", "ms", " s", "ns")):
                    assert NUMBER.match(cell), (name, width, cell)
        for s in shown:
            med = _fmt.ns(_fmt.stat(s.get("headline_host_ns") or s["host_ns"]))
            assert any(med in r for r in rows), (name, width, s["name"], med)


def test_narrow_terminal_moves_columns_and_says_which(reports):
    text = render(reports["nsys/h200_decode.sqlite"], width=80)
    assert "Stages (steady state) (continued)" in text
    note = re.search(r"^(.*): in the table below, to fit 80 columns", text, re.M)
    assert note and "host p90" in note.group(1)  # the p90 columns move first
    wide = render(reports["nsys/h200_decode.sqlite"], width=200)
    assert "(continued)" not in wide and "host p90" in wide


def _cli(*args: str, **env: str) -> str:
    e = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    e.update(env)
    return subprocess.run([sys.executable, "-m", "maxinstr", "report", *args, "--quiet"], capture_output=True,
                          text=True, env=e, timeout=120, check=True).stdout


def test_piped_output_honours_columns_and_width():
    trace = str(DATA / "nsys/h200_decode.sqlite")
    assert max(len(ln) for ln in _cli(trace, COLUMNS="80").splitlines()) <= 80
    assert max(len(ln) for ln in _cli(trace, "--width", "100", COLUMNS="80").splitlines()) == 100
    assert max(len(ln) for ln in _cli(trace).splitlines()) == 120  # piped, nothing said: 120
