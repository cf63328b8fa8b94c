"""The report's types (maxinstr.analyze.schema) against the reports themselves: every report built
from the fixtures, once through JSON, holds only the keys its TypedDicts declare, every required
key, and values of the declared types; the oldest saved report the tests keep too (what a
required key promises). And mypy, with the project's configuration, fails on a key the schema
does not have, read by ``[...]`` or by ``.get``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pytest

from helpers.fixture_columns import DATA
from helpers.schema_check import always, problems
from maxinstr.analyze import schema
from maxinstr.analyze.report import build_report
from maxinstr.render.json import render

REPO = Path(__file__).resolve().parents[2]


NSYS = DATA / "nsys"
INPUTS = {
    **{f"trace {p.name}": {"trace": p} for p in sorted(NSYS.glob("*.sqlite"))},
    **{f"joined {n}": {"run": NSYS / f"{n}-run", "trace": NSYS / f"{n}.sqlite"}
       for n in ("h200_kvcache", "h200_moe", "h200_reprefill", "h200_threads")},
    "unprofiled": {"run": NSYS / "h200_kvcache-run", "trace": NSYS / "h200_kvcache.sqlite",
                   "unprofiled_run": NSYS / "h200_kvcache-plain-run"},
    "run alone, samples": {"run": NSYS / "h200_window-run"},
    "run alone": {"run": NSYS / "h200_kvcache-run"},
    **{f"trace {p.name}": {"trace": p} for p in sorted((DATA / "kineto").glob("*.json.gz"))},
    "joined kineto": {"run": DATA / "kineto/h200_torch_decode-run", "trace": DATA / "kineto/h200_torch_decode.pt.trace.json.gz"},
    "max run": {"run": DATA / "max/decoder_run"},
    "max joined": {"run": DATA / "max/block_run", "trace": DATA / "max/block_nsys.sqlite"},
    **{f"trace {p}": {"trace": DATA / "rocprof" / p}
       for p in ("rocprofv3_docs", "rocprofv3_llamacpp_decode", "rpd/matmul_result.rpd", "rpd/mytrace.rpd.gz")},
}


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_built_report_matches_the_schema(name):
    report = json.loads(render(build_report(**INPUTS[name])))
    assert problems(report, schema.Report) == []


def test_every_optional_key_of_the_stage_occurs():
    """The fixtures exercise the schema: each key of a stage row appears in some report."""
    seen: set[str] = set()
    for name in ("joined h200_kvcache", "unprofiled", "run alone, samples"):
        for st in build_report(**INPUTS[name])["stages"]:
            seen |= set(st)
    assert seen == set(typing.get_type_hints(schema.Stage))


def test_always_marks_what_every_report_has():
    assert "stages" in always(schema.Report) and "coverage" not in always(schema.Report)
    assert always(schema.Statistic) == {"n"}


def test_saved_report_of_the_oldest_version_has_every_required_key():
    saved = json.loads((DATA / "reports/h200_kvcache_b16.report.json").read_text())
    assert problems(saved, schema.Report) == []


def test_gpu_by_rank_matches_the_schema():
    """``ranks.gpu`` (the multi-rank reports themselves: tests/reliability/test_ranks.py)."""
    from maxinstr.analyze.ranks import gpu_by_rank

    gpu = gpu_by_rank(np.array([0, 0, 1]), np.array([0, 1, 1]), np.array([10, 20, 30]), ["collective", "gemm"])
    assert problems(json.loads(json.dumps(gpu)), list[schema.RankGpu]) == []


WRONG = """
from maxinstr.analyze.schema import Report, Stage

def views(report: Report, st: Stage) -> None:
    report["stage"]
    report.get("stagez")
    st.get("share_of_tops", 0)
    (st.get("mix") or {}).get("top_kernel")
    report.get("stages")
"""


@pytest.mark.slow
def test_mypy_fails_on_a_key_the_schema_lacks(tmp_path):
    """A misspelt (or renamed) key is a type error, by ``[...]`` and by ``.get`` (the plugin
    .ci/mypy_typeddict_get.py: mypy alone types an unknown ``.get`` key ``object`` and goes on)."""
    if shutil.which("mypy", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("mypy is not installed (it is in the test extra)")
    probe = tmp_path / "probe.py"
    probe.write_text(WRONG)
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
                          "--cache-dir", str(tmp_path / "cache"), "--follow-imports", "silent", str(probe)],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    errors = [ln for ln in out.stdout.splitlines() if ": error:" in ln]
    assert [ln.split(":")[1] for ln in errors] == ["5", "6", "7", "8"], out.stdout
    assert all("[typeddict-item]" in ln for ln in errors), out.stdout
