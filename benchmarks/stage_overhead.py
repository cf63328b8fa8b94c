"""Stage overhead: median ns per enter+exit, maxinstr against what users do today.

    python benchmarks/stage_overhead.py                 # all cases that can run here
    python benchmarks/stage_overhead.py --quick --json out.json

Cases (each skipped when its package or a GPU is missing):
  baseline: empty loop, empty Python context manager
  maxinstr: disabled; ranges + host clock (gpu=False), also with the steady-state trigger armed
            (steady_watch: what a `maxinstr run` capture's warm-up costs); ranges + GPU events (boundary sharing on,
            the default, and off: two events per stage)
  peers:    nvtx-python `annotate` context manager and domain push/pop with cached attributes;
            torch.cuda.nvtx push/pop + a torch.cuda.Event pair; torch.profiler.record_function;
            CuPy Event pair + cupyx.profiler.time_range
Plus perturbation (GPU only): a decode-like step of 20 tiny launches with 3 stages per step,
bare vs maxinstr with every stage GPU-timed (gpu=True) vs torch's nvtx + Event pair per stage vs
plain nvtx.annotate ranges; then, in a second interleaved comparison, bare vs nvtx.annotate ranges
vs maxinstr as it runs by default (gpu=None under the GPU-timing budget: docs/stage-core.md). The per-stage GPU cases use
gpu=True, so every stage records its events whatever the budget.

Numbers are per enter+exit including the loop (`empty loop` row); ratios are against maxinstr
ranges + host clock. NVTX calls are nearly free with no tool attached: run it under nsys too.

Rotation, ratios and the table come from benchmarks/harness.py. The timed loops stay written out
in each case (``for _ in range(n): with st("x"): pass``): a call per iteration would add more than
the ~50 ns some cases cost, so the harness times the one call that runs a case's whole loop
(``block_ns``), and the perturbation's blocks time themselves as before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import platform
import sys
import time
from collections.abc import Callable

from harness import block_ns, interleave, print_table, ratios

Case = Callable[[int], None]


def _median_ns(cases: dict[str, Case], n: int, repeats: int) -> dict[str, float]:
    """Median ns per iteration of each case. The repeats are interleaved (round r runs every case
    once, in a rotated order), so a noisy stretch of the machine hits all cases alike instead of
    inflating the one that happened to run then."""
    for fn in cases.values():
        fn(min(n, 1000))  # warm
    stats = _native_mod().stats
    keys = ("events_recorded", "events_shared", "event_queries", "event_elapsed_calls", "event_elapsed_async",
            "events_dropped")

    def measure(k: str, _round: int) -> float:
        before = stats()  # outside the timed region
        ns = block_ns(cases[k], n, gc_off=True)
        after = stats()
        if "GPU" in k or "launch" in k:
            c = COUNTERS.setdefault(k, dict.fromkeys(keys, 0.0))
            for key in keys:
                c[key] += (after.get(key, 0) - before.get(key, 0)) / (n * repeats)
        return ns

    per = interleave(list(cases), repeats, measure)
    return {k: statistics.median(v) for k, v in per.items()}


COUNTERS: dict[str, dict[str, float]] = {}  # per GPU case: driver work per enter+exit


def _cases() -> tuple[dict[str, Case], dict[str, str], dict]:
    cases: dict[str, Case] = {}
    skipped: dict[str, str] = {}
    ctx: dict = {}

    def empty_loop(n):
        for _ in range(n):
            pass

    class Empty:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    def empty_cm(n):
        for _ in range(n):
            with Empty():
                pass

    cases["empty loop"] = empty_loop
    cases["empty Python context manager"] = empty_cm

    # A context must be current for maxinstr's default GPU timing (it never creates one).
    torch = cupy = None
    try:
        import torch as _torch

        if _torch.cuda.is_available():
            torch = _torch
            torch.zeros(1, device="cuda")
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        skipped["torch"] = f"{type(e).__name__}: {e}"[:80]
    try:
        import cupy as _cupy

        _cupy.zeros(1)
        _cupy.cuda.Device().synchronize()
        cupy = _cupy
    except Exception as e:  # noqa: BLE001
        skipped["cupy"] = f"{type(e).__name__}: {e}"[:80]
    ctx["torch"], ctx["cupy"] = torch, cupy

    from maxinstr import _native

    st = _native.stage

    def mi_disabled(n):
        _native.set_enabled(False)
        try:
            for _ in range(n):
                with st("x"):
                    pass
        finally:
            _native.set_enabled(True)

    def mi_host(n):
        for _ in range(n):
            with st("x", gpu=False):
                pass
        _native.drain()

    def mi_host_watched(n):
        # the steady-state trigger armed (during a `maxinstr run` capture's warm-up): every enter
        # counts its name; a count it never reaches, so it never fires
        _native.steady_watch(1 << 62, lambda *_: None)
        try:
            for _ in range(n):
                with st("x", gpu=False):
                    pass
        finally:
            _native.steady_watch(-1, None)
        _native.drain()

    cases["maxinstr disabled"] = mi_disabled
    cases["maxinstr ranges + host clock"] = mi_host
    if hasattr(_native, "steady_watch"):
        cases["maxinstr ranges + host clock, steady trigger armed"] = mi_host_watched

    # probe GPU timing availability
    with st("probe"):
        pass
    _native.resolve(block=True)
    _native.drain()
    stats = _native.stats()
    ctx["native_stats"] = stats
    if stats["event_pool_size"] > 0:

        def mi_gpu(n):
            for _ in range(n):
                with st("x", gpu=True):
                    pass
            _native.resolve(block=True)
            _native.drain()

        def mi_gpu_noshare(n):
            old = _native._configure_events()["share_ns"]
            _native._configure_events(share_ns=0)
            try:
                mi_gpu(n)
            finally:
                _native._configure_events(share_ns=old)

        cases["maxinstr ranges + GPU events (empty body: all boundaries shared)"] = mi_gpu
        cases["maxinstr ranges + GPU events (2 events/stage)"] = mi_gpu_noshare

        launch = _tiny_launch(torch, cupy)
        if launch is not None:
            # The realistic pattern: sibling stages around work. The exit of one and the enter
            # of the next share an event, the work between enter and exit forces one more: one
            # event per stage. Reported as (stage + launch) - (bare launch), see main().
            def bare_launches(n):
                for _ in range(n):
                    launch()
                _native.resolve(block=True)

            def mi_gpu_launch(n):
                for _ in range(n):
                    with st("x", gpu=True):
                        launch()
                _native.resolve(block=True)
                _native.drain()

            cases["(tiny launch, bare)"] = bare_launches
            cases["(tiny launch inside a GPU-timed stage)"] = mi_gpu_launch
    else:
        skipped["maxinstr GPU events"] = f"no GPU timing here (backend {stats['gpu_backend']})"

    try:
        import nvtx

        def nvtx_annotate(n):
            for _ in range(n):
                with nvtx.annotate("x"):
                    pass

        dom = nvtx.get_domain("bench")
        attr = dom.get_event_attributes(message="x")

        def nvtx_domain(n):
            push, pop = dom.push_range, dom.pop_range
            for _ in range(n):
                push(attr)
                pop()

        cases["nvtx.annotate context manager"] = nvtx_annotate
        cases["nvtx domain push/pop, cached attrs"] = nvtx_domain
    except ImportError as e:
        skipped["nvtx"] = str(e)[:80]

    if torch is not None:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        push, pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop

        def torch_nvtx_events(n):
            for _ in range(n):
                push("x")
                e0.record()
                e1.record()
                pop()
            torch.cuda.synchronize()

        def torch_record_function(n):
            rf = torch.profiler.record_function
            for _ in range(n):
                with rf("x"):
                    pass

        cases["torch.cuda.nvtx + Event pair"] = torch_nvtx_events
        cases["torch.profiler.record_function"] = torch_record_function

    if cupy is not None:
        from cupyx.profiler import time_range

        c0, c1 = cupy.cuda.Event(), cupy.cuda.Event()

        def cupy_events_range(n):
            for _ in range(n):
                with time_range("x"):
                    c0.record()
                    c1.record()
            cupy.cuda.Device().synchronize()

        cases["CuPy Event pair + time_range"] = cupy_events_range

    return cases, skipped, ctx


def _tiny_launch(torch, cupy):
    if torch is not None:
        x = torch.zeros(256, device="cuda")
        return lambda: x.add_(1.0)
    if cupy is not None:
        y = cupy.zeros(256, dtype=cupy.float32)
        return lambda: cupy.add(y, 1.0, out=y)
    return None


def perturbation(ctx: dict, steps: int, extra_budgets: tuple[float, ...] = ()) -> dict | None:
    """A decode-like step: 20 tiny launches, 3 stages (step > attn, mlp), synchronised per step.
    Two interleaved comparisons: every stage GPU-timed (and torch's way), then the default."""
    torch, cupy = ctx["torch"], ctx["cupy"]
    from maxinstr import _native

    st = _native.stage
    if torch is not None:
        x = torch.zeros(256, device="cuda")

        def launch():
            x.add_(1.0)

        sync = torch.cuda.synchronize
        lib = "torch"
    elif cupy is not None:
        x = cupy.zeros(256, dtype=cupy.float32)

        def launch():
            x.__iadd__(1.0)

        sync = cupy.cuda.Device().synchronize
        lib = "cupy"
    else:
        return None
    if ctx["native_stats"]["event_pool_size"] <= 0:
        return None

    def bare():
        for _ in range(10):
            launch()
        for _ in range(10):
            launch()
        sync()

    def instrumented(gpu):
        def step():
            with st("step", gpu=gpu):
                with st("attn", gpu=gpu):
                    for _ in range(10):
                        launch()
                with st("mlp", gpu=gpu):
                    for _ in range(10):
                        launch()
            sync()
        return step

    variants = {"bare": bare, "maxinstr, host clock only (gpu=False)": instrumented(False),
                "maxinstr, every stage GPU-timed": instrumented(True)}
    peers: dict = {}  # beside the default too: issue 18's target is the default within 1 point of NVTX ranges
    try:
        import nvtx

        def nvtx_ranges():
            with nvtx.annotate("step", domain="bench"):
                with nvtx.annotate("attn", domain="bench"):
                    for _ in range(10):
                        launch()
                with nvtx.annotate("mlp", domain="bench"):
                    for _ in range(10):
                        launch()
            sync()

        peers["nvtx.annotate ranges (no events)"] = nvtx_ranges
    except ImportError:
        pass
    variants.update(peers)
    if torch is not None:
        push, pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(6)]

        def torch_way():
            push("step")
            ev[0].record()
            push("attn")
            ev[2].record()
            for _ in range(10):
                launch()
            ev[3].record()
            pop()
            push("mlp")
            ev[4].record()
            for _ in range(10):
                launch()
            ev[5].record()
            pop()
            ev[1].record()
            pop()
            sync()

        variants["torch nvtx + Event pairs"] = torch_way
    first = _interleaved(variants, steps)
    # Under the GPU-timing budget (the default, then any others asked for): each comparison
    # starts the budget afresh (the forced stages above spent it)
    old = _native._configure_events()["gpu_budget"]
    budgets = [old if old > 0 else 0.0025] + [b for b in extra_budgets if b > 0]
    under = []
    for b in budgets:
        _native._configure_events(gpu_budget=b)
        before = _native.stats()
        res = _interleaved({"bare": bare, **peers, f"maxinstr, gpu=None, budget {b:g}": instrumented(None)}, steps)
        after = _native.stats()
        res.update(budget=b, events_recorded=after["events_recorded"] - before["events_recorded"],
                   stages_sampled_out=after["gpu_sampled_out"] - before["gpu_sampled_out"])
        under.append(res)
    _native._configure_events(gpu_budget=old)
    return {"lib": lib, "first": first, "under_budget": under}


