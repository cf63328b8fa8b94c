"""Terminal layout on every fixture at 80, 100, 120 and 200 columns (issue 17, point 7), report
and compare.

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
from maxinstr.analyze.compare import Side, compare
from maxinstr.analyze.report import analyze, build_report
from maxinstr.render import _fmt
from maxinstr.render.text import KEY_MIN, _shown_stages, render, render_compare

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


# ----------------------------------------------------------------------------- compare
COMPARE_TITLES = ("Host time per stage (steady state)", "GPU time per stage",
                  "What the diagnosis asks to check (per stage, A -> B)", "Kernel-mix changes (share of GPU time)",
                  "Kernels only in B", "Kernels only in A", "Settings that differ")
DELTA_CELL = re.compile(r"^(-|[+-]?[\d.]+ (ns|us|ms|s)( \([+-][\d.]+%\))?|\d+/\d+( \(\d+/\d+ runs\))?|"
                        r"within noise|cannot tell|too few instances|too few|instances|faster|slower|only in [AB]|)$")


@pytest.fixture(scope="module")
def comparisons(reports) -> dict[str, dict]:
    """compare on the fixtures: every report against itself and against the next one (stages
    and kernels on one side only), and, from raw values, a two-population stage (h200_decode's
    decode) and sides of two runs each (the kvcache runs, profiled and plain)."""
    names = sorted(reports)
    out = {}
    for i, name in enumerate(names):
        nxt = names[(i + 1) % len(names)]
        out[f"{name} A/A"] = compare([Side("A", reports[name]), Side("B", reports[name])])
        out[f"{name} vs {nxt}"] = compare([Side(name, reports[name]), Side(nxt, reports[nxt])])
    decode = analyze(trace=DATA / "nsys/h200_decode.sqlite")
    out["h200_decode raw A/A"] = compare([Side("A", decode), Side("B", decode)])
    torch = "kineto/h200_decode.pt.trace.json.gz"  # findings gone, new and still: a long findings cell
    out["h200_decode nsys vs torch"] = compare([Side("A", decode), Side("B", reports[torch])])
    kv = analyze(run=DATA / "nsys/h200_kvcache-run", trace=DATA / "nsys/h200_kvcache.sqlite")
    plain = analyze(run=DATA / "nsys/h200_kvcache-plain-run")
    out["kvcache pooled"] = compare([Side("runs/a", [kv, plain]), Side("runs/b", [plain, kv])])
    return out


def _tables(text: str, titles: tuple[str, ...]) -> list[list[list[str]]]:
    """The body rows (cells) of the tables whose title is one of ``titles`` (continuations too)."""
    out, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if line.removesuffix(" (continued)") in titles and i + 1 < len(lines) and lines[i + 1].startswith("┏"):
            body = lines[i + 1:]
            start = next(k for k, ln in enumerate(body) if ln.startswith("┡")) + 1
            end = next(k for k, ln in enumerate(body) if ln.startswith("└"))
            out.append([[c.strip() for c in ln.strip("│").split("│")] for ln in body[start:end]])
    return out


@pytest.mark.parametrize("width", WIDTHS)
def test_compare_fits_without_cutting_names_or_numbers(comparisons, width):
    """issue 17 review, point 7: at 80 columns compare's titles wrapped ('Host time per stage
    (steady' / 'state) (continued)') and its checks table split stage names ('pre'/'fil'/'l')."""
    for name, result in comparisons.items():
        text = render_compare(result, width=width)
        lines = text.splitlines()
        assert max(len(ln) for ln in lines) <= width, (name, width)
        assert not [ln for ln in lines if ln.startswith("┃") and "…" in ln], (name, width)
        assert not NAN_TEXT.search(text), (name, width)
        # every table's title whole on the line above it
        for i, ln in enumerate(lines):
            if ln.startswith("┏"):
                assert lines[i - 1].removesuffix(" (continued)") in COMPARE_TITLES, (name, width, lines[i - 1])
        c = result["comparisons"][0]
        delta = _tables(text, COMPARE_TITLES[:2])
        for title, rows in zip(COMPARE_TITLES[:3], (c["stages"], c["gpu_stages"], c["checks"])):
            for t in _tables(text, (title,)):  # each table, continuations too, repeats the stage column
                keys = "".join(r[0] for r in t).replace(" ", "")
                for r in rows:
                    # a name folds over lines only when longer than half the width (KEY_MIN at least)
                    if len(r["stage"]) <= max(KEY_MIN, width // 2):
                        assert r["stage"] in {x[0] for x in t}, (name, width, title, r["stage"])
                    else:
                        assert r["stage"].replace(" ", "") in keys, (name, width, title, r["stage"])
        cells = [cell for t in delta for r in t for cell in r[1:]]
        for cell in cells:
            assert DELTA_CELL.match(cell), (name, width, cell)
        for r in c["stages"] + c["gpu_stages"]:
            for row in [r] + ((r.get("populations") or {}).get("rows") or []):
                if "a" in row:
                    assert _fmt.ns(row["a"]["median"]) in cells and _fmt.ns(row["b"]["median"]) in cells, (name, r)


NAN_TEXT = re.compile(r"(?i)(?<![a-z_])[+-]?(nan|inf)(?![a-z_(<])")


def test_compare_narrow_keeps_the_verdict_beside_the_delta(comparisons):
    text = render_compare(comparisons["h200_decode raw A/A"], width=80)
    first = _tables(text, COMPARE_TITLES[:1])[0]
    assert all(len(r) == 5 for r in first) and first[0][-1] == "within noise"  # stage, medians, delta, verdict
    assert "n A/B, noise ±, p90 delta: in the table below, to fit 80 columns" in text
    assert "Host time per stage (steady state) (continued)\n┏" in text
