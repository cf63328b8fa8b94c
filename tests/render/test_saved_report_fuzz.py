"""A saved report JSON is data anyone may have edited (issue 29, point 9): re-rendering one whose
fields were replaced by values of another type gave ``TypeError ... (run with --debug)`` in 273
of 1,264 fuzzed cases. Every field of the real saved report replaced by an odd value (another
type, null, a negative or huge number, an empty or long string or list): every view renders, or
the load refuses it in one line naming the file and the field."""
from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxinstr.errors import MaxinstrError
from maxinstr.render import view
from maxinstr.render.json import load

SAVED = Path(__file__).resolve().parents[1] / "data" / "reports" / "h200_kvcache_b16.report.json"
DOC = json.loads(SAVED.read_text())
FORMATS = ("text", "json", "md", "html")  # (perfetto needs the run or trace itself, never a saved report)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            yield from _paths(v, prefix + (i,))


PATHS = [p for p in _paths(DOC) if p and p[0] not in ("schema", "version")]
ODD = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=5),
                st.just("x" * 5000), st.just([]), st.just({}), st.just([1, "a", None]), st.just({"a": [1]}),
                st.just(-1), st.just(10**30))


def _set(doc, path, value):
    target = doc
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck),
          derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1")
@given(where=st.sampled_from(PATHS), value=ODD, fmt=st.sampled_from(FORMATS))
def test_an_edited_saved_report_renders_or_is_one_line(where, value, fmt):
    doc = json.loads(json.dumps(DOC))
    _set(doc, where, value)
    try:
        report = load(json.dumps(doc), "saved.json")  # what `maxinstr report saved.json` reads it with
    except MaxinstrError as exc:
        said = str(exc)
        assert said.startswith("saved.json: ") and "\n" not in said, said
        return
    out = view(fmt).render(report, width=100, color=False)
    assert isinstance(out, str) and out
