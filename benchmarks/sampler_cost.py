"""Sampler cost: how much does the background sampler slow the program it watches?

Throughput of (a) a GIL-bound pure-Python loop and (b) a decode-like GPU loop (small matmuls
and a sync per step; needs torch and a GPU) with the sampler off and at 10, 100 and 1000 Hz,
in one run. Configurations are interleaved round by round and the median of the per-round
ratios is reported, so drift of a shared machine affects them alike. Target: <= 1% at 100 Hz.

Modes (``--modes``, each run in turn; ``MAXINSTR_SAMPLER_GIL``): ``process`` (the default: the
sampler in a child process), ``auto`` and ``release`` (a sampler thread in this process; see
docs/sampler.md).

Devices the sampler reads (``--device``):
  real       the machine's GPUs through NVML / AMD SMI (the true number; the default with a GPU)
  fake-nvml  the real pynvml Python code over a tiny C stand-in for libnvidia-ml that spins for
             ``--spin-ns`` in each call with the GIL released, as the driver does (the H200 measured
             ~1.7-8 us per NVML call; see /work/shared/device/overheads.txt). Needs a C compiler.
  null       a device that reads nothing: the thread, row packing and write alone

    python benchmarks/sampler_cost.py                      # auto: real with a GPU, else fake-nvml
    python benchmarks/sampler_cost.py --device null --seconds 0.5 --rounds 5 --json out.json

It imports the installed maxinstr (the device runs one built into PYTHONPATH); from a checkout
without installing it: PYTHONPATH=src python benchmarks/sampler_cost.py ...
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness import interleave, ratio
from maxinstr.sample import open_backend, start_sampler
from maxinstr.sample.base import ErrorLog, NullBackend
from maxinstr.sample.nvml import NVML_LIB_ENV
from maxinstr.sample.writer import clock_ns

RATES_HZ = (10, 100, 1000)

FAKE_NVML_C = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static long spin_ns = -1;
/* one function may be made slow (like the H200's millisecond call): FAKE_NVML_SLOW_FN /
   FAKE_NVML_SLOW_NS, or fake_set_slow() at any time (tests) */
static char slow_fn[64] = "";
static long slow_ns = -1;
void fake_set_slow(const char *fn, long ns) { strncpy(slow_fn, fn, sizeof slow_fn - 1); slow_ns = ns; }
static void spin_named(const char *fn) {
  if (spin_ns < 0) { const char *e = getenv("FAKE_NVML_SPIN_NS"); spin_ns = e ? atol(e) : 2000; }
  if (slow_ns < 0) {
    const char *f = getenv("FAKE_NVML_SLOW_FN"), *n = getenv("FAKE_NVML_SLOW_NS");
    if (f && n) fake_set_slow(f, atol(n)); else slow_ns = 0;
  }
  long ns = (slow_fn[0] && strcmp(fn, slow_fn) == 0) ? slow_ns : spin_ns;
  struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a);
  do { clock_gettime(CLOCK_MONOTONIC, &b); } while ((b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec) < ns);
}
#define spin() spin_named(__func__)
typedef struct { unsigned gpu, memory; } util_t;
typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { unsigned version, supported; } gpm_support_t;
typedef struct { const char *s, *l, *u; } metric_info_t;
typedef struct { unsigned id; int ret; double value; metric_info_t info; } gpm_metric_t;
typedef struct { unsigned version, n; void *s1, *s2; gpm_metric_t m[477]; } gpm_get_t;
int nvmlInitWithFlags(unsigned f) { return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { return "fake"; }
int nvmlSystemGetDriverVersion(char *b, unsigned n) { strncpy(b, "fake-nvml", n); return 0; }
int nvmlSystemGetCudaDriverVersion(int *v) { *v = 13000; return 0; }
int nvmlDeviceGetCount_v2(unsigned *c) { *c = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **d) { *d = (void *)(uintptr_t)(0x1000 + i); return 0; }
int nvmlDeviceGetUUID(void *d, char *b, unsigned n) { strncpy(b, "GPU-fa4e0000-0000-0000-0000-000000000000", n); return 0; }
int nvmlDeviceGetName(void *d, char *b, unsigned n) { strncpy(b, "fake NVML device", n); return 0; }
int nvmlDeviceGetMaxClockInfo(void *d, int t, unsigned *c) { *c = 1980; return 0; }
int nvmlDeviceGetEnforcedPowerLimit(void *d, unsigned *p) { *p = 700000; return 0; }
int nvmlDeviceGetUtilizationRates(void *d, util_t *u) { spin(); u->gpu = 50; u->memory = 20; return 0; }
int nvmlDeviceGetMemoryInfo(void *d, mem_t *m) { spin(); m->total = 1ULL << 37; m->used = 1ULL << 30; m->free = m->total - m->used; return 0; }
int nvmlDeviceGetClockInfo(void *d, int t, unsigned *c) { spin(); *c = 1500; return 0; }
static int power_ret = -1;  /* FAKE_NVML_POWER_RET: the status nvmlDeviceGetPowerUsage returns (tests) */
int nvmlDeviceGetPowerUsage(void *d, unsigned *p) {
  if (power_ret < 0) { const char *e = getenv("FAKE_NVML_POWER_RET"); power_ret = e ? atoi(e) : 0; }
  spin(); *p = 300000; return power_ret;
}
int nvmlDeviceGetTotalEnergyConsumption(void *d, unsigned long long *e) { spin(); *e = 123456789ULL; return 0; }
int nvmlDeviceGetCurrentClocksEventReasons(void *d, unsigned long long *r) { spin(); *r = 0; return 0; }
int nvmlDeviceGetTemperature(void *d, int s, unsigned *t) { spin(); *t = 40; return 0; }
int nvmlDeviceGetComputeRunningProcesses_v3(void *d, unsigned *c, void *p) { spin(); *c = 0; return 0; }
int nvmlGpmQueryDeviceSupport(void *d, gpm_support_t *s) { s->supported = 1; return 0; }
int nvmlGpmSampleAlloc(void **s) { *s = malloc(64); return 0; }
int nvmlGpmSampleFree(void *s) { free(s); return 0; }
int nvmlGpmSampleGet(void *d, void *s) { spin(); return 0; }
int nvmlGpmMetricsGet(gpm_get_t *g) { spin(); for (unsigned i = 0; i < g->n; i++) { g->m[i].ret = 0; g->m[i].value = 42.0; } return 0; }
"""


