"""Kernel names a reader can tell apart, one line each at any width (issue 28 point 7), on the
real kernel names of the H200 captures in tests/data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from maxinstr._text import kernel_label
from maxinstr.analyze.report import build_report
from maxinstr.render import text

DATA = Path(__file__).parents[1] / "data"
TRACES = ["nsys/h200_moe.sqlite", "kineto/h200_torch_decode.pt.trace.json.gz", "max/decoder_nsys.sqlite",
          "nsys/cs336_nsys2026.2.sqlite", "nsys/h200_kvcache.sqlite"]


@pytest.fixture(scope="module")
def real_names() -> list[str]:
    from maxinstr.traces import open_trace

    names: set[str] = set()
    for rel in TRACES:
        t = open_trace(DATA / rel)
        strings = np.asarray(t.strings, dtype=object)
        names |= {str(strings[i]) for i in np.unique(t.ops.name_id) if i >= 0}
    return sorted(names)


def test_labels_keep_what_tells_kernels_apart(real_names):
    labels = {n: kernel_label(n) for n in real_names}
    assert len(set(labels.values())) >= len(real_names) - 3  # (a template and its overload spelled twice)
    for name, label in labels.items():
        assert not label.startswith("void ") and "::" not in label.split("<")[0], (name, label)
        assert len(label) <= len(name)
    cutlass = next(n for n in real_names if n.startswith("void cutlass::device_kernel<"))
    assert kernel_label(cutlass).startswith("GemmUniversal<GroupProblemShape<tuple<int, int, int>>, CollectiveMma<")
    norm = next(n for n in real_names if "vectorized_layer_norm_kernel" in n)
    assert kernel_label(norm) == "vectorized_layer_norm_kernel<BFloat16, float, true>"
    topk = next(n for n in real_names if "sbtopk::gatherTopK" in n)
    assert kernel_label(topk) == "gatherTopK<BFloat16, unsigned int, 2, 0>"
    # names that are no C++ signature stay whole
    copy = next(n for n in real_names if n.startswith("Memcpy"))
    assert kernel_label(copy) == copy


@pytest.fixture(scope="module")
def moe():
    return build_report(DATA / "nsys/h200_moe-run", DATA / "nsys/h200_moe.sqlite")


def _table(out: str, title: str) -> list[str]:
    """The rows of the table under ``title`` and of its continuation tables."""
    lines = out.splitlines()
    rows = []
    for at in [i for i, ln in enumerate(lines) if ln.startswith(title)]:
        end = next(i for i in range(at, len(lines)) if lines[i].startswith("└"))
        rows += [ln for ln in lines[at:end] if ln.startswith("│")]
    return rows


@pytest.mark.parametrize("width", [80, 120, 200])
def test_one_line_a_kernel_at_any_width(moe, width):
    out = text.render(moe, width=width)
    rows = _table(out, "Top kernels (")
    assert len(rows) == 10 and all(r.split("│")[1].strip() for r in rows)  # no continuation lines
    assert max(len(ln) for ln in out.splitlines()) <= width
    shown = [r.split("│")[1].strip() for r in rows]
    assert shown[0].startswith("GemmUniversal") and len(set(shown)) == 10
    longest = max(len(s) for s in shown)
    if width == 200:  # the room there is used: not cut at ~80 characters
        assert longest > 120
    assert any(s.endswith("…") for s in shown)
    ranked = _table(out, "Where the time goes")
    top = [c.strip() for r in ranked for c in r.split("│") if c.strip().startswith("34% ")]
    assert top and top[0].startswith("34% GemmUniversal")  # not "34% void cutlass::device_kern…"
