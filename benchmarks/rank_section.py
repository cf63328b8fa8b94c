"""Cost of the multi-rank analysis (maxinstr.analyze.ranks.rank_section) on synthetic stage
instances: R ranks x steps x S stages, one rank slower at one stage. Prints seconds and
whether that rank was named.

    PYTHONPATH=src python benchmarks/rank_section.py --ranks 8 --steps 6250 --stages 20
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from maxinstr.analyze.instances import StageInstances
from maxinstr.analyze.ranks import rank_section


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6250)
    ap.add_argument("--stages", type=int, default=20)
    a = ap.parse_args()
    R, steps, S = a.ranks, a.steps, a.stages
    n = R * steps * S
    rng = np.random.default_rng(0)
    rank = np.repeat(np.arange(R), steps * S)
    k = np.tile(np.arange(S), R * steps)
    step = np.tile(np.repeat(np.arange(steps), S), R)
    start = (step * S + k) * 1_000_000 + rng.integers(0, 50_000, n)
    slow = R - 1
    dur = 900_000 + rng.integers(0, 20_000, n) + np.where((rank == slow) & (k == S // 2), 300_000, 0)
    none = np.full(n, -1, np.int64)
    inst = StageInstances(
        name=np.array([f"s{x}" for x in range(S)], object)[k], host_start_ns=start.astype(np.int64),
        host_end_ns=(start + dur).astype(np.int64), gpu_event_ns=none, proj_start_ns=none, proj_end_ns=none,
        parent=none, part=rank.astype(np.int64), is_mark=np.zeros(n, bool), warmup=np.zeros(n, bool),
        cold=np.zeros(n, bool))
    inst.key = inst.name
    parts = [{"rank": r, "host": "h", "pid": 100 + r, "rows": steps * S} for r in range(R)]
    t = time.perf_counter()
    sec = rank_section(inst, parts)
    dt = time.perf_counter() - t
    named = [(s["rank"], [x["stage"] for x in s["slowest_in"]]) for s in sec["stragglers"]]
    print(f"{n} instances ({R} ranks x {steps} steps x {S} stages): rank_section {dt:.2f} s; "
          f"stragglers {named} (planted: rank {slow} at s{S // 2})")


if __name__ == "__main__":
    main()
