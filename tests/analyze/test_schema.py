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
import types
import typing
from pathlib import Path

import numpy as np
import pytest

from helpers.fixture_columns import DATA
from maxinstr.analyze import schema
from maxinstr.analyze.report import build_report
from maxinstr.render.json import render

REPO = Path(__file__).resolve().parents[2]


def always(td: type) -> set[str]:
    """The keys of a schema TypedDict marked ``Always[...]``."""
    return {k for k, t in typing.get_type_hints(td, include_extras=True).items()
            if typing.get_origin(t) is typing.Annotated and schema.ALWAYS in t.__metadata__}


def problems(value: object, tp: object, path: str = "report") -> list[str]:
    """Where ``value`` is not of type ``tp`` (a TypedDict, list/dict/Literal/union of them, or a
    plain type), as 'path: what' lines."""
    if tp is typing.Any:
        return []
    if tp is type(None):
        return [] if value is None else [f"{path}: {value!r} is not null"]
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [problems(value, t, path) for t in typing.get_args(tp)]
        return [] if any(not o for o in options) else min(options, key=len)
    if origin is typing.Literal:
        return [] if value in typing.get_args(tp) else [f"{path}: {value!r} not in {typing.get_args(tp)}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: {type(value).__name__}, not a list"]
        (item,) = typing.get_args(tp)
        return [p for i, v in enumerate(value) for p in problems(v, item, f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not a dict"]
        _, item = typing.get_args(tp)
        return [p for k, v in value.items() for p in problems(v, item, f"{path}.{k}")]
    if typing.is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not a {tp.__name__}"]
        hints = typing.get_type_hints(tp)
        out = [f"{path}.{k}: not in {tp.__name__}" for k in value if k not in hints]
        out += [f"{path}.{k}: missing (Always in {tp.__name__})" for k in always(tp) if k not in value]
        return out + [p for k, v in value.items() if k in hints for p in problems(v, hints[k], f"{path}.{k}")]
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, tp)  # type: ignore[arg-type]
    return [] if ok else [f"{path}: {value!r} is not {getattr(tp, '__name__', tp)}"]


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


def test_rank_section_matches_the_schema():
    """``ranks`` on synthetic instances (benchmarks/rank_section.py's, small): two ranks, rank 1
    slower at one stage, with GPU times per rank."""
    from maxinstr.analyze.instances import StageInstances
    from maxinstr.analyze.ranks import gpu_by_rank, rank_section

    R, steps, S = 2, 12, 3
    n = R * steps * S
    rng = np.random.default_rng(0)
    rank = np.repeat(np.arange(R), steps * S)
    k = np.tile(np.arange(S), R * steps)
    step = np.tile(np.repeat(np.arange(steps), S), R)
    start = (step * S + k) * 1_000_000 + rng.integers(0, 50_000, n)
    dur = 900_000 + rng.integers(0, 20_000, n) + np.where((rank == 1) & (k == 1), 300_000, 0)
    none = np.full(n, -1, np.int64)
    inst = StageInstances(
        name=np.array([f"s{x}" for x in range(S)], object)[k], host_start_ns=start.astype(np.int64),
        host_end_ns=(start + dur).astype(np.int64), gpu_event_ns=(dur // 2).astype(np.int64), proj_start_ns=none,
        proj_end_ns=none, parent=none, part=rank.astype(np.int64), is_mark=np.zeros(n, bool),
        warmup=np.zeros(n, bool), cold=np.zeros(n, bool))
    inst.key = inst.name
    parts = [{"rank": r, "local_rank": r, "world_size": R, "host": "h", "pid": 100 + r, "rows": steps * S,
              "name": f"p{r}"} for r in range(R)]
    gpu = gpu_by_rank(np.array([0, 0, 1]), np.array([0, 1, 1]), np.array([10, 20, 30]), ["collective", "gemm"])
    sec = json.loads(json.dumps(rank_section(inst, parts, gpu)))
    assert sec["stragglers"] and problems(sec, schema.RanksSection) == []


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
