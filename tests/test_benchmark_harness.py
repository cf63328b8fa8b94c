"""benchmarks/harness.py, the parts every benchmark leans on: rotation of configurations over
rounds, ratios against a baseline of the same run, the RESULT-line protocol, and a child's
time limit and peak RSS (real child processes; Linux: os.wait4, process groups)."""

from __future__ import annotations

import importlib.util
import math
import statistics
import sys
import textwrap
import time
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "benchmarks" / "harness.py"


def _load():
    # the benchmarks are scripts, not a package: loaded from the file, as the scripts import it
    spec = importlib.util.spec_from_file_location("benchmark_harness", HARNESS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


h = _load()


def test_rotation_puts_every_name_in_every_position():
    names = ["bare", "default", "kernels", "nsys"]
    orders = [h.rotated(names, r) for r in range(len(names))]
    assert orders[0] == names
    assert orders[1] == ["default", "kernels", "nsys", "bare"]
    for position in range(len(names)):
        assert sorted(o[position] for o in orders) == sorted(names)
    assert h.rotated(names, 5) == orders[1]
    assert h.rotated([], 3) == []


def test_interleave_runs_each_round_in_its_rotated_order():
    calls: list[tuple[str, int]] = []

    def measure(name: str, r: int) -> float:
        calls.append((name, r))
        return 10.0 * r + len(name)

    got = h.interleave(["a", "bb", "ccc"], 3, measure)
    assert [n for n, _ in calls] == ["a", "bb", "ccc", "bb", "ccc", "a", "ccc", "a", "bb"]
    assert [r for _, r in calls] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # samples per name, in round order whatever the position in the round
    assert got == {"a": [1.0, 11.0, 21.0], "bb": [2.0, 12.0, 22.0], "ccc": [3.0, 13.0, 23.0]}


def test_interleave_takes_another_order():
    seen: list[list[str]] = []

    def reverse(names, r):
        seen.append(list(names))
        return list(reversed(names))

    calls: list[str] = []
    h.interleave(["x", "y"], 2, lambda n, r: calls.append(n), order=reverse)
    assert calls == ["y", "x", "y", "x"]
    assert seen == [["x", "y"], ["x", "y"]]


def test_ratio_pairs_rounds_and_skips_missing_ones():
    base = [100.0, 200.0, None, 100.0]
    vals = [110.0, 220.0, 500.0, None]
    r = h.ratio(vals, base)
    assert r.per_round == pytest.approx([1.1, 1.1])  # rounds 3 and 4 lack one side
    assert r.median == pytest.approx(1.1)
    assert r.of_medians == pytest.approx(statistics.median([110, 220, 500]) / statistics.median([100, 200, 100]))


def test_ratios_divide_by_the_same_rounds_baseline():
    r = h.ratios({"bare": [100.0, 300.0], "x": [150.0, 300.0]}, "bare")
    assert r["bare"].per_round == [1.0, 1.0] and r["bare"].median == 1.0
    assert r["x"].per_round == [1.5, 1.0]
    assert r["x"].median == 1.25  # median of the per-round ratios
    assert r["x"].of_medians == 225.0 / 200.0  # ratio of the medians


def test_ratio_of_nothing_is_nan():
    r = h.ratio([None, 1.0], [2.0, 0.0])
    assert r.per_round == [] and math.isnan(r.median)
    assert r.of_medians == 1.0  # median of [1.0] over the median of [2.0, 0.0]
    assert math.isnan(h.ratio([], []).of_medians)


def test_stats_deciles_match_statistics_quantiles():
    xs = [float(x) for x in range(1, 101)]
    s = h.Stats.of(reversed(xs))
    q = statistics.quantiles(xs, n=10)
    assert (s.n, s.median, s.min, s.max, s.mean) == (100, 50.5, 1.0, 100.0, 50.5)
    assert (s.p10, s.p90) == (q[0], q[-1])
    one = h.Stats.of([7])
    assert one.p10 == one.p90 == one.median == 7.0
    with pytest.raises(ValueError):
        h.Stats.of([])


def test_block_ns_divides_by_the_callers_iterations():
    def loop(n):
        time.sleep(0.02)

    ns = h.block_ns(loop, 1000, gc_off=True)
    assert 15_000 <= ns <= 2_000_000  # 20 ms over 1000 iterations
    import gc

    assert gc.isenabled()


def test_time_calls_ns_warms_up_untimed():
    calls = []
    times = h.time_calls_ns(lambda: calls.append(1), 5, warmup=3)
    assert len(times) == 5 and len(calls) == 8
    assert all(isinstance(t, int) and t >= 0 for t in times)


def test_parse_result_takes_the_last_result_line():
    out = 'starting\nRESULT {"a": 1}\nnoise RESULT {"x": 0}\nRESULT {"a": 2, "b": [1, 2]}\ndone\n'
    assert h.parse_result(out) == {"a": 2, "b": [1, 2]}
    assert h.parse_result("no result here\n{\"a\": 1}\n") is None
    with pytest.raises(ValueError):
        h.parse_result("RESULT {not json\n")
    with pytest.raises(ValueError):
        h.parse_result("RESULT [1, 2]\n")


def _child(code: str, **kw):
    return h.run_child([sys.executable, "-c", textwrap.dedent(code)], **kw)


def test_child_result_round_trip_wall_and_peak_rss():
    # run from benchmarks/, which `python -c` puts first on the path, as a benchmark's child has it
    run = _child("""
        import sys
        from harness import emit_result
        block = bytearray(200 * 2**20)  # touched: 200 MB resident
        print("a line before")
        emit_result({"rows": 3, "name": "x"})
        print("to stderr", file=sys.stderr)
    """, cwd=HARNESS.parent)
    assert run.ok, run.error
    assert run.rc == 0 and not run.timed_out
    assert run.result == {"rows": 3, "name": "x"}
    assert "a line before" in run.stdout and run.stderr == "to stderr\n"
    assert run.peak_rss_mb >= 200
    assert 0 < run.wall_s < 30 and run.cpu_s > 0


def test_child_failure_is_reported_with_its_last_line():
    run = _child("import sys; print('RESULT {\"partial\": 1}'); sys.exit('it broke: bad input')")
    assert not run.ok and run.rc == 1
    assert run.error == "exit 1: it broke: bad input"
    assert run.result == {"partial": 1}  # what it said before failing is kept
    bad = _child("print('RESULT {oops')")
    assert bad.rc == 0 and bad.result is None and bad.error.startswith("bad RESULT line")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie has exited, its parent gone


def test_child_past_its_time_limit_is_killed_with_its_children_and_reported():
    # the child starts a grandchild that holds stdout open and would outlive it: a pipe read
    # would wait for the grandchild; the whole process group is killed at the limit instead
    t0 = time.perf_counter()
    run = _child("""
        import subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print("grandchild", p.pid, flush=True)
        time.sleep(60)
    """, limit_s=1.0)
    took = time.perf_counter() - t0
    assert run.timed_out and run.rc is None
    assert run.error == "no result within 1 s (killed)"
    assert 0.9 <= run.wall_s < 10 and took < 10
    grandchild = int(run.stdout.split()[1])
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_child_within_its_limit_is_not_killed():
    run = _child("from time import sleep; sleep(0.2); print('RESULT {\"ok\": true}')", limit_s=20)
    assert run.ok and not run.timed_out and run.result == {"ok": True}


def test_table_pads_columns_and_prints_missing_as_dash():
    text = h.format_table(["mode", "us", "x bare"], [["bare", 12.345, 1.0], ["kernels", 1234.5, None],
                                                    ["nsys", float("nan"), 1.25]], ["", ".1f", ".3f"])
    assert text.splitlines() == [
        "mode         us  x bare",
        "bare       12.3   1.000",
        "kernels  1234.5       -",
        "nsys          -   1.250",
    ]


def test_bootstrap_interval_holds_the_median_and_narrows_with_agreeing_rounds():
    wide = [1.00, 1.30, 0.95, 1.25, 1.02, 1.40, 0.90, 1.10]
    lo, hi = h.bootstrap_ci(wide)
    assert lo <= statistics.median(wide) <= hi and hi - lo > 0.05
    tight = [1.010, 1.012, 1.009, 1.011, 1.010, 1.013, 1.008, 1.011]
    tlo, thi = h.bootstrap_ci(tight)
    assert thi - tlo < 0.005 and h.bootstrap_ci(tight) == (tlo, thi)  # seeded: repeatable
    assert all(map(math.isnan, h.bootstrap_ci([1.0])))


def test_verdict_is_undecided_while_the_interval_straddles_the_target():
    assert h.verdict("x", [1.010, 1.012, 1.009, 1.011, 1.010, 1.013], 1.02).status == "met"
    assert h.verdict("x", [1.10, 1.12, 1.09, 1.11, 1.10, 1.13], 1.02).status == "missed"
    v = h.verdict("x", [0.95, 1.30, 0.90, 1.25, 1.00, 1.35], 1.02)
    assert v.status == "undecided" and v.lo < 1.02 < v.hi
    assert "UNDECIDED" in v.line() and "target <= 1.020" in v.line()


def test_a_lower_bound_verdict():
    assert h.verdict("tok/s", [0.95, 0.96, 0.94, 0.95, 0.97, 0.95], 0.90, at_least=True).status == "met"
    assert h.verdict("tok/s", [0.60, 0.62, 0.65, 0.61, 0.66, 0.63], 0.90, at_least=True).status == "missed"
    v = h.verdict("tok/s", [0.80, 1.00, 0.82, 0.99, 0.85, 0.98], 0.90, at_least=True)
    assert v.status == "undecided" and "target >= 0.900" in v.line()
