"""What each part of kernels=True's CUPTI configuration costs on a launch-bound step (issue 9).

    python benchmarks/cupti_configs.py [--configs "a;b"] [--rounds 8] [--json out.json]

Each configuration runs in a fresh process on the small step of benchmarks/cupti_overhead.py
(one stage around 32 tiny torch launches, then a device synchronize). In that process: bare
blocks first (CUPTI not loaded), then CUPTI is set up the way the collector does (subscriber,
native buffers, the stage core pushing external-correlation ids), and blocks alternate between
the configuration's activity kinds enabled and disabled. Ratios are medians over rounds of
(enabled block / disabled block of the same round), so the process-to-process drift of that
machine (tens of percent on single runs) cancels; "off/bare" shows what merely having CUPTI
attached costs. Records per launch (by kind) come from the buffers taken after each enabled
block, so a configuration that loses records shows it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
import types

LAUNCHES = 32
# name -> (activity kind names, options)
CONFIGS: dict[str, tuple[list[str], dict]] = {
    "control (no CUPTI)": ([], {"no_cupti": True}),
    "attached, no kinds": ([], {}),
    "kernel": (["CONCURRENT_KERNEL"], {}),
    "kernel (no subscriber)": (["CONCURRENT_KERNEL"], {"no_subscriber": True}),
    "kernel+extcorr+runtime": (["CONCURRENT_KERNEL", "EXTERNAL_CORRELATION", "RUNTIME"], {"launch_only": True}),
    "kernel+extcorr+driver": (["CONCURRENT_KERNEL", "EXTERNAL_CORRELATION", "DRIVER"], {"launch_only": True}),
    "kernels=True (six kinds)": (
        ["CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "RUNTIME", "DRIVER", "EXTERNAL_CORRELATION"], {"launch_only": True}),
    "six kinds, all API functions": (
        ["CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "RUNTIME", "DRIVER", "EXTERNAL_CORRELATION"], {}),
    "kernel + native launch tags": (["CONCURRENT_KERNEL"], {"no_subscriber": True, "native_tags": True}),
    "kernel (semaphores preallocated)": (["CONCURRENT_KERNEL"], {"prealloc": True}),
    "kernel (per-thread buffers)": (["CONCURRENT_KERNEL"], {"per_thread": True}),
    "kernel (hw trace)": (["CONCURRENT_KERNEL"], {"hw_trace": True}),
}


def child(name: str, rounds: int, steps: int) -> dict:
    import numpy as np
    import torch

    import maxinstr
    from maxinstr import _native
    from maxinstr.kernels import cupti as mc

    kinds, opt = CONFIGS[name]
    x = torch.zeros(1024, device="cuda")
    sync = torch.cuda.synchronize
    stage = maxinstr.stage

    def small():
        with stage("small"):
            for _ in range(LAUNCHES):
                x.add_(1.0)
        sync()

    def block() -> float:
        t: list[int] = []
        for _ in range(steps):
            t0 = time.perf_counter_ns()
            small()
            t.append(time.perf_counter_ns() - t0)
        _native.resolve(block=True)
        _native.drain()
        return statistics.median(t)

    for _ in range(50):
        small()
    bare = [block() for _ in range(3)]
    res: dict = {"config": name, "kinds": kinds, "options": opt, "notes": []}
    if opt.get("no_cupti"):  # the same schedule with nothing attached: what drift alone shows
        on = []
        off = []
        for _ in range(rounds):
            on.append(block())
            off.append(block())
        return {**res, "bare_us": statistics.median(bare) / 1000, "on_us": statistics.median(on) / 1000,
                "off_us": statistics.median(off) / 1000,
                "on_over_off": statistics.median(a / b for a, b in zip(on, off)),
                "off_over_bare": statistics.median(off) / statistics.median(bare), "records_per_launch": {}}
    from cupti import cupti as c

    sub = None if opt.get("no_subscriber") else c.subscribe(mc._noop_callback, None)
    kind_value = int(c.ExternalCorrelationKind.CUSTOM2)
    path = mc._same_instance_path(c, kind_value)
    if not path or not _native.cupti_buffers(path, mc.BUFFER_BYTES, mc.MAX_PENDING_BYTES):
        return {**res, "error": f"native buffers unavailable ({path})"}
    K = c.ActivityKind
    A = c.ActivityAttribute

    def set_attr(attr, value, ctype):
        v = ctype(value)
        try:
            c.activity_set_attribute(attr, ctypes.sizeof(v), ctypes.addressof(v))
            res["notes"].append(f"{attr.name}={value}")
        except Exception as exc:  # noqa: BLE001
            res["notes"].append(f"{attr.name}: {type(exc).__name__}: {exc}")

    if opt.get("prealloc"):
        set_attr(A.ATTR_PROFILING_SEMAPHORE_PRE_ALLOCATE_VALUE, 65536, ctypes.c_size_t)
        set_attr(A.ATTR_DEVICE_BUFFER_PRE_ALLOCATE_VALUE, 4, ctypes.c_size_t)
    if opt.get("per_thread"):
        set_attr(A.ATTR_PER_THREAD_BUFFER, 1, ctypes.c_uint8)
    if opt.get("hw_trace"):
        try:
            c.activity_enable_hw_trace(1)
            res["notes"].append("hw trace on")
        except Exception as exc:  # noqa: BLE001
            res["notes"].append(f"hw trace: {type(exc).__name__}: {mc._error_text(c, exc)}")
    ks = [getattr(K, k) for k in kinds]

    # the launch functions, as the collector's API filter keeps them
    tag_ids = mc.CuptiCollector._launch_cbids(types.SimpleNamespace(_c=c)) if opt.get("native_tags") else ([], [])

    def enable():
        for k in ks:
            c.activity_enable(k)
        if opt.get("native_tags") and _native.cupti_tags(path, *tag_ids) is not True:
            raise RuntimeError(f"cupti_tags failed: {_native.stats()['errors'][-1:]}")
        if opt.get("launch_only"):  # as the collector does, after the kinds are on
            ns = types.SimpleNamespace(_c=c)
            mc.CuptiCollector._trace_launches_only(ns)
            res["api_kept"] = ns._kept_api

    enable()
    if "EXTERNAL_CORRELATION" in kinds:
        _native.cupti_link(path, kind_value)
    for _ in range(50):  # first records, first buffers
        small()
    for k in ks:
        c.activity_disable(k)
    if opt.get("native_tags"):
        _native.cupti_tags(None)
        _native.cupti_tags_take()
    _native.cupti_flush(1)
    _native.cupti_take()

    on: list[float] = []
    off: list[float] = []
    per_kind: dict[str, int] = {}
    tag_corr: list = []
    kcorr: list = []
    for r in range(rounds):
        order = ("on", "off") if r % 2 == 0 else ("off", "on")
        for what in order:
            if what == "on":
                enable()
                on.append(block())
                for k in ks:
                    c.activity_disable(k)
                if opt.get("native_tags"):
                    _native.cupti_tags(None)
                    raw = _native.cupti_tags_take()
                    tags = np.frombuffer(raw, dtype=mc.TAG_DTYPE)
                    per_kind["TAG"] = per_kind.get("TAG", 0) + len(tags)
                    tag_corr.append(tags["correlation_id"][tags["stage_id"] >= 0].astype(np.int64))
                _native.cupti_flush(1)  # outside the timed block
                for data, offs in _native.cupti_take():
                    o = np.frombuffer(offs, np.int64)
                    kk = np.frombuffer(data, "<i4", count=len(data) // 4)[o // 4]
                    if opt.get("native_tags"):  # which kernels a tag (with a stage) names
                        ko = o[kk == int(K.CONCURRENT_KERNEL)]
                        field = c.activity_kernel10_dtype.fields["correlation_id"]
                        kcorr.append(np.array([int.from_bytes(data[x + field[1]:x + field[1] + 4], "little") for x in ko.tolist()],
                                              np.int64))  # fmt: skip
                    for v, cnt in zip(*np.unique(kk, return_counts=True)):
                        key = K(int(v)).name
                        per_kind[key] = per_kind.get(key, 0) + int(cnt)
            else:
                off.append(block())
    _native.cupti_link(None)
    if sub is not None:
        c.unsubscribe(sub)
    launches = rounds * steps * LAUNCHES
    res.update(
        bare_us=statistics.median(bare) / 1000, on_us=statistics.median(on) / 1000, off_us=statistics.median(off) / 1000,
        on_over_off=statistics.median(a / b for a, b in zip(on, off)),
        off_over_bare=statistics.median(off) / statistics.median(bare),
        records_per_launch={k: v / launches for k, v in sorted(per_kind.items())},
    )
    if opt.get("native_tags") and kcorr:
        kc = np.concatenate(kcorr)
        res["kernels_tagged_with_a_stage"] = float(np.isin(kc, np.concatenate(tag_corr) if tag_corr else []).mean())
        res["notes"].append(f"kernels tagged with a stage: {res['kernels_tagged_with_a_stage']:.3f}")
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default=";".join(CONFIGS), help="names separated by ';'")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.rounds, a.steps)))
        return 0
    results = []
    print(f"small step: one stage around {LAUNCHES} tiny torch launches + synchronize; median us per step; "
          "on/off = median over rounds of enabled/disabled blocks in one process")
    print(f"{'configuration':<34}{'bare':>8}{'off':>8}{'on':>8}{'on/off':>8}{'off/bare':>9}  records per launch")
    for name in a.configs.split(";"):
        p = subprocess.run([sys.executable, __file__, "--child", name, "--rounds", str(a.rounds), "--steps", str(a.steps)],
                           capture_output=True, text=True, timeout=300, env=os.environ)
        try:
            r = json.loads(p.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            r = {"config": name, "error": (p.stderr or p.stdout).strip().splitlines()[-3:]}
        results.append(r)
        if "error" in r:
            print(f"{name:<34} error: {r['error']}")
            continue
        rec = " ".join(f"{k.lower()} {v:.2f}" for k, v in r["records_per_launch"].items())
        print(f"{name:<34}{r['bare_us']:8.1f}{r['off_us']:8.1f}{r['on_us']:8.1f}{r['on_over_off']:8.3f}"
              f"{r['off_over_bare']:9.3f}  {rec}  {' '.join(r['notes'])}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
