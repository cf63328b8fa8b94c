"""What kernels=True costs per step, against nsys and torch.profiler on the same workload, one run.

    python benchmarks/cupti_overhead.py [--small 400] [--large 60] [--rounds 3] [--ab-rounds 24]
        [--peer-rounds 12] [--out DIR]

Two steps, each timed on the host from before the stage to after a device synchronize:
``small``: 32 tiny kernel launches (launch-bound; where per-launch tracing cost shows), and
``large``: bf16 4096^3 products, >= 1 ms of GPU work. Modes, each in a fresh process:

  bare      no maxinstr at all
  stages    maxinstr.session (stages with GPU events and NVTX), kernels=False
  kernels   maxinstr.session(..., kernels=True) with MAXINSTR_CUPTI_TAGS=0 (API + external-correlation records)
  kernels_tags  kernels=True as it is by default, MAXINSTR_CUPTI_TAGS=1 (launch tags, no API
            or external-correlation activity records; docs/kernels.md)
  nsys      the `stages` program under `nsys profile -t cuda,nvtx` (when nsys is on PATH)
  torchprof the `stages` program inside torch.profiler.profile(CPU+CUDA) (Kineto)

Prints the median step time per mode and its ratio to bare (targets for kernels: <= 1.10 on
the small step, <= 1.02 on the large one), as a table and as JSON (``--out``/overhead.json).

The bare step moves by tens of percent from one process to the next on the H200 (235-404 us in
one run), more than the effect measured, so two things narrow it: every child is pinned to the
same CPUs (``--cpus``), and ``--ab-rounds N`` adds a second table from ONE process whose blocks
rotate between bare, stages, kernels and kernels_tags (a kernels block is a whole
``maxinstr.session(kernels=True)``; the block is timed inside it, after a short warm-up); a ratio
there is the median over rounds of block / the same round's bare block. Bare blocks run first,
before CUPTI is ever loaded, and are shown beside the later ones, so what CUPTI leaves behind
after a session closes (which would flatter the later ratios) is visible. nsys and torch.profiler
cannot share that process (nsys attaches at start; Kineto takes CUPTI's subscriber and may tear
CUPTI down when it stops), so ``--peer-rounds N`` gives each its own process of rotated blocks
against its own bare blocks: bare / stages / torchprof, and, under ``nsys profile
--capture-range=cudaProfilerApi --capture-range-end=repeat``, bare (nsys attached, not capturing)
/ nsys (a capture range around the stages program).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from harness import emit_result, interleave, p10, print_table, ratio, rotated, run_child, time_calls_ns

SMALL_LAUNCHES = 32


def _steps(stage):  # the small and large steps, their stages made by `stage`
    import torch

    x = torch.zeros(1024, device="cuda")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    sync = torch.cuda.synchronize

    def small() -> None:
        with stage("small"):
            for _ in range(SMALL_LAUNCHES):
                x.add_(1.0)
        sync()

    def large() -> None:
        with stage("large"):
            c = a
            for _ in range(6):
                c = c @ b
        sync()

    return small, large, sync


def _null_stage(name: str):
    return contextlib.nullcontext()


def _kernels_meta(run_dir: str) -> dict:
    meta = json.loads((Path(run_dir) / "meta.json").read_text())
    return meta.get("kernels") or {}


AB_MODES = ("bare", "stages", "kernels", "kernels_tags")
# the peers, each in one process of its own against its own bare blocks: torch.profiler (Kineto
# takes CUPTI and may tear it down when it stops, so never beside kernels=True), and nsys (the
# process runs under `nsys profile --capture-range=cudaProfilerApi --capture-range-end=repeat`;
# an nsys block is a capture range, its bare blocks run with nsys attached but not capturing)
PEER_MODES = {"peers": ("bare", "stages", "torchprof"), "nsys": ("bare", "nsys")}


def child_ab(modes: tuple[str, ...], rounds: int, n_small: int, n_large: int, run_dir: str) -> dict:
    """`modes` in this one process, in blocks rotated each round (see the module doc)."""
    import maxinstr

    bare_small, bare_large, sync = _steps(_null_stage)
    mi_small, mi_large, _ = _steps(maxinstr.stage)
    for _ in range(20):
        bare_small()
        bare_large()
    sync()
    before = [statistics.median(time_calls_ns(bare_small, n_small)) for _ in range(2)]
    status: dict[str, set] = {}

    def block(mode: str, r: int) -> tuple[list[int], list[int]]:
        """ns of each small and each large step of one block of ``mode``."""
        if mode == "bare":
            return time_calls_ns(bare_small, n_small), time_calls_ns(bare_large, n_large)
        os.environ["MAXINSTR_CUPTI_TAGS"] = "1" if mode == "kernels_tags" else "0"
        d = f"{run_dir}/{mode}-{r}"
        with contextlib.ExitStack() as stack:
            stack.enter_context(maxinstr.session(d, kernels=mode.startswith("kernels"), sample_hz=0))
            if mode == "torchprof":
                from torch.profiler import ProfilerActivity, profile

                stack.enter_context(profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]))
            if mode == "nsys":
                import torch

                torch.cuda.profiler.start()
                stack.callback(torch.cuda.profiler.stop)
            for _ in range(10):  # this block's first buffers and records
                mi_small()
            times = time_calls_ns(mi_small, n_small), time_calls_ns(mi_large, n_large)
        if mode.startswith("kernels"):
            k = _kernels_meta(d)
            status.setdefault(mode, set()).add(f"{k.get('status')} {k.get('reason') or ''}".strip())
        return times

    blocks = interleave(modes, rounds, block)
    small = {m: [statistics.median(s) for s, _ in blocks[m]] for m in modes}
    small_p10 = {m: [p10(s) for s, _ in blocks[m]] for m in modes}  # the step least disturbed by the machine
    large = {m: [statistics.median(lg) for _, lg in blocks[m]] for m in modes}
    out: dict = {"rounds": rounds, "bare_before_cupti_small_ns": statistics.median(before),
                 "status": {m: sorted(v) for m, v in status.items()}, "modes": {}}  # fmt: skip
    for m in modes:
        out["modes"][m] = {
            "small_ns": statistics.median(small[m]), "large_ns": statistics.median(large[m]),
            "small_ratio": ratio(small[m], small["bare"]).median,
            "small_ratio_p10": ratio(small_p10[m], small_p10["bare"]).median,
            "large_ratio": ratio(large[m], large["bare"]).median,
            "small_ns_rounds": small[m],
        }  # fmt: skip
    return out


def child(mode: str, n_small: int, n_large: int, run_dir: str) -> dict:
    if mode == "bare":
        stage = _null_stage
        sess = contextlib.nullcontext()
    else:
        import maxinstr

        stage = maxinstr.stage
        sess = maxinstr.session(run_dir, kernels=(mode == "kernels"), sample_hz=0)
    small, large, sync = _steps(stage)

    for _ in range(20):
        small()
        large()
    sync()
    prof = None
    if mode == "torchprof":
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        prof.__enter__()
    with sess:
        for _ in range(20):  # warm the mode itself (first buffers, first records)
            small()
        # interleave blocks so slow drift hits both steps alike
        s_times: list[int] = []
        l_times: list[int] = []
        for _ in range(4):
            s_times += time_calls_ns(small, n_small // 4)
            l_times += time_calls_ns(large, n_large // 4)
    if prof is not None:
        prof.__exit__(None, None, None)
    res = {"mode": mode, "small_ns": statistics.median(s_times), "large_ns": statistics.median(l_times),
           "small_mean_ns": statistics.fmean(s_times), "large_mean_ns": statistics.fmean(l_times),
           "small_n": len(s_times), "large_n": len(l_times)}  # fmt: skip
    if mode == "kernels":  # kernels_tags runs this child too
        k = _kernels_meta(run_dir)
        res["kernels_status"] = k.get("status")
        res["kernels_reason"] = k.get("reason")
        part = next((Path(run_dir) / "parts").iterdir())
        act = json.loads((part / "activity.json").read_text())
        res["activity_rows"] = act.get("rows")
        res["callback_s"] = act.get("callback_s")
        res["convert_s"] = act.get("convert_s")
        res["buffers_by"] = act.get("buffers_by")
        res["fast_path"] = act.get("fast_path")
        res["api_functions_kept"] = act.get("api_functions_kept")
        res["dropped"] = [act.get("dropped_cupti"), act.get("dropped_queue")]
        res["driver_api_records"] = act.get("driver_api_records")
        res["driver_api_note"] = act.get("driver_api_note")
    return res


def _cpu_set(spec: str) -> set[int] | None:
    if spec == "none":
        return None
    if spec == "auto":
        return set(sorted(os.sched_getaffinity(0))[:4])
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _child_result(label: str, cmd: list[str], timeout_s: int, pin, env=None) -> tuple[dict | None, str]:
    """Run one child; its RESULT line as a dict with wall_s (None, and the output printed, on failure)."""
    run = run_child(cmd, limit_s=timeout_s, env=env, preexec_fn=pin)
    if run.timed_out:
        print(f"{label}: no result within {timeout_s} s\n{run.stdout[-1500:]!r}")
        return None, ""
    if run.rc != 0 or run.result is None:
        print(f"{label}: failed rc={run.rc}\n{run.stdout[-1500:]}\n{run.stderr[-3000:]}")
        return None, run.stderr
    res = run.result
    res["wall_s"] = round(run.wall_s, 1)
    return res, run.stderr


def _run_ab(kind: str, rounds: int, args: argparse.Namespace, tmp: Path, pin) -> dict | None:
    """One child running the modes of `kind` ("ab": AB_MODES, else PEER_MODES[kind]) as rotated
    blocks; its table printed."""
    cmd = [sys.executable, __file__, "--child", kind, "--ab-rounds", str(rounds), "--small", str(args.small),
           "--large", str(args.large), "--run-dir", str(tmp / kind)]  # fmt: skip
    if kind == "nsys":
        nsys = shutil.which("nsys")
        if not nsys:
            print("\nnsys: not on PATH, its one-process table skipped")
            return None
        cmd = [nsys, "profile", "-t", "cuda,nvtx", "--sample=none", "--cpuctxsw=none", "-f", "true",
               "--capture-range=cudaProfilerApi", "--capture-range-end=repeat", "-o", str(tmp / "ab-nsys"), *cmd]  # fmt: skip
    ab, _ = _child_result(f"one process ({kind})", cmd, 150 if kind == "nsys" else 300, pin)
    if ab is None:
        return None
    what = {"ab": "maxinstr", "peers": "torch.profiler", "nsys": "nsys (capture ranges; bare = nsys attached, idle)"}[kind]
    print(f"\nONE process [{what}], {ab['rounds']} rounds of rotated blocks ({ab['wall_s']} s); ratio = median "
          f"over rounds of block / that round's bare block")  # fmt: skip
    print_table(["mode", "small step us", "ratio", "p10", "large step us", "ratio", "small step per round (us)"],
                [[m, r["small_ns"] / 1e3, r["small_ratio"], r["small_ratio_p10"], r["large_ns"] / 1e3, r["large_ratio"],
                  ", ".join(f"{v / 1e3:.0f}" for v in r["small_ns_rounds"])] for m, r in ab["modes"].items()],
                ["", ".1f", ".3f", ".3f", ".1f", ".3f"])  # fmt: skip
    print("(p10: the same ratio of the blocks' 10th-percentile small steps)")
    if kind != "ab":
        return ab
    print(f"bare before CUPTI was first loaded: small {ab['bare_before_cupti_small_ns'] / 1e3:.1f} us; kernels "
          f"status per mode {ab['status']}")  # fmt: skip
    for m in ("kernels", "kernels_tags"):
        r = ab["modes"][m]
        if any(not st.startswith(("closed", "collecting")) for st in ab["status"].get(m, ["none"])):
            print(f"{m} (one process) did NOT collect in every block: its ratios are not the CUPTI cost")
            continue
        print(f"{m} (one process): small <= 1.10 -> {'met' if r['small_ratio'] <= 1.10 else 'NOT met'}; "
              f"large <= 1.02 -> {'met' if r['large_ratio'] <= 1.02 else 'NOT met'}")  # fmt: skip
    return ab


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", type=int, default=400)
    ap.add_argument("--large", type=int, default=60)
    ap.add_argument("--out", default=None)
    ap.add_argument("--modes", default="bare,stages,kernels,kernels_tags,nsys,torchprof")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every mode this many times, in a rotated order; each mode's step time is the "
                         "median over its rounds (one process per run: step times move by tens of percent "
                         "from one process to the next on the H200)")
    ap.add_argument("--ab-rounds", type=int, default=0,
                    help="also run bare/stages/kernels/kernels_tags as rotated blocks in one process, this "
                         "many rounds (0: not)")
    ap.add_argument("--peer-rounds", type=int, default=0,
                    help="also run torch.profiler and nsys as rotated blocks, each in one process against its "
                         "own bare blocks, this many rounds (0: not)")
    ap.add_argument("--cpus", default="auto",
                    help="CPUs every child is pinned to: 'auto' (the first 4 this process may use), a list "
                         "like 0-3,8, or 'none'")
    ap.add_argument("--child", default=None)
    ap.add_argument("--run-dir", default=None)
    args = ap.parse_args()
    if args.child in ("ab", *PEER_MODES):
        modes = AB_MODES if args.child == "ab" else PEER_MODES[args.child]
        emit_result(child_ab(modes, args.ab_rounds, args.small // 4, max(4, args.large // 4), args.run_dir))
        return 0
    if args.child:
        emit_result(child(args.child, args.small, args.large, args.run_dir))
        return 0

    cpus = _cpu_set(args.cpus)
    print(f"children pinned to CPUs {sorted(cpus)}" if cpus else "children not pinned", flush=True)
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    tmp = Path(tempfile.mkdtemp(prefix="cupti-overhead-"))
    runs: dict[str, list[dict]] = {}
    nsys = shutil.which("nsys")
    modes = args.modes.split(",")
    schedule = [m for r in range(args.rounds) for m in rotated(modes, r)]
    for i, mode in enumerate(schedule):
        run_dir = str(tmp / f"{mode}-{i}")
        child_mode = {"nsys": "stages", "kernels_tags": "kernels"}.get(mode, mode)
        cmd = [sys.executable, __file__, "--child", child_mode, "--small", str(args.small), "--large", str(args.large),
               "--run-dir", run_dir]  # fmt: skip
        if mode == "nsys":
            if not nsys:
                print("nsys: not on PATH, skipped")
                continue
            cmd = [nsys, "profile", "-t", "cuda,nvtx", "--sample=none", "--cpuctxsw=none", "-f", "true",
                   "-o", str(tmp / "overhead"), *cmd]  # fmt: skip
        env = dict(os.environ, MAXINSTR_CUPTI_TAGS="1" if mode == "kernels_tags" else "0")
        res, stderr = _child_result(mode, cmd, 240, pin, env)
        if res is None:
            continue
        res["mode"] = mode
        runs.setdefault(mode, []).append(res)
        print(f"{mode}: small {res['small_ns'] / 1e3:.1f} us, large {res['large_ns'] / 1e3:.1f} us (median; {res['wall_s']} s)", flush=True)
        warn = [ln for ln in stderr.splitlines() if "kernels=True" in ln]
        if warn:
            res["warning"] = warn[0]
    results = []
    for rs in runs.values():
        merged = dict(rs[-1])
        for key in ("small_ns", "large_ns", "small_mean_ns", "large_mean_ns"):
            merged[key] = statistics.median(r[key] for r in rs)
        merged["rounds"] = len(rs)
        merged["small_ns_rounds"] = [r["small_ns"] for r in rs]
        results.append(merged)
    base = next((r for r in results if r["mode"] == "bare"), None)
    print(f"\nmedian step per mode against bare (small: {SMALL_LAUNCHES} launches; large: 6 x bf16 4096^3); (mean): "
          "the same ratio of mean steps")
    rows = []
    for r in results:
        rs = r["small_ns"] / base["small_ns"] if base else float("nan")
        rl = r["large_ns"] / base["large_ns"] if base else float("nan")
        ms = r["small_mean_ns"] / base["small_mean_ns"] if base else float("nan")
        ml = r["large_mean_ns"] / base["large_mean_ns"] if base else float("nan")
        r["small_ratio"], r["large_ratio"] = round(rs, 4), round(rl, 4)
        r["small_mean_ratio"], r["large_mean_ratio"] = round(ms, 4), round(ml, 4)
        rows.append([r["mode"], r["small_ns"] / 1e3, rs, ms, r["large_ns"] / 1e3, rl, ml])
    print_table(["mode", "small step us", "ratio", "(mean)", "large step us", "ratio", "(mean)"], rows,
                ["", ".1f", ".3f", ".3f", ".1f", ".3f", ".3f"])
    if any(r.get("rounds", 1) > 1 for r in results):
        print("small step per round (us): " + "; ".join(
            f"{r['mode']} " + ", ".join(f"{v / 1e3:.0f}" for v in r["small_ns_rounds"]) for r in results))
    # the targets are read off kernels=True's default (launch tags) where it ran
    k = next((r for r in results if r["mode"] == "kernels_tags"), None) or next((r for r in results if r["mode"] == "kernels"), None)
    if k is not None:
        print(f"{k['mode']}: status {k.get('kernels_status')}, {k.get('activity_rows')} activity rows, buffers by "
              f"{k.get('buffers_by')}, Python on CUPTI's thread {k.get('callback_s')} s, conversion on the flusher "
              f"{k.get('convert_s')} s, dropped (cupti, queue) {k.get('dropped')}, API functions traced "
              f"{k.get('api_functions_kept')}\nkernels: {k.get('fast_path')}")  # fmt: skip
        if k.get("kernels_status") not in ("closed", "collecting"):
            print(f"kernels=True did NOT collect here ({k.get('kernels_reason')}): its ratios are not the CUPTI cost")
        elif base:
            spread = max(base["small_ns_rounds"]) / min(base["small_ns_rounds"]) - 1
            print(f"targets (fresh processes): small <= 1.10 -> {'met' if k['small_ratio'] <= 1.10 else 'NOT met'}; "
                  f"large <= 1.02 -> {'met' if k['large_ratio'] <= 1.02 else 'NOT met'}"
                  + (f"; the bare small step moved {spread:.0%} between its processes, more than the 10 % "
                     "measured: read the one-process tables" if spread > 0.10 else ""))  # fmt: skip
    ab = _run_ab("ab", args.ab_rounds, args, tmp, pin) if args.ab_rounds > 0 else None
    peers = {k: _run_ab(k, args.peer_rounds, args, tmp, pin) for k in PEER_MODES} if args.peer_rounds > 0 else {}
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "overhead.json").write_text(json.dumps(
            {"fresh_processes": results, "one_process": ab, "one_process_peers": peers}, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