# --------------------------------------------------------------------------- devices
def fake_nvml_backend(errors: ErrorLog, lib_path: Path, interval_s: float):
    import pynvml

    from maxinstr.sample import nvml

    pynvml.nvmlLib = ctypes.CDLL(str(lib_path))  # pynvml loads nothing else once this is set
    pynvml._nvmlGetFunctionPointer_cache.clear()
    return nvml.NvmlBackend(errors, nv=pynvml, env={}, interval_s=interval_s)


def build_fake_nvml(spin_ns: int) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    tmp = Path(tempfile.mkdtemp(prefix="fake-nvml-"))
    (tmp / "fake_nvml.c").write_text(FAKE_NVML_C)
    lib = tmp / "libfake-nvml.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(tmp / "fake_nvml.c")], check=True)
    os.environ["FAKE_NVML_SPIN_NS"] = str(spin_ns)
    return lib


def make_backend_factory(kind: str, spin_ns: int) -> tuple[str, Callable[[float], Any]]:
    if kind in ("auto", "real"):
        backend, why = open_backend(ErrorLog(clock_ns))
        backend.shutdown()
        if not why:
            def real(interval_s: float):
                errors = ErrorLog(clock_ns)
                b, _ = open_backend(errors, interval_s=interval_s)
                return b
            return f"real ({backend.name})", real
        if kind == "real":
            sys.exit(f"no GPU to sample: {why}")
        kind = "fake-nvml"
    if kind == "fake-nvml":
        lib = build_fake_nvml(spin_ns)
        if lib is not None:
            os.environ[NVML_LIB_ENV] = str(lib)  # for a sampler child process (MAXINSTR_SAMPLER_GIL=process)
            return (f"fake-nvml (pynvml over a C stub spinning {spin_ns} ns per call)",
                    lambda interval_s: fake_nvml_backend(ErrorLog(clock_ns), lib, interval_s))
        print("no C compiler: falling back to the null device", file=sys.stderr)
    return "null (reads nothing)", lambda interval_s: NullBackend(n_devices=1)


