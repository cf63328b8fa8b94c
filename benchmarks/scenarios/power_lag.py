"""Scenario for per-stage power (issue 17, point 9): a busy stage, then an idle one, twice.

``busy`` runs bf16 8192^3 matmuls for 1.5 s; ``idle`` sleeps 1 s. NVML's power reading is a
trailing average, so the idle stage used to read the busy stage's power (448 W, throttled 48 %)
while its own energy said 173 J over 1.0 s. The report must give each stage the energy
counter's power and keep the busy stage's power-cap bits out of the idle one. Needs a GPU and
torch; prints the per-stage numbers and exits 1 when the idle stage does not read its own power.

    python3 benchmarks/scenarios/power_lag.py --run-dir /tmp/power_lag
    maxinstr report /tmp/power_lag
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import maxinstr
from maxinstr.analyze.report import build_report


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--busy-s", type=float, default=1.5)
    ap.add_argument("--idle-s", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    with maxinstr.session(args.run_dir, warmup=0, scenario="power_lag"):
        for _ in range(args.rounds):
            with maxinstr.stage("busy", stream=stream):
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < args.busy_s:
                    for _ in range(8):
                        a @ b
                    torch.cuda.synchronize()
            with maxinstr.stage("idle", stream=stream):
                time.sleep(args.idle_s)
    report = build_report(run=args.run_dir)
    rows = {s["name"]: s.get("samples") or {} for s in report["stages"]}
    for name in ("busy", "idle"):
        s = rows.get(name, {})
        print(f"{name}: power {s.get('power_w_mean')} W ({s.get('power_source')}), NVML reading "
              f"{s.get('power_reading_w_mean')} W, energy/instance {s.get('energy_per_instance_j')} J, "
              f"util {s.get('gpu_util_pct_mean')} %, throttled {s.get('throttled_share')} "
              f"(lagged power-cap samples {s.get('throttle_lagged_samples')})")
    busy, idle = rows.get("busy", {}), rows.get("idle", {})
    ok = (idle.get("power_source") == "energy" and busy.get("power_w_mean") and idle.get("power_w_mean")
          and idle["power_w_mean"] < 0.6 * busy["power_w_mean"] and (idle.get("throttled_share") or 0) < 0.05)
    print("PASS" if ok else "FAIL", "idle stage reads its own power" if ok else "idle stage reads another's power")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
