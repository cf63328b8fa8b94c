"""Where a GPU-timed stage's cost goes, on a real GPU (diagnostic for issue 2's event targets).

    MAXINSTR_TIME_DRIVER=1 python benchmarks/event_diag.py [--json out.json]

1. Driver patterns timed in C (`_native._event_diag`): an empty-kernel launch, event records
   (two reused events, or 4096 rotating like the stage pool), launch + record, plus the query
   and elapsed-time calls resolution makes; host ns per iteration to issue, and including the
   final synchronize (a pattern the GPU cannot keep up with shows there). Legacy stream and a
   non-blocking stream.
2. Python loops around a tiny torch launch (`x.add_(1)`), interleaved blocks: bare, stages with
   host clock only (`gpu=False`), stages with GPU events. Each block's time is split into the
   loop (issue) and the final `resolve(block=True)`; with MAXINSTR_TIME_DRIVER=1 the host time
   inside each driver call of the hot path is read from `stats()["driver_time_ns"]`.
3. The decode-like step of benchmarks/stage_overhead.py (20 tiny launches, step > attn, mlp),
   with GPU timing on all three stages, on the outer stage only, and host clock only.

Blocks rotate through benchmarks/harness.interleave; each block times itself (issue, then the
final resolve) around the variant's own loop, as written here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from harness import interleave


def _blocks(variants: dict, rounds: int, block: int, after=None) -> dict[str, dict[str, float]]:
    from maxinstr import _native

    drv: dict[str, dict[str, float]] = {k: {} for k in variants}
    for f in variants.values():
        f(200)
        _native.resolve(block=True)
        _native.drain()

    def timed_block(k: str, _round: int) -> tuple[float, float]:
        """(issue ns, total ns) per iteration of one block of variant k."""
        before = _native.stats()
        t0 = time.perf_counter_ns()
        variants[k](block)
        t1 = time.perf_counter_ns()
        if after:
            after()
        _native.resolve(block=True)
        _native.drain()
        t2 = time.perf_counter_ns()
        a = _native.stats()
        for key in ("events_recorded", "event_queries", "event_elapsed_calls", "event_elapsed_async"):
            drv[k][key] = drv[k].get(key, 0.0) + (a.get(key, 0) - before.get(key, 0)) / (block * rounds)
        for key, v in (a.get("driver_time_ns") or {}).items():
            drv[k]["ns " + key] = drv[k].get("ns " + key, 0.0) + (
                v - (before.get("driver_time_ns") or {}).get(key, 0)) / (block * rounds)
        return (t1 - t0) / block, (t2 - t0) / block

    blocks = interleave(list(variants), rounds, timed_block)
    issue = {k: [b[0] for b in v] for k, v in blocks.items()}
    total = {k: [b[1] for b in v] for k, v in blocks.items()}
    return {k: {"issue_ns": statistics.median(issue[k]), "total_ns": statistics.median(total[k]), **drv[k]}
            for k in variants}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args(argv)
    import torch

    from maxinstr import _native

    if not hasattr(_native, "_event_diag"):
        print("maxinstr._native was built without the benchmark probes: pip install "
              "--config-settings=cmake.define.MAXINSTR_BENCH_PROBES=ON . (benchmarks/device/run_all.sh does)",
              file=sys.stderr)
        return 2
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    _native._configure_events(gpu_budget=0)  # every stage GPU-timed: the per-event cost is the subject
    out: dict = {"driver_timed": "driver_time_ns" in _native.stats()}
    st = _native.stage
    with st("probe"):
        pass
    _native.resolve(block=True)
    _native.drain()

    print("1. driver patterns timed in C, ns per iteration (issue / with the final sync)")
    s = torch.cuda.Stream()
    for label, handle in (("legacy stream", 0), ("non-blocking stream", s.cuda_stream)):
        d = _native._event_diag(n=4000, stream=handle)
        out[f"c {label}"] = d
        print(f"  {label}:")
        for k, v in d.items():
            print(f"    {k:<52}{v['issue_ns']:9.0f} {v['total_ns']:9.0f}")

    x = torch.zeros(256, device="cuda")
    print(f"\n2. python loops, torch add_ on stream {torch.cuda.current_stream().cuda_stream}, ns per iteration")

    def bare(n):
        for _ in range(n):
            x.add_(1.0)

    def host(n):
        for _ in range(n):
            with st("x", gpu=False):
                x.add_(1.0)

    def gpu(n):
        for _ in range(n):
            with st("x"):
                x.add_(1.0)

    def gpu_empty(n):
        for _ in range(n):
            with st("x"):
                pass

    def gpu_empty_2ev(n):
        old = _native._configure_events()["share_ns"]
        _native._configure_events(share_ns=0)
        try:
            gpu_empty(n)
        finally:
            _native._configure_events(share_ns=old)

    res = _blocks({"bare launch": bare, "stage gpu=False + launch": host, "stage GPU + launch": gpu,
                   "stage GPU, empty, 2 events": gpu_empty_2ev}, a.rounds, 2000, torch.cuda.synchronize)
    out["python"] = res
    for k, v in res.items():
        extra = "  ".join(f"{kk} {vv:.2f}" if not kk.startswith("ns ") else f"{kk[3:]} {vv:.0f} ns"
                          for kk, vv in v.items() if kk not in ("issue_ns", "total_ns"))
        print(f"  {k:<30} issue {v['issue_ns']:7.0f}  total {v['total_ns']:7.0f}   per stage: {extra}")

    print("\n3. decode-like step (20 launches, step > attn, mlp), us per step")

    def step(outer_gpu, inner_gpu):
        def f(n):
            for _ in range(n):
                with st("step", gpu=outer_gpu):
                    with st("attn", gpu=inner_gpu):
                        for _ in range(10):
                            x.add_(1.0)
                    with st("mlp", gpu=inner_gpu):
                        for _ in range(10):
                            x.add_(1.0)
                torch.cuda.synchronize()
        return f

    def bare_step(n):
        for _ in range(n):
            for _ in range(20):
                x.add_(1.0)
            torch.cuda.synchronize()

    res3 = _blocks({"bare": bare_step, "host clock only": step(False, False), "GPU on outer only": step(None, False),
                    "GPU on all 3": step(None, None)}, a.rounds * 3, 20)
    out["step"] = res3
    b = res3["bare"]["total_ns"]
    for k, v in res3.items():
        print(f"  {k:<22} {v['total_ns'] / 1000:8.1f} us  {100 * (v['total_ns'] / b - 1):+6.1f} %   events/step "
              f"{v.get('events_recorded', 0):.2f}")
    out["stats"] = _native.stats()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
