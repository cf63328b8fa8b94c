"""What each part of kernels=True's CUPTI configuration costs on a launch-bound step (issue 9).

    python benchmarks/cupti_configs.py [--configs "a;b"] [--rounds 40] [--json out.json]

Each configuration runs in a fresh process on the small step of benchmarks/cupti_overhead.py
(one stage around 32 tiny torch launches, then a device synchronize). In that process: bare
blocks first (CUPTI not loaded), then CUPTI is set up the way the collector does (subscriber,
native buffers, the stage core pushing external-correlation ids), and blocks alternate between
the configuration's activity kinds enabled and disabled. Ratios are medians over rounds of
(enabled block / disabled block of the same round), so the process-to-process drift of that
machine (tens of percent on single runs) cancels; "off/bare" shows what merely having CUPTI
attached costs; "p10" is the same ratio of the blocks' 10th-percentile steps. Records per launch
(by kind) come from the buffers taken after each enabled block, so a configuration that loses
records shows it. The launch-tag configurations split the tags' cost: CUPTI's callback dispatch
alone (flags 2: the callback returns at once), the tags without timestamps, the tags as
kernels=True takes them; "kernels tagged" says which id each kernel record carried.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import types

from harness import emit_result, interleave, p10, ratio, rotated, run_child, time_calls_ns

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
    # the core's launch tags (kernels=True's default); tag_flags as _native.cupti_tags takes them
    "kernel + launch tags": (["CONCURRENT_KERNEL"], {"no_subscriber": True, "tag_flags": 1}),
    "kernel + launch tags, no times": (["CONCURRENT_KERNEL"], {"no_subscriber": True, "tag_flags": 0}),
    "kernel + callback dispatch only": (["CONCURRENT_KERNEL"], {"no_subscriber": True, "tag_flags": 2}),
    "launch tags alone": ([], {"no_subscriber": True, "tag_flags": 1}),
    "callback dispatch alone": ([], {"no_subscriber": True, "tag_flags": 2}),
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

    def block() -> list[int]:
        t = time_calls_ns(small, steps)
        _native.resolve(block=True)
        _native.drain()
        return t

    for _ in range(50):
        small()
    bare = [block() for _ in range(3)]
    res: dict = {"config": name, "kinds": kinds, "options": opt, "notes": []}
    if opt.get("no_cupti"):  # the same schedule with nothing attached: what drift alone shows
        blocks = interleave(("on", "off"), rounds, lambda _what, _r: block())
        return {**res, **_ratios(bare, blocks["on"], blocks["off"]), "records_per_launch": {}}
    from cupti import cupti as c

    sub = None if opt.get("no_subscriber") else c.subscribe(mc._noop_callback, None)
    kind_value = int(c.ExternalCorrelationKind.CUSTOM2)
    path = mc._same_instance_path(c, kind_value)
    if not path or not _native.cupti_buffers(path, mc.BUFFER_BYTES, mc.MAX_PENDING_BYTES):
        return {**res, "error": f"native buffers unavailable ({path})"}
    K = c.ActivityKind

    ks = [getattr(K, k) for k in kinds]

    # the launch functions, as the collector's API filter keeps them
    tags = "tag_flags" in opt
    tag_ids = mc.CuptiCollector._launch_cbids(types.SimpleNamespace(_c=c)) if tags else ([], [])

    def enable():
        for k in ks:
            c.activity_enable(k)
        if tags and _native.cupti_tags(path, *tag_ids, opt["tag_flags"]) is not True:
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
    if tags:
        _native.cupti_tags(None)
        _native.cupti_tags_take()
    _native.cupti_flush(1)
    _native.cupti_take()

    on: list[list[int]] = []
    off: list[list[int]] = []
    per_kind: dict[str, int] = {}
    tag_corr: list = []
    inner_corr: list = []
    kcorr: list = []
    for r in range(rounds):
        for what in rotated(("on", "off"), r):
            if what == "on":
                enable()
                on.append(block())
                for k in ks:
                    c.activity_disable(k)
                if tags:
                    _native.cupti_tags(None)
                    tg = np.frombuffer(_native.cupti_tags_take(), dtype=mc.TAG_DTYPE)
                    per_kind["TAG"] = per_kind.get("TAG", 0) + len(tg)
                    staged = tg[tg["stage_id"] >= 0]
                    tag_corr.append(staged["correlation_id"].astype(np.int64))
                    inner_corr.append(staged["inner_correlation_id"][staged["inner_correlation_id"] != 0].astype(np.int64))
                _native.cupti_flush(1)  # outside the timed block
                for data, offs in _native.cupti_take():
                    o = np.frombuffer(offs, np.int64)
                    kk = np.frombuffer(data, "<i4", count=len(data) // 4)[o // 4]
                    if tags:  # which kernels a tag (with a stage) names
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
    res.update(_ratios(bare, on, off), records_per_launch={k: v / launches for k, v in sorted(per_kind.items())})
    if tags and kcorr and opt["tag_flags"] != 2:
        kc = np.concatenate(kcorr)
        outer = np.isin(kc, np.concatenate(tag_corr))
        inner = np.isin(kc, np.concatenate(inner_corr))
        res["kernels_tagged_with_a_stage"] = float((outer | inner).mean())
        res["notes"].append(f"kernels tagged with a stage: {res['kernels_tagged_with_a_stage']:.3f} (by the launch "
                            f"call's id {outer.mean():.3f}, by its inner driver call's {inner.mean():.3f})")
    return res


def _ratios(bare: list[list[int]], on: list[list[int]], off: list[list[int]]) -> dict:
    """Step times (us) and on/off ratios: median over rounds of a statistic of the enabled block
    over the same statistic of that round's disabled block, for the median step and for the
    10th-percentile step (the step least disturbed by the rest of the machine)."""
    med = statistics.median
    bare_m, on_m, off_m = ([med(b) for b in blocks] for blocks in (bare, on, off))
    return {
        "bare_us": med(bare_m) / 1000, "on_us": med(on_m) / 1000, "off_us": med(off_m) / 1000,
        "on_over_off": ratio(on_m, off_m).median,
        "on_over_off_p10": ratio([p10(a) for a in on], [p10(b) for b in off]).median,
        "off_over_bare": ratio(off_m, bare_m).of_medians,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default=";".join(CONFIGS), help="names separated by ';'")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        emit_result(child(a.child, a.rounds, a.steps))
        return 0
    results = []
    print(f"small step: one stage around {LAUNCHES} tiny torch launches + synchronize; median us per step; "
          "on/off = median over rounds of enabled/disabled blocks in one process (p10: of their 10th-percentile steps)")
    print(f"{'configuration':<34}{'bare':>8}{'off':>8}{'on':>8}{'on/off':>8}{'p10':>7}{'off/bare':>9}  records per launch")
    for name in a.configs.split(";"):
        run = run_child([sys.executable, __file__, "--child", name, "--rounds", str(a.rounds), "--steps", str(a.steps)],
                        limit_s=300, env=os.environ)
        r = run.result if run.ok and run.result is not None else {
            "config": name, "error": run.error if run.timed_out else (run.stderr or run.stdout).strip().splitlines()[-3:]}
        results.append(r)
        if "error" in r:
            print(f"{name:<34} error: {r['error']}")
            continue
        rec = " ".join(f"{k.lower()} {v:.2f}" for k, v in r["records_per_launch"].items())
        print(f"{name:<34}{r['bare_us']:8.1f}{r['off_us']:8.1f}{r['on_us']:8.1f}{r['on_over_off']:8.3f}{r['on_over_off_p10']:7.3f}"
              f"{r['off_over_bare']:9.3f}  {rec}  {' '.join(r['notes'])}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
