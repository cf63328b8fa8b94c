"""Which time does an NVML utilization value (and a GPM value) describe? Measured on a GPU.

A square wave of known GPU activity: stages "busy" (bf16 matmuls back to back, a sync every 8)
and "idle" (sleep) of several lengths, inside a maxinstr session sampling at 100 Hz. The GPU
is busy exactly between each busy stage's CUDA-event start and end (host clock). Then:

- utilization: every value change marks a driver update u; the value should be the busy share
  of [u - lag - window, u - lag]. Fits lag and window (grid search, mean absolute error),
  prints the driver period (median gap between updates).
- GPM SM activity: a value read at row t covers [t_prev - lag, t - lag]; fits that lag.
- the per-stage table (maxinstr.analyze.report) for the busy and idle stages.

Prints one FIT line per metric and the constants maxinstr uses
(maxinstr.sample.attribute.NVML_UTIL_LAG_NS, NVML_GPM_LAG_NS), then CHECK lines.

    python benchmarks/util_windows.py OUT_DIR
    python benchmarks/util_windows.py OUT_DIR --analyse RUN_DIR BUSY_STAGE_PREFIX   # no GPU: fit only
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

MS = 1_000_000


def workload(run_dir: Path) -> None:
    import torch

    import maxinstr

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream().cuda_stream
    pattern = [(300, 300), (600, 400), (100, 300), (50, 250), (1000, 500), (300, 300), (150, 350), (600, 400)]
    with maxinstr.session(run_dir, warmup=0, scenario="util_windows"):
        time.sleep(0.6)
        for i, (busy_ms, idle_ms) in enumerate(pattern):
            with maxinstr.stage(f"busy_{busy_ms}ms", step=i, stream=stream):
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < busy_ms / 1e3:
                    for _ in range(8):
                        a = (a @ a).clamp_(-1, 1)
                    torch.cuda.synchronize()
            with maxinstr.stage(f"idle_{idle_ms}ms", step=i):
                time.sleep(idle_ms / 1e3)
        time.sleep(1.2)  # let the driver publish the windows of the last stages


def busy_fraction(iv: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Share of each [a, b) inside the union of intervals iv (sorted, disjoint)."""
    s, e = iv[:, 0].astype(np.float64), iv[:, 1].astype(np.float64)
    cum = np.concatenate(([0.0], np.cumsum(e - s)))
    edges = np.empty(2 * len(s))
    edges[0::2], edges[1::2] = s, e
    f = np.empty(2 * len(s))
    f[0::2], f[1::2] = cum[:-1], cum[1:]
    base = edges[0]
    ov = np.interp(b - base, edges - base, f) - np.interp(a - base, edges - base, f)
    return ov / np.maximum(b - a, 1)


