"""Inputs that hold hostile names: run directories and Kineto traces written straight to disk
(the readers are what a user's file goes through), and a hypothesis strategy for the names.

A name is data: it may hold markup of any view (rich's ``[bold]``, ``[/]``, ``[link=...]``,
Markdown, raw HTML), control characters, lone surrogates (``os.fsdecode`` of a non-UTF-8 file
name), or be very long.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from maxinstr.rundir import format as fmt

KNOWN_BAD = [
    "[/]",
    "[pl][profile]Strategy.training_step",
    "[link=https://example.com]click[/link]",
    "[bold red]x",
    "<img src=x onerror=alert(1)>",
    "<script>alert(1)</script>",
    ":smile: :thumbs_up:",
    "a|b|c",
    "`code` ``two``",
    "**bold** _it_ ~~s~~",
    "[text](http://example.com)",
    "![img](http://example.com/x.png)",
    "back\\slash\\",
    "&amp; &lt; &#60;",
    "line\nbreak",
    "tab\there",
    "\x1b[31mred\x1b[0m",
    "\x1b]8;;http://example.com\x1b\\link\x1b]8;;\x1b\\",
    "file-\udcff.bin",
    "nul\x00",
    "\u202eevil",
    "# heading",
    "- item",
    "1. item",
    "</td></tr><tr><td>",
]

_HOSTILE_CHARS = st.sampled_from(list("[]/<>&`|*_\\:#!()~\n\t\r\x00\x1b\x7f\x85\u2028\ud800\udcff\ufeff"))
NAMES = st.one_of(
    st.sampled_from(KNOWN_BAD),
    st.text(alphabet=st.one_of(_HOSTILE_CHARS, st.characters(codec="utf-8")), min_size=1, max_size=24),
)


def write_run(root: Path, names: list[str], *, per_name: int = 4, warmup: int = 1) -> Path:
    """A closed run directory with ``per_name`` top-level instances of each name, each holding
    one child named by the next name (so nesting and keys hold hostile names too)."""
    part = root / "parts" / "p7"
    part.mkdir(parents=True, exist_ok=True)
    n = len(names)
    rows = np.zeros(2 * n * per_name, dtype=fmt.STAGE_DTYPE)
    rows["gpu_start_ns"] = rows["gpu_end_ns"] = -1
    t = 1_000_000
    k = 0
    for rep in range(per_name):
        for i in range(n):
            top, child = k, k + 1
            for col, a, b in (("id", (7 << 32) | (top + 1), (7 << 32) | (child + 1)),
                              ("parent_id", -1, (7 << 32) | (top + 1)),
                              ("depth", 0, 1),
                              ("host_start_ns", t, t + 1_000),
                              ("host_end_ns", t + 10_000 + 100 * i, t + 6_000),
                              ("name_id", i, (i + 1) % n),
                              ("step", rep, rep)):
                rows[col][top], rows[col][child] = a, b
            t += 20_000
            k += 2
    (part / fmt.STAGES_FILE).write_bytes(rows.tobytes())
    (part / fmt.STRINGS_FILE).write_bytes(
        b"".join(json.dumps({"id": i, "s": s}).encode() + b"\n" for i, s in enumerate(names)))
    (part / fmt.PART_FILE).write_text(json.dumps({"pid": 7, "status": "closed", "rows_written": len(rows)}))
    meta = {"format": fmt.FORMAT_NAME, "version": fmt.FORMAT_VERSION, "status": "closed", "warmup": warmup,
            "user": {names[0]: names[-1]}, "command": ["python", names[0]]}
    (root / fmt.META_FILE).write_text(json.dumps(meta))
    return root


def kineto_doc(range_names: list[str], kernel_names: list[str], repeats: int = 3) -> dict:
    """A Kineto trace: each range name is a user_annotation holding one launch of each kernel."""
    events: list[dict] = []
    ts = 1000.0
    corr = 1
    for _ in range(repeats):
        for r in range_names:
            start = ts
            for k in kernel_names:
                events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                               "ts": ts, "dur": 2.0, "args": {"correlation": corr}})
                events.append({"ph": "X", "cat": "kernel", "name": k, "pid": 0, "tid": 7, "ts": ts + 5.0, "dur": 3.0,
                               "args": {"correlation": corr, "stream": 7, "device": 0}})
                corr += 1
                ts += 10.0
            events.append({"ph": "X", "cat": "user_annotation", "name": r, "pid": 1, "tid": 1, "ts": start,
                           "dur": ts - start + 1.0})
            ts += 20.0
    return {"traceEvents": events, "baseTimeNanoseconds": 1_700_000_000_000_000_000}
