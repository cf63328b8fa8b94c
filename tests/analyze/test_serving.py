"""The serving loop of a real `max serve` run (tests/data/max/serve_cpu: the API server's part and
MAX's model worker's, PROVENANCE-extra.md): steps, contexts, tokens and each request's queueing,
checked against the records read another way (plain Python over maxinstr.load's rows)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import maxinstr
from maxinstr.analyze.serving import serving_summary
from maxinstr.render.serving import serving_text

RUN = Path(__file__).resolve().parents[1] / "data" / "max" / "serve_cpu"
REQUESTS, TOKENS, MAX_BATCH = 12, 6, 4


@pytest.fixture(scope="module")
def run():
    return maxinstr.load(RUN)


def _rows(run, name):
    names = run.stage_names()
    return [(int(s["id"]), int(s["host_start_ns"]), int(s["host_end_ns"]), run.attrs.get(int(s["id"]), {}))
            for s, n in zip(run.stages, names) if n == name]


def test_every_token_was_made_by_a_step_that_had_its_context(run):
    summary = serving_summary(run)
    steps = summary["steps"]
    assert set(steps) == {"prefill", "decode"}  # the CPU pipeline: no drain steps
    made = sum(a["batch"] for name in ("prefill", "decode") for _, _, _, a in _rows(run, name))
    assert made == REQUESTS * TOKENS  # one token for each context of each step
    assert sum(a["new"] for _, _, _, a in _rows(run, "prefill")) == REQUESTS  # each request starts once
    assert steps["prefill"]["n"] == len(_rows(run, "prefill")) and steps["decode"]["n"] == len(_rows(run, "decode"))
    assert steps["decode"]["batch"]["max"] <= MAX_BATCH and steps["prefill"]["batch"]["max"] <= MAX_BATCH
    host = sorted(e - s for _, s, e, _ in _rows(run, "decode"))
    assert steps["decode"]["host_ns"]["median"] == pytest.approx(float(np.median(host)))
    assert summary["tokenize_ns"]["n"] == REQUESTS


def test_each_request_s_wait_is_its_mark_to_its_first_prefill(run):
    queued = {a["request"]: s for _, s, _, a in _rows(run, "queued")}
    assert len(queued) == REQUESTS
    first: dict[str, int] = {}
    for _, s, _, a in sorted(_rows(run, "prefill"), key=lambda r: r[1]):
        for rid in a["requests"].split(","):
            first.setdefault(rid, s)
    waits = sorted(first[r] - t for r, t in queued.items())
    assert all(w > 0 for w in waits)  # the worker never starts a request before the server queued it
    q = serving_summary(run)["queue"]
    assert q["requests"] == q["started"] == REQUESTS and q["not_started"] == 0
    assert q["wait_ns"]["median"] == pytest.approx(float(np.median(waits)))
    assert q["wait_ns"]["max"] == waits[-1]


def test_a_window_keeps_only_its_span(run):
    window = json.loads((RUN / "server.json").read_text())["windows"][0]
    inside = serving_summary(run, window["host_start_ns"], window["host_end_ns"])
    assert inside["queue"]["requests"] == REQUESTS  # the load ran inside the window
    assert inside["steps"]["prefill"]["n"] == len(_rows(run, "prefill"))
    # a span before the load (the server starting): no steps, no requests, and the lines say so
    before = serving_summary(run, 0, window["host_start_ns"] - 1)
    assert before["steps"] == {} and before["queue"]["requests"] == 0
    assert serving_text(before)[0].startswith("serving loop: no prefill, decode or queued records in this span")
    text = "\n".join(serving_text(inside))
    assert f"queueing before the first step ({REQUESTS} of {REQUESTS} requests)" in text
    assert "prefill" in text and "decode" in text and "contexts/step" in text
