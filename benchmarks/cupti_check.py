"""In-process kernels (kernels=True) against nsys on the same workload (issue 9 proof).

    python benchmarks/cupti_check.py run RUN_DIR [--kernels]     # the workload, in a session
    python benchmarks/cupti_check.py compare INPROC_RUN NSYS_RUN NSYS_SQLITE
    python benchmarks/cupti_check.py dump RUN_DIR OUT_DIR        # raw activity files (fixture)

The workload (torch on CUDA): stages ``copy_in`` (pinned 64 MiB host-to-device copy + a
256 MiB cudaMemsetAsync), ``matmul`` (bf16 4096^3 products), ``pointwise`` (large elementwise kernels),
``copy_out`` (device-to-host copy), ``step`` around them; 2 warm-up steps then 6 steady ones.
``compare`` sums kernel count / kernel GPU ns / copies / sets per stage name over the steady
steps, from the in-process records (no --trace) and from the nsys SQLite joined to its own run,
and checks: counts equal, GPU ns within 1%. Exit status 0 only when both hold.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

WARMUP = 2
STEPS = 8


def workload(run_dir: str, kernels: bool) -> None:
    import torch

    import maxinstr

    dev = "cuda"
    torch.manual_seed(0)
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    big = torch.randn(1 << 25, device=dev)
    host = torch.randn(1 << 24).pin_memory()
    back = torch.empty(1 << 24).pin_memory()
    stream = torch.cuda.current_stream()
    try:
        import cupy

        def memset(nbytes: int):  # a real cudaMemsetAsync (torch's zero_ is a fill kernel)
            with cupy.cuda.ExternalStream(stream.cuda_stream):
                return cupy.zeros(nbytes, dtype=cupy.uint8)
    except Exception:  # noqa: BLE001
        memset = None
    torch.cuda.synchronize()
    with maxinstr.session(run_dir, warmup=WARMUP, kernels=kernels, sample_hz=0):
        for step in range(STEPS):
            with maxinstr.stage("step", step=step):
                with maxinstr.stage("copy_in"):
                    g = host.to(dev, non_blocking=True)
                    if memset is not None:
                        z = memset(1 << 28)
                with maxinstr.stage("matmul"):
                    c = a
                    for _ in range(4):
                        c = (c @ b) * 0.01
                with maxinstr.stage("pointwise"):
                    y = torch.sin(big) + torch.cos(big)
                    y = y * 0.5 + g.repeat(2)
                with maxinstr.stage("copy_out"):
                    back.copy_(g, non_blocking=True)
            torch.cuda.synchronize()
    print(f"workload done: {run_dir} kernels={kernels}")


def per_stage(run_dir: str, trace_path: str | None) -> dict[str, dict[str, float]]:
    """{stage name: {kernels, kernel_ns, memcpy, memset, ops}} over the steady steps."""
    from maxinstr.analyze.report import analyze

    an = analyze(run=run_dir, trace=trace_path)
    att, run = an.attribution, an.run
    if att is None:
        raise SystemExit(f"{run_dir}: no kernels (trace {trace_path}): {an.report['sources']['notes']}")
    st = run.stages
    rid = att.range_record_id
    pos = {int(i): k for k, i in enumerate(st["id"])}
    names = run.stage_names()
    out: dict[str, dict[str, float]] = {}
    for r in np.flatnonzero(rid >= 0):
        k = pos.get(int(rid[r]))
        if k is None or st["step"][k] < WARMUP:
            continue
        row = out.setdefault(str(names[k]), {"instances": 0, "kernels": 0, "kernel_ns": 0, "memcpy_ns": 0, "memset_ns": 0, "launches": 0})
        row["instances"] += 1
        row["kernels"] += int(att.kernel_count[r])
        row["kernel_ns"] += int(att.kernel_ns[r])
        row["memcpy_ns"] += int(att.memcpy_ns[r])
        row["memset_ns"] += int(att.memset_ns[r])
        row["launches"] += int(att.launch_count[r])
    out["_notes"] = an.report["sources"]["notes"]  # type: ignore[assignment]
    out["_format"] = an.report["sources"]["trace_format"]  # type: ignore[assignment]
    return out


def compare(inproc: str, nsys_run: str, sqlite: str | None) -> int:
    """Per stage, the in-process run against ``nsys_run`` joined to ``sqlite`` (or, with
    ``sqlite`` "-", against another in-process run: the run-to-run noise floor)."""
    a = per_stage(inproc, None)
    b = per_stage(nsys_run, None if sqlite in (None, "-") else sqlite)
    print(f"in-process source: {a.pop('_format')}; reference source: {b.pop('_format')}")
    print("in-process notes:", *a.pop("_notes"), sep="\n  ")
    print("reference notes:", *b.pop("_notes"), sep="\n  ")
    ok = True
    print(f"{'stage':10} {'inst':>4} {'kern(in)':>9} {'kern(ref)':>10} {'launch in/ref':>15} "
          f"{'kernel ms in':>12} {'ref':>9} {'ratio':>7} {'copy ratio':>10} {'set ratio':>9}")  # fmt: skip
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if x is None or y is None:
            print(f"{name}: only in {'the reference' if x is None else 'in-process'}")
            ok = False
            continue

        def ratio(p: float, q: float) -> float:
            return p / q if q else (1.0 if p == q else float("inf"))

        rk, rc, rs = ratio(x["kernel_ns"], y["kernel_ns"]), ratio(x["memcpy_ns"], y["memcpy_ns"]), ratio(x["memset_ns"], y["memset_ns"])
        counts_equal = x["kernels"] == y["kernels"] and x["launches"] == y["launches"] and x["instances"] == y["instances"]
        times_ok = all(abs(r - 1) <= 0.01 for r in (rk, rc, rs))
        ok &= counts_equal and times_ok
        print(f"{name:10} {x['instances']:>4} {x['kernels']:>9} {y['kernels']:>10} {x['launches']:>7}/{y['launches']:<7} "
              f"{x['kernel_ns'] / 1e6:>12.3f} {y['kernel_ns'] / 1e6:>9.3f} {rk:>7.4f} {rc:>10.4f} {rs:>9.4f}"
              f"{'' if counts_equal else '  COUNTS DIFFER'}{'' if times_ok else '  TIME > 1%'}")  # fmt: skip
    print("RESULT:", "PASS (counts equal, GPU times within 1%)" if ok else "FAIL")
    return 0 if ok else 1


def dump(run_dir: str, out_dir: str) -> None:
    """Copy the raw activity files of the run's part, plus what the fixture test needs."""
    from maxinstr.rundir import load
    from maxinstr.traces.inprocess import read_run

    run = load(run_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    part = Path(run_dir) / "parts" / run.parts[0]["name"]
    for f in ("activity.bin", "activity_names.jsonl", "activity.json", "stages.bin", "strings.jsonl", "attrs.jsonl", "part.json"):
        if (part / f).is_file():
            shutil.copy(part / f, out / f)
    shutil.copy(Path(run_dir) / "meta.json", out / "meta.json")
    trace, notes = read_run(run)
    assert trace is not None, notes
    from maxinstr.attribute.attribute import attribute

    att = attribute(trace, run)
    expect = {"ops": int(len(trace.ops)), "calls": int(len(trace.calls)), "ranges": int(len(trace.ranges)),
              "kernels": int((trace.ops.kind == 0).sum()), "memcpy": int((trace.ops.kind == 1).sum()),
              "memset": int((trace.ops.kind == 2).sum()), "attributed": int((att.op_range >= 0).sum()),
              "kernel_ns_total": int((trace.ops.end_ns - trace.ops.start_ns)[trace.ops.kind == 0].sum()),
              "join": att.join_method.name}  # fmt: skip
    (out / "expected.json").write_text(json.dumps(expect, indent=1))
    print("fixture:", out, expect)


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("run_dir")
    r.add_argument("--kernels", action="store_true")
    c = sub.add_parser("compare")
    c.add_argument("inproc")
    c.add_argument("nsys_run")
    c.add_argument("sqlite")
    d = sub.add_parser("dump")
    d.add_argument("run_dir")
    d.add_argument("out_dir")
    args = ap.parse_args()
    if args.cmd == "run":
        workload(args.run_dir, args.kernels)
        return 0
    if args.cmd == "compare":
        return compare(args.inproc, args.nsys_run, args.sqlite)
    dump(args.run_dir, args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