def _interleaved(variants: dict, steps: int) -> dict:
    """Median us per step of each variant and its overhead against bare: small blocks,
    interleaved in a rotated order, so drift and noisy stretches hit every variant alike; the
    overhead is the median over rounds of (variant / bare of the same round). Each block ends with
    resolve() + drain() inside the timed region, for every variant: reading the GPU times back is
    part of what instrumenting costs (a session's flusher does it with the GIL held). torch's
    variant records its events but never reads them (no elapsed_time calls)."""
    from maxinstr import _native

    for f in variants.values():
        for _ in range(50):
            f()
    block = 10
    resolve, drain = _native.resolve, _native.drain

    def timed_block(k: str, _round: int) -> float:
        f = variants[k]
        t0 = time.perf_counter_ns()
        for _ in range(block):
            f()
        resolve()
        drain()
        return (time.perf_counter_ns() - t0) / block / 1000

    times = interleave(list(variants), max(1, steps // block), timed_block)
    against_bare = ratios(times, "bare")
    return {"step_us": {k: statistics.median(v) for k, v in times.items()},
            "overhead_pct": {k: 100 * (r.median - 1) for k, r in against_bare.items()},
            "overhead_pct_of_medians": {k: 100 * (r.of_medians - 1) for k, r in against_bare.items()}}


def _native_mod():
    from maxinstr import _native

    return _native


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="enter+exit per repeat")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--steps", type=int, default=1000, help="perturbation steps per variant")
    ap.add_argument("--quick", action="store_true", help="n=5000, 5 repeats, 300 steps")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--budgets", default="", help="more GPU-timing budgets to measure the perturbation under, e.g. 0.005")
    a = ap.parse_args(argv)
    if a.quick:
        a.n, a.repeats, a.steps = 5000, 5, 300
    cases, skipped, ctx = _cases()
    res = _median_ns(cases, a.n, a.repeats)
    ref = res["maxinstr ranges + host clock"]
    tool = "nsys" if any(k.startswith("NSYS") for k in os.environ) or "NVTX_INJECTION64_PATH" in os.environ else "none"
    print(f"stage overhead, median ns per enter+exit ({a.n} x {a.repeats}), tool attached: {tool}")
    print(f"python {platform.python_version()}, {platform.machine()}, maxinstr backend "
          f"{ctx['native_stats']['gpu_backend']}, markers {ctx['native_stats']['markers']}")
    if "(tiny launch, bare)" in res:
        cost = res.pop("(tiny launch inside a GPU-timed stage)") - res.pop("(tiny launch, bare)")
        at = list(res).index("maxinstr ranges + GPU events (2 events/stage)") + 1
        items = list(res.items())
        items.insert(at, ("maxinstr ranges + GPU events around work (1 event/stage)", cost))
        res = dict(items)
    w = max(len(k) for k in res) + 2
    print_table(["case", "ns", "x maxinstr host"], [[k, v, v / ref] for k, v in res.items()], ["", ".0f", ".2f"])
    for k, why in skipped.items():
        print(f"skipped {k}: {why}")
    if COUNTERS:
        print("\nper enter+exit (GPU cases): events recorded / shared, event queries, elapsed-time calls inline"
              " / on the placer thread, dropped")
        for k, c in COUNTERS.items():
            print(f"  {k:<{w}}{c['events_recorded']:6.2f} /{c['events_shared']:5.2f}  {c['event_queries']:6.3f}"
                  f"  {c['event_elapsed_calls']:6.3f} /{c['event_elapsed_async']:6.3f}  {c['events_dropped']:6.3f}")
    driver = None
    if ctx["native_stats"]["event_pool_size"] > 0 and hasattr(_native_mod(), "_driver_costs"):
        # Where a GPU-timed stage's time goes: the driver calls it makes, timed in C.
        driver = _native_mod()._driver_costs()
        print("\ndriver calls, ns each (timed in C, legacy stream): "
              + ", ".join(f"{k} {v:.0f}" for k, v in driver.items()))
        st = _native_mod().stats()
        print(f"GPU floor taken out of stage times: {st.get('gpu_floor_ns')} ns ({st.get('gpu_floor')}); "
              f"resolution so far: {st.get('event_queries')} queries, {st.get('event_elapsed_calls')} elapsed-time "
              f"calls for {st.get('events_recorded')} events recorded, {st.get('events_shared')} shared")
    pert = perturbation(ctx, a.steps, tuple(float(x) for x in a.budgets.split(",") if x))
    if pert:
        print(f"\nperturbation ({pert['lib']}, 20 tiny launches, 3 stages/step, median us/step; overhead = "
              "median over interleaved rounds of variant/bare):")
        for part in [pert["first"]] + pert["under_budget"]:
            for k, v in part["step_us"].items():
                print(f"  {k:<40}{v:>9.1f} us  {part['overhead_pct'][k]:+6.1f} %")
            if "budget" in part:
                print(f"    ({part['events_recorded']} events recorded, {part['stages_sampled_out']} stages left "
                      "untimed by the budget)")
    else:
        print("\nperturbation: skipped (needs a GPU with torch or CuPy)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"tool": tool, "n": a.n, "repeats": a.repeats, "ns": res, "skipped": skipped,
                       "perturbation": pert, "driver_ns": driver, "counters_per_stage": COUNTERS,
                       "python": sys.version,
                       "stats": _native_mod().stats()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
