"""Session settings that would make maxinstr misbehave are bounded, never obeyed blindly
(issue 20, class 8): ``flush_interval_s=0`` made the flusher spin a core; an infinite one made
its wait raise. Property test over any float (and non-numbers)."""

from __future__ import annotations

import math
import os
import warnings

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import maxinstr
from maxinstr.record import session as sess


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck),
          derandomize=os.environ.get("MAXINSTR_FUZZ_RANDOM") != "1")
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10**6),
                       st.sampled_from([None, "x", "0.5", 0, -0.0, 1e-12])))
def test_flush_interval_is_bounded(value):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = maxinstr.session(None, flush_interval_s=value)
    low, high = sess.FLUSH_INTERVAL_RANGE_S
    assert low <= s.flush_interval_s <= high and not math.isnan(s.flush_interval_s)
    try:
        inside = low <= float(value) <= high
    except (TypeError, ValueError):
        inside = False
    assert inside == (not caught), (value, [str(w.message) for w in caught])
    if inside:
        assert s.flush_interval_s == float(value)


def test_a_zero_interval_session_records_and_closes(native, stage, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with maxinstr.session(tmp_path / "run", sample_hz=0, flush_interval_s=0) as s:
            for i in range(100):
                with stage("work", step=i):
                    pass
    assert s.flush_interval_s == sess.FLUSH_INTERVAL_RANGE_S[0]
    assert ["flush_interval_s=0 is not in" in str(w.message) for w in caught].count(True) == 1
    assert maxinstr.load(tmp_path / "run")["step"].tolist() == list(range(100))
