"""One column, one meaning, in every view (issue 28 point 1): the text and Markdown views of the
same real capture show the same rows with the same numbers, and say which GPU measure a number is."""

from __future__ import annotations

from pathlib import Path

import pytest

from maxinstr.analyze.report import build_report
from maxinstr.render import markdown, text

DATA = Path(__file__).parents[1] / "data"
CAPTURES = {
    "torch_decode": (DATA / "kineto/h200_torch_decode-run", DATA / "kineto/h200_torch_decode.pt.trace.json.gz"),
    "kvcache": (DATA / "nsys/h200_kvcache-run", DATA / "nsys/h200_kvcache.sqlite"),
    "max_block": (DATA / "max/block_run", DATA / "max/block_run/profile.sqlite"),
}


@pytest.fixture(scope="module", params=sorted(CAPTURES))
def report(request):
    run, trace = CAPTURES[request.param]
    return build_report(run, trace)


def _section(lines: list[str], title: str) -> list[str]:
    """The lines of one table: a Markdown section up to the next heading, a text table up to its
    bottom border."""
    at = next(i for i, line in enumerate(lines) if line.lstrip("# ").startswith(title))
    out = []
    for line in lines[at + 1:]:
        if line.startswith("## "):
            break
        out.append(line)
        if line.startswith("└"):
            break
    return out


def _text_rows(section: list[str]) -> list[list[str]]:
    return [[c.strip() for c in line.strip("│").split("│")] for line in section if line.startswith("│")]


def _md_rows(section: list[str]) -> list[list[str]]:
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section if line.startswith("| ")]
    return rows[1:]  # the header


def test_the_startup_table_is_one_table_in_text_and_markdown(report):
    t = _text_rows(_section(text.render(report, width=200).splitlines(), "Startup"))
    m = _md_rows(_section(markdown.render(report).splitlines(), "Startup"))
    assert t and len(t) == len(m)
    for tr, mr in zip(t, m):
        stage, occurrence, why, host, gpu = tr[:5]
        assert [stage, occurrence, why, host] == mr[:4]
        # one measure, by the stage table's rule (events, else the projected span), marked in both
        value, _, basis = mr[4].partition(" (")
        assert gpu.removesuffix(" p") == value and (gpu.endswith(" p") == (basis == "proj)"))
    # and it is the measure the JSON names: events first
    rows = report["startup"]
    shown = {(r["stage"], str(r["occurrence"])): r for r in rows}
    for tr in t:
        r = shown[(tr[0], tr[1])]
        assert (r.get("gpu_event_ns") is not None) == (not tr[4].endswith(" p"))


def test_a_torch_decode_load_shows_one_gpu_time_everywhere():
    """The issue's case: `load` read 1.054 s in the text view and 99.03 ms in Markdown."""
    run, trace = CAPTURES["torch_decode"]
    report = build_report(run, trace)
    t = [r for r in _text_rows(_section(text.render(report, width=120).splitlines(), "Startup")) if r[0] == "load"]
    m = [r for r in _md_rows(_section(markdown.render(report).splitlines(), "Startup")) if r[0] == "load"]
    assert t[0][4] == "1.054 s" and m[0][4] == "1.054 s (event)"


def test_the_stage_table_gpu_median_is_one_number_in_text_and_markdown(report):
    t = {r[0].strip(): r for r in _text_rows(_section(text.render(report, width=250).splitlines(), "Stages"))}
    m = {r[0].replace("&nbsp;", "").strip(): r for r in _md_rows(_section(markdown.render(report).splitlines(),
                                                                           "Stage timings"))}
    assert t and set(t) <= set(m) | {""}
    head = _section(text.render(report, width=250).splitlines(), "Stages")[1:3]  # a two-line header
    t_head = [" ".join(p).strip() for p in zip(*[[c.strip() for c in h.strip("┃").split("┃")] for h in head])]
    gpu_at = t_head.index("GPU median")
    for name, row in t.items():
        if not name:
            continue
        value, _, basis = m[name][5].partition(" (")
        assert row[gpu_at].removesuffix(" p") == value, name
        assert row[gpu_at].endswith(" p") == (basis == "proj)"), name