def analyse(run_dir: Path, busy_prefix: str = "busy") -> dict:
    import maxinstr
    from maxinstr.analyze.report import build_report
    from maxinstr.sample import attribute as att

    run = maxinstr.load(run_dir)
    names = list(run.names)
    st = run.stages
    busy = np.array([names[i].startswith(busy_prefix) for i in st["name_id"]])
    ok = busy & (st["gpu_start_ns"] > 0) & (st["gpu_end_ns"] > st["gpu_start_ns"])
    iv = np.stack([st["gpu_start_ns"][ok], st["gpu_end_ns"][ok]], axis=1).astype(np.int64)
    iv = iv[np.argsort(iv[:, 0])]
    (smp,) = run.samples.values()
    dev = smp.for_device(0)
    t = dev.t_ns.astype(np.int64)
    out: dict = {"busy_stages_timed": int(ok.sum()), "rows": int(len(t))}

    # utilization: detected updates (value changes), brackets (row before, row at)
    u = dev.rows["gpu_util_pct"].astype(np.float64)
    fin = np.isfinite(u)
    tu, vu = t[fin], u[fin]
    ch = np.nonzero(np.diff(vu) != 0)[0] + 1
    upd = (tu[ch - 1] + tu[ch]) // 2
    out["util_updates"] = int(len(upd))
    out["util_period_ms"] = float(np.median(np.diff(upd)) / MS) if len(upd) > 1 else None
    best = None
    for lag in range(0, 201, 5):
        for win in range(40, 301, 10):
            pred = 100 * busy_fraction(iv, (upd - (lag + win) * MS).astype(np.float64), (upd - lag * MS).astype(np.float64))
            err = float(np.mean(np.abs(pred - vu[ch])))
            if best is None or err < best[0]:
                best = (err, lag, win)
    out["util_fit"] = {"mae_pct": best[0], "lag_ms": best[1], "window_ms": best[2]}

    # GPM: value at row t covers [t_prev, t], shifted back by lag; plateau from the busy rows
    g = dev.rows["sm_active_pct"].astype(np.float64)
    gm = (dev.flags & 1) != 0
    tg, vg = t[gm], g[gm]
    if len(tg) > 3:
        plateau = float(np.percentile(vg[1:], 95))
        bestg = None
        for lag in range(0, 301, 5):
            pred = plateau * busy_fraction(iv, (tg[:-1] - lag * MS).astype(np.float64), (tg[1:] - lag * MS).astype(np.float64))
            err = float(np.nanmean(np.abs(pred - vg[1:])))
            if bestg is None or err < bestg[0]:
                bestg = (err, lag)
        out["gpm_fit"] = {"mae_pct": bestg[0], "lag_ms": bestg[1], "plateau_pct": plateau}
    out["maxinstr_constants_ms"] = {"util_lag": att.NVML_UTIL_LAG_NS / MS, "gpm_lag": att.NVML_GPM_LAG_NS / MS}

    rep = build_report(run=run_dir)
    out["stages"] = {s["name"]: {k: (s.get("samples") or {}).get(k) for k in
                                 ("gpu_util_pct_mean", "sm_active_pct_mean", "util_window_share", "window_limited")}
                     for s in rep["stages"]}
    return out


def main() -> int:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    if len(sys.argv) > 3 and sys.argv[2] == "--analyse":  # CPU dry run: RUN_DIR BUSY_STAGE_PREFIX
        res = analyse(Path(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "busy")
    else:
        run_dir = out_dir / "square-run"
        workload(run_dir)
        res = analyse(run_dir)
    (out_dir / "util_windows.json").write_text(json.dumps(res, indent=1))
    uf, gf = res["util_fit"], res.get("gpm_fit") or {}
    print(f"rows {res['rows']}, busy stages timed {res['busy_stages_timed']}, util updates {res['util_updates']}, "
          f"period {res['util_period_ms']} ms")
    print(f"FIT util: lag {uf['lag_ms']} ms, window {uf['window_ms']} ms (MAE {uf['mae_pct']:.1f} %)")
    if gf:
        print(f"FIT gpm: lag {gf['lag_ms']} ms (MAE {gf['mae_pct']:.1f} %, plateau {gf['plateau_pct']:.0f} %)")
    print(f"maxinstr uses: {res['maxinstr_constants_ms']}")
    for name, s in res["stages"].items():
        print(f"  {name:12s} {s}")
    rc = 0
    checks = [
        ("period 200 ms (H200)", res["util_period_ms"] is not None and abs(res["util_period_ms"] - 200) < 20),
        ("util lag within 30 ms of the constant", abs(uf["lag_ms"] - res["maxinstr_constants_ms"]["util_lag"]) <= 30),
        ("gpm lag within 40 ms of the constant", bool(gf) and abs(gf["lag_ms"] - res["maxinstr_constants_ms"]["gpm_lag"]) <= 40),
    ]
    for name, s in res["stages"].items():
        if name.startswith("busy") and s["gpu_util_pct_mean"] is not None and not s["window_limited"]:
            checks.append((f"{name}: util > 60 and >= SM activity - 5",
                           s["gpu_util_pct_mean"] > 60 and s["gpu_util_pct_mean"] >= (s["sm_active_pct_mean"] or 0) - 5))
    for what, ok in checks:
        print(("CHECK ok   " if ok else "CHECK FAIL ") + what)
        rc |= not ok
    return rc


if __name__ == "__main__":
    sys.exit(main())
