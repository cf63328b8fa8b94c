"""Crafted JSON in every file of a real run directory (issue 29, the adversary's second pass):
each JSON file of a run made by `maxinstr run` (meta.json, launch.json, part.json,
samples.json, strings/attrs/events.jsonl) replaced whole by odd text, or one of its values by an
odd one; `maxinstr report` in every view, `compare` and `deep-dive --dry-run` then end with a
report or one line naming the problem (exit 0 or 2), never an exception from inside maxinstr
(exit 1, "run with --debug"). It found a samples.json layout without ``t_ns`` crashing the HTML
view."""
from __future__ import annotations

import contextlib
import io
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from maxinstr.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch"))
from _launch_helpers import base_env

DATA = Path(__file__).resolve().parents[1] / "data"
ODD = [None, True, -1, 2**70, 1.5, 1e308, "", "x" * 3000, [], {}, [1, "a"], {"a": {"b": [None]}},
       "\x1b[2J\u2028", "../../../etc/passwd", "/dev/zero"]
WHOLE = [b"", b"[]", b"null", b"{", b'"str"', b"[" * 100 + b"]" * 100, b"\xff\xfe", b"{}", b"1e400"]
PROGRAM = """
import maxinstr
with maxinstr.session("unused", warmup=1):
    for i in range(5):
        with maxinstr.stage("decode", step=i, batch=4):
            with maxinstr.stage("sample"):
                pass
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("crafted")
    (root / "prog.py").write_text(PROGRAM)
    run = root / "base"
    res = subprocess.run([sys.executable, "-m", "maxinstr", "run", "--profiler", "nsys", "--no-report", "-y", "-o",
                          str(run), "--", sys.executable, str(root / "prog.py")],
                         env=base_env(FAKE_NSYS_SQLITE=str(DATA / "nsys" / "h200_decode.sqlite")),
                         capture_output=True, text=True, timeout=120, cwd=root)
    assert res.returncode == 0, res.stderr
    return run


def _leaves(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            yield from _leaves(v, prefix + (i,))


def _set(doc, path, value):
    if not path:
        return value
    target = doc
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    return doc


def _inputs(base: Path) -> list[tuple[str, str, bytes]]:
    rng = random.Random(29)
    out = []
    for f in sorted(p for p in base.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl")):
        rel = str(f.relative_to(base))
        out += [(f"{rel} := {w[:12]!r}", rel, w) for w in WHOLE]
        lines = f.read_text().splitlines() if f.suffix == ".jsonl" else [f.read_text()]
        for k in range(min(len(lines), 2)):
            doc = json.loads(lines[k])
            for path in rng.sample(list(_leaves(doc)), min(6, len(list(_leaves(doc))))):
                value = rng.choice(ODD)
                new = list(lines)
                new[k] = json.dumps(_set(json.loads(lines[k]), path, value))
                out.append((f"{rel}:{k + 1}{list(path)} := {value!r:.30}", rel, ("\n".join(new) + "\n").encode()))
    return out


def _run(args: list[str]) -> tuple[int, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main(args)
    return rc, err.getvalue()


@pytest.mark.slow
def test_crafted_json_anywhere_is_a_report_or_one_line(base, tmp_path):
    bad = []
    for label, rel, data in _inputs(base):
        work = tmp_path / "work"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(base, work)
        (work / rel).write_bytes(data)
        for args in (["report", str(work)], ["report", str(work), "--format", "html", "-o", str(tmp_path / "o.html")],
                     ["report", str(work), "--format", "json", "-o", str(tmp_path / "o.json")],
                     ["report", str(work), "--format", "perfetto", "-o", str(tmp_path / "o.pf.json")],
                     ["compare", str(work), str(base)], ["deep-dive", str(work), "--stage", "decode", "--dry-run"]):
            rc, err = _run(args)
            said = [line for line in err.splitlines() if line.startswith("maxinstr:") and not line.startswith("maxinstr: wrote ")]
            if rc not in (0, 2) or "--debug" in err or (rc == 2 and len(said) != 1):
                bad.append((label, args[0], rc, err.strip()[-200:]))
    assert bad == [], bad[:5]
