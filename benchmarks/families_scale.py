"""Kernel families of a million ops (the real cs336 nsys fixture's 17,032 kernels tiled), given as
the report gives them: ids into the trace's string table. The time that was a unit test's limit
(tests/analyze/test_families.py::test_scale_one_million_ops_from_a_real_fixture, 10 s: the test
now counts the pattern runs instead).

    PYTHONPATH=src python benchmarks/families_scale.py [--ops 1000000] [--rounds 7]

Cases, interleaved round by round in a rotated order, each as ns per op:

- ``maxinstr``: ``families.classify_id_codes(ids, strings)``, the patterns once per distinct name;
- ``per-op patterns`` (peer): ``classify_one`` on every op, what classifying without the string
  table costs (timed on the first --per-op-sample ops: at ~us per op a million takes seconds);
- ``np.unique(ids)`` (peer): numpy's sort-based distinct ids alone, a floor for any dedup.

Target, read off per-round ratios: maxinstr <= 1e-3x per-op patterns (the patterns run per distinct
name, not per op: 56 of 1,000,000 here). The ratio to np.unique(ids) is printed beside it: the
patterns' 56 runs, not the dedup, are most of maxinstr's time.
"""

from __future__ import annotations

import argparse
import sqlite3
import time
from pathlib import Path

import numpy as np

from harness import interleave, load_average, print_table, ratios, verdict
from maxinstr.analyze.families import classify_id_codes, classify_one

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "nsys" / "cs336_two_threads_nsys2025.1.sqlite"


def fixture_names(path: Path) -> np.ndarray:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                           "JOIN StringIds s ON s.id = COALESCE(k.demangledName, k.shortName)").fetchall()
    finally:
        con.close()
    return np.array([r[0] for r in rows], dtype=object)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--per-op-sample", type=int, default=2_000)
    args = ap.parse_args()

    names = fixture_names(FIXTURE)
    strings, fixture_ids = np.unique(names, return_inverse=True)
    ids = np.tile(fixture_ids.reshape(-1), args.ops // len(names) + 1)[:args.ops]
    sample = [str(strings[i]) for i in ids[:args.per_op_sample]]
    print(f"{args.ops:,} ops, {len(strings)} distinct names, from {FIXTURE.name}; {load_average()}", flush=True)

    def run_maxinstr() -> int:
        return len(classify_id_codes(ids, strings))

    def run_per_op() -> int:
        return len([classify_one(s) for s in sample])

    def run_unique() -> int:
        return len(np.unique(ids))

    cases = {"maxinstr": (run_maxinstr, args.ops), "per-op patterns": (run_per_op, len(sample)),
             "np.unique(ids)": (run_unique, args.ops)}

    def measure(name: str, _round: int) -> float:
        fn, n = cases[name]
        t0 = time.perf_counter_ns()
        fn()
        return (time.perf_counter_ns() - t0) / n

    samples = interleave(list(cases), args.rounds, measure)
    rows = []
    for name, xs in samples.items():
        med = float(np.median(xs))
        rows.append((name, med, med * args.ops / 1e9))
    print_table(("case", "ns/op (median)", f"s for {args.ops:,} ops"), rows, (None, ".1f", ".3f"))
    print(verdict("maxinstr / per-op patterns", ratios(samples, "per-op patterns")["maxinstr"].per_round,
                  1e-3).line(".1e"), flush=True)
    r = ratios(samples, "np.unique(ids)")["maxinstr"]
    print(f"maxinstr / np.unique(ids): {r.median:.2f} (median of {len(r.per_round)} rounds)", flush=True)


if __name__ == "__main__":
    main()
