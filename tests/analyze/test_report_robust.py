"""The report never crashes on partial inputs: random subsets of a real trace's ranges and ops
(as a truncated or filtered capture would give) still yield a strict-JSON report and views."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxinstr.analyze.report import build_report
from maxinstr.render import json as rjson
from maxinstr.render import markdown, text


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1), keep_ranges=st.floats(0.0, 1.0), keep_ops=st.floats(0.0, 1.0))
def test_random_subsets_of_a_real_trace(trace_of, seed, keep_ranges, keep_ops):
    full = trace_of("nsys/h200_decode.sqlite")
    rng = np.random.default_rng(seed)
    part = dataclasses.replace(
        full,
        ranges=full.ranges.take(rng.random(len(full.ranges)) < keep_ranges),
        ops=full.ops.take(rng.random(len(full.ops)) < keep_ops),
        notes=list(full.notes),
    )
    r = build_report(trace=part)
    doc = json.loads(rjson.render(r))
    assert doc["gpu"]["ops"] == len(part.ops)
    for s in doc["stages"]:
        assert s["instances"] == s["steady"] + s["warmup"] + s["cold_start"] + s["inside_startup"]
    text.render(r)
    markdown.render(r)