# ------------------------------------------------------------------------- workloads
def stall_pct(stamps: list[float]) -> float:
    """Share of the run (%) spent in chunks beyond the median chunk time: time taken from the
    loop in bursts (a sampler tick holding the GIL, a thread switch), while slow drifts of the
    machine (clock speed, a neighbour) move the median and every chunk alike, and cancel."""
    import numpy as np

    d = np.diff(np.asarray(stamps))
    if len(d) < 3:
        return float("nan")
    return float(100.0 * np.clip(d - np.median(d), 0, None).sum() / d.sum())


def python_loop(seconds: float) -> tuple[float, float]:
    """GIL-bound pure Python: iterations per second, and the stall % (see stall_pct) over
    chunks of 2000 iterations (~0.1 ms)."""
    n = 0
    x = 0
    stamps = []
    mark = stamps.append
    clock = time.perf_counter
    deadline = clock() + seconds
    t0 = clock()
    mark(t0)
    while True:
        for i in range(2000):
            x += i * i % 7
        n += 2000
        t = clock()
        mark(t)
        if t >= deadline:
            break
    return n / (clock() - t0), stall_pct(stamps)


def make_gpu_loop() -> Callable[[float], tuple[float, float]] | None:
    """Decode-like: 16 small matmuls (a 1 x 4096 activation through 4096 x 4096 bf16 weights)
    launched from Python, then a sync, per step: steps per second, and the stall % over steps."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    dev = torch.device("cuda")
    ws = [torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) * 0.01 for _ in range(16)]
    x0 = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)

    def step() -> None:
        x = x0
        for w in ws:
            x = torch.tanh(x @ w)
        torch.cuda.synchronize()

    for _ in range(50):
        step()

    def loop(seconds: float) -> tuple[float, float]:
        n = 0
        stamps = []
        clock = time.perf_counter
        deadline = clock() + seconds
        t0 = clock()
        stamps.append(t0)
        while stamps[-1] < deadline:
            step()
            n += 1
            stamps.append(clock())
        return n / (clock() - t0), stall_pct(stamps)

    return loop


# ---------------------------------------------------------------------------- runner
def measure(workload: Callable[[float], tuple[float, float]], factory: Callable[[float], Any], seconds: float, rounds: int,
            seed: int) -> dict[str, Any]:
    configs = ["off", *map(str, RATES_HZ)]
    rng = random.Random(seed)

    def shuffled(names: Sequence[str], _round: int) -> list[str]:
        order = list(names)
        rng.shuffle(order)
        return order

    def run(config: str, _round: int) -> tuple[float, float, dict[str, Any] | None]:
        """(rate, stall %, the sampler's cost record) of one configuration."""
        tmp = tempfile.mkdtemp(prefix="sampler-cost-")
        sampler = None
        if config != "off":
            hz = int(config)
            sampler = start_sampler(tmp, 1.0 / hz, backend=factory(1.0 / hz))
            time.sleep(0.05)
        rate, stall = workload(seconds)
        cost = None
        if sampler is not None:
            sampler.stop()
            cost = json.loads((Path(tmp) / "samples.json").read_text())["cost"]
        shutil.rmtree(tmp, ignore_errors=True)
        return rate, stall, cost

    workload(min(0.2, seconds))  # warm up
    runs = interleave(configs, rounds, run, order=shuffled)
    rates = {k: [r[0] for r in v] for k, v in runs.items()}
    stalls = {k: [r[1] for r in v] for k, v in runs.items()}
    costs = {k: [r[2] for r in v if r[2] is not None] for k, v in runs.items()}
    off = rates["off"]
    out: dict[str, Any] = {"off_median": statistics.median(off),
                           "off_spread_pct": 100 * (max(off) - min(off)) / statistics.median(off),
                           "off_stall_pct_median": statistics.median(stalls["off"])}
    for hz in RATES_HZ:
        on = rates[str(hz)]
        # per-round ratio to that round's "off", then the median over rounds
        slow = [100.0 * (1 - x) for x in ratio(on, off).per_round]
        c = costs[str(hz)]
        out[str(hz)] = {
            "median": statistics.median(on),
            "slowdown_pct_median": statistics.median(slow),
            "slowdown_pct_rounds": slow,
            # stall added by the sampler: this config's stall % minus the same round's "off"
            "stall_added_pct_median": statistics.median(a - b for a, b in zip(stalls[str(hz)], stalls["off"])),
            "tick_p50_us": statistics.median(x["per_tick_ns"]["p50"] for x in c) / 1e3 if c and "per_tick_ns" in c[0] else None,
            "thread_cpu_pct": statistics.median(x.get("thread_cpu_pct", 0.0) for x in c) if c else None,
            # time inside ticks per second of run: what the sampler can take from a GIL-bound program
            # (an estimate that the machine's noise does not blur; thread switches come on top)
            "tick_time_pct": statistics.median(100.0 * x["per_tick_ns"]["p50"] * hz / 1e9 for x in c)
            if c and "per_tick_ns" in c[0] else None,
            "missed_ticks": sum(x.get("missed_ticks", 0) for x in c),
        }
    return out


def isolated_tick_cost(factory: Callable[[float], Any], seconds: float = 1.0) -> dict[str, Any]:
    """The sampler alone (no workload): its tick time and thread CPU at 100 and 1000 Hz, and
    at 100 Hz the cost of each vendor call (samples.json ``cost.probes``; run with
    MAXINSTR_SAMPLER_PROFILE=1 for thread CPU per call)."""
    out: dict[str, Any] = {}
    for hz in (100, 1000):
        tmp = tempfile.mkdtemp(prefix="sampler-tick-")
        s = start_sampler(tmp, 1.0 / hz, backend=factory(1.0 / hz))
        time.sleep(seconds)
        s.stop()
        meta = json.loads((Path(tmp) / "samples.json").read_text())
        c = meta["cost"]
        shutil.rmtree(tmp, ignore_errors=True)
        out[str(hz)] = {"ticks": c["ticks"], "tick_p50_us": c["per_tick_ns"]["p50"] / 1e3,
                        "tick_mean_us": c["per_tick_ns"]["mean"] / 1e3,
                        "thread_cpu_us_per_tick": c.get("thread_cpu_ns", 0) / max(1, c["ticks"]) / 1e3,
                        "thread_cpu_pct": c.get("thread_cpu_pct"), "gil": meta.get("gil"),
                        "probes": c.get("probes", {}),
                        "notes": [e["message"] for e in meta.get("errors", []) if e.get("kind") == "cadence"]}
    return out


def print_probes(probes: dict[str, Any]) -> None:
    for dev, table in probes.items():
        print(f"  gpu{dev}: {'call':<16} {'cadence':>7} {'calls':>6} {'p50 us':>9} {'p99 us':>9} {'max us':>9} "
              f"{'CPU us':>8}  moved")
        for name, p in table.items():
            if not p.get("calls"):
                continue
            cpu = p.get("thread_cpu_mean_ns")
            print(f"        {name:<16} {p['cadence']:>7} {p['calls']:>6} {p['p50_ns'] / 1e3:>9.1f} "
                  f"{p['p99_ns'] / 1e3:>9.1f} {p['max_ns'] / 1e3:>9.1f} {'-' if cpu is None else f'{cpu / 1e3:.1f}':>8}"
                  f"  {p.get('moved', '')}")


def _no_backend(interval_s: float) -> None:
    return None


def run_mode(mode: str, workloads: list[tuple[str, Callable[[float], tuple[float, float]]]], factory: Callable[[float], Any],
             args: argparse.Namespace) -> dict[str, Any]:
    """All workloads x rates with MAXINSTR_SAMPLER_GIL=mode, then the sampler alone (profiled)."""
    os.environ["MAXINSTR_SAMPLER_GIL"] = mode
    if mode == "process":
        factory = _no_backend  # start_sampler starts the child process itself
    os.environ.pop("MAXINSTR_SAMPLER_PROFILE", None)
    out: dict[str, Any] = {}
    print(f"\n=== MAXINSTR_SAMPLER_GIL={mode}")
    for name, fn in workloads:
        r = measure(fn, factory, args.seconds, args.rounds, args.seed)
        out[name] = r
        print(f"\n{name}: off {r['off_median']:.4g} (spread of 'off' runs {r['off_spread_pct']:.1f}%; "
              f"stall of 'off' runs {r['off_stall_pct_median']:.2f}%)")
        print(f"  {'rate':>7} {'throughput':>12} {'slowdown':>9} {'(quartiles)':>15} {'stall +':>8} {'tick p50':>10} "
              f"{'ticks x p50':>11} {'thread CPU':>10} {'missed':>6}")
        for hz in RATES_HZ:
            x = r[str(hz)]
            q = statistics.quantiles(x["slowdown_pct_rounds"], n=4) if len(x["slowdown_pct_rounds"]) > 1 else [0, 0, 0]
            tick = f"{x['tick_p50_us']:.1f} us" if x["tick_p50_us"] is not None else "-"
            share = f"{x['tick_time_pct']:.2f}%" if x["tick_time_pct"] is not None else "-"
            print(f"  {hz:>5}Hz {x['median']:>12.4g} {x['slowdown_pct_median']:>8.2f}% {q[0]:>6.1f}..{q[2]:<6.1f} "
                  f"{x['stall_added_pct_median']:>7.2f}% {tick:>10} {share:>11} {x['thread_cpu_pct']:>9.2f}% {x['missed_ticks']:>6}")
    os.environ["MAXINSTR_SAMPLER_PROFILE"] = "1"
    try:
        iso = isolated_tick_cost(factory)
    finally:
        os.environ.pop("MAXINSTR_SAMPLER_PROFILE", None)
    out["isolated"] = iso
    print(f"\nsampler alone (no workload, MAXINSTR_SAMPLER_PROFILE=1): {iso['100']['gil']}")
    for hz, x in iso.items():
        print(f"  {hz:>5}Hz tick p50 {x['tick_p50_us']:.1f} us, mean {x['tick_mean_us']:.1f} us; thread CPU "
              f"{x['thread_cpu_us_per_tick']:.1f} us per tick ({x['thread_cpu_pct']:.2f}%)")
    print("  per call at 100 Hz (wall time; 'CPU' = thread CPU, the rest is waiting):")
    print_probes(iso["100"]["probes"])
    for note in iso["100"]["notes"]:
        print(f"  note: {note}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("auto", "real", "fake-nvml", "null"), default="auto")
    ap.add_argument("--spin-ns", type=int, default=2000, help="fake-nvml: time each NVML call takes (default 2000)")
    ap.add_argument("--slow-call", metavar="FN:NS", help="fake-nvml: make one NVML function take NS ns, e.g. "
                    "nvmlDeviceGetTotalEnergyConsumption:2800000 (what a millisecond call does to the sampler)")
    ap.add_argument("--modes", default="process,auto,release",
                    help="MAXINSTR_SAMPLER_GIL modes to measure, comma-separated (default: process,auto,release)")
    ap.add_argument("--seconds", type=float, default=1.0, help="measuring time per configuration and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)

    if args.slow_call:
        fn, _, ns = args.slow_call.partition(":")
        os.environ["FAKE_NVML_SLOW_FN"], os.environ["FAKE_NVML_SLOW_NS"] = fn, str(int(ns))
    device, factory = make_backend_factory(args.device, args.spin_ns)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if device.startswith("null"):
        modes = [m for m in modes if m != "process"][:1]  # without vendor calls the mode changes nothing
    results: dict[str, Any] = {"device": device, "seconds": args.seconds, "rounds": args.rounds,
                               "python": sys.version.split()[0], "cpus": os.cpu_count(), "modes": {}}
    if args.slow_call:
        results["slow_call"] = args.slow_call
    workloads: list[tuple[str, Callable[[float], tuple[float, float]]]] = [("python loop (iter/s)", python_loop)]
    gpu = make_gpu_loop()
    if gpu is not None:
        workloads.append(("decode-like GPU loop (steps/s)", gpu))
    else:
        results["gpu_loop"] = "skipped: no torch or no GPU"
    print(f"sampler cost: device = {device}; {args.rounds} rounds x {args.seconds:g} s per configuration"
          + (f"; slow call {args.slow_call}" if args.slow_call else ""))
    if gpu is None:
        print("decode-like GPU loop: skipped (no torch or no GPU)")
    for mode in modes:
        results["modes"][mode] = run_mode(mode, workloads, factory, args)
    print("\nsummary: slowdown at 100 Hz (median of rounds; target <= 1%); 'stall +' = time taken from the loop in "
          "bursts beyond its median chunk, minus the same round's 'off' (less blurred by machine noise)")
    for mode, r in results["modes"].items():
        cells = [f"{name.split(' (')[0]} {r[name]['100']['slowdown_pct_median']:.2f}% "
                 f"(stall +{r[name]['100']['stall_added_pct_median']:.2f}%, ticks x p50 "
                 f"{r[name]['100']['tick_time_pct']:.2f}%, missed {r[name]['100']['missed_ticks']})"
                 for name, _ in workloads]
        print(f"  {mode:>8}: " + "; ".join(cells))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
