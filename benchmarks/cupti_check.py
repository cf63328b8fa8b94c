"""In-process kernels (kernels=True) against nsys on the same workload (issue 9 proof).

    python benchmarks/cupti_check.py run RUN_DIR [--kernels]     # the workload, in a session
    python benchmarks/cupti_check.py compare INPROC_RUN NSYS_RUN NSYS_SQLITE [--noise INPROC_RUN2]
    python benchmarks/cupti_check.py dump RUN_DIR OUT_DIR        # raw activity files (fixture)

The workload (torch on CUDA): stages ``copy_in`` (pinned 64 MiB host-to-device copy + a
256 MiB cudaMemsetAsync), ``matmul`` (bf16 4096^3 products), ``pointwise`` (large elementwise kernels),
``copy_out`` (device-to-host copy), ``step`` around them; 2 warm-up steps then 6 steady ones.
``compare`` sums kernel count / kernel GPU ns / copies / sets per stage name over the steady
steps, from the in-process records (no --trace) and from the nsys SQLite joined to its own run,
and checks:

* kernels: count, launches and instances equal; kernel GPU ns within 1% (issue 9's test);
* copies and sets: count (copies + sets) and bytes of each equal; GPU ns within 1%, or else
  within the run-to-run noise floor of those times. Copies and sets here take a few us each,
  and their times move by several % between two runs of the same program (two kernels=True
  runs differ as much as kernels=True and nsys do), so a bare 1% would test the noise, not the
  collector. The floor, per stage and quantity, is the larger of: three standard deviations of
  the difference of two sums of n instances (from the spread of the instances in each run:
  3 * sqrt(n * (sd_a^2 + sd_b^2))), and the difference between two kernels=True runs
  (``--noise``, the same program run again), when given. Both are printed.

Exit status 0 only when all hold.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

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
                        _buf = memset(1 << 28)  # held until the next step's
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


def per_stage(run_dir: str, trace_path: str | None) -> dict[str, dict[str, Any]]:
    """{stage name: {instances, kernels, kernel_ns, launches, copyset (count), memcpy_bytes,
    memset_bytes, memcpy_ns, memset_ns, memcpy_each, memset_each (per instance)}} over the
    steady steps."""
    from maxinstr.analyze.report import analyze

    an = analyze(run=run_dir, trace=trace_path)
    att, run = an.attribution, an.run
    if att is None:
        raise SystemExit(f"{run_dir}: no kernels (trace {trace_path}): {an.report['sources']['notes']}")
    st = run.stages
    rid = att.range_record_id
    pos = {int(i): k for k, i in enumerate(st["id"])}
    names = run.stage_names()
    out: dict[str, dict[str, Any]] = {}
    for r in np.flatnonzero(rid >= 0):
        k = pos.get(int(rid[r]))
        if k is None or st["step"][k] < WARMUP:
            continue
        row = out.setdefault(str(names[k]), {"instances": 0, "kernels": 0, "kernel_ns": 0, "launches": 0, "copyset": 0,
                                             "memcpy_bytes": 0, "memset_bytes": 0, "memcpy_ns": 0, "memset_ns": 0,
                                             "memcpy_each": [], "memset_each": []})  # fmt: skip
        row["instances"] += 1
        row["kernels"] += int(att.kernel_count[r])
        row["kernel_ns"] += int(att.kernel_ns[r])
        row["launches"] += int(att.launch_count[r])
        row["copyset"] += int(att.op_count[r]) - int(att.kernel_count[r])
        for q in ("memcpy", "memset"):
            row[f"{q}_bytes"] += int(getattr(att, f"{q}_bytes")[r])
            row[f"{q}_ns"] += int(getattr(att, f"{q}_ns")[r])
            row[f"{q}_each"].append(int(getattr(att, f"{q}_ns")[r]))
    out["_notes"] = an.report["sources"]["notes"]  # type: ignore[assignment]
    out["_format"] = an.report["sources"]["trace_format"]  # type: ignore[assignment]
    return out


def _ratio(p: float, q: float) -> float:
    return p / q if q else (1.0 if p == q else float("inf"))


def noise_floor_ns(x: dict[str, Any], y: dict[str, Any], q: str, z: dict[str, Any] | None) -> tuple[float, float, float | None]:
    """(floor, statistical part, measured part) in ns for the difference of the sums ``q``
    ("memcpy"/"memset") of stage rows x and y; z: the stage's row in a second run of x's program."""
    n = min(len(x[f"{q}_each"]), len(y[f"{q}_each"]))
    sd = [float(np.std(v[f"{q}_each"], ddof=1)) if len(v[f"{q}_each"]) > 1 else 0.0 for v in (x, y)]
    stat = 3.0 * float(np.sqrt(n * (sd[0] ** 2 + sd[1] ** 2)))
    measured = abs(z[f"{q}_ns"] - x[f"{q}_ns"]) if z is not None else None
    return max(stat, measured or 0.0), stat, measured


def compare(inproc: str, nsys_run: str, sqlite: str | None, noise: str | None = None) -> int:
    """Per stage, the in-process run against ``nsys_run`` joined to ``sqlite`` (or, with
    ``sqlite`` "-", against another in-process run: the run-to-run noise floor). ``noise``: a
    second kernels=True run of the same program, for the copy/set noise floor."""
    a = per_stage(inproc, None)
    b = per_stage(nsys_run, None if sqlite in (None, "-") else sqlite)
    c = per_stage(noise, None) if noise else None
    print(f"in-process source: {a.pop('_format')}; reference source: {b.pop('_format')}")
    print("in-process notes:", *a.pop("_notes"), sep="\n  ")
    print("reference notes:", *b.pop("_notes"), sep="\n  ")
    if c is not None:
        c.pop("_format"), c.pop("_notes")
    ok_kernels = ok_copies = True
    floors: list[str] = []
    print(f"{'stage':10} {'inst':>4} {'kern(in)':>9} {'kern(ref)':>10} {'launch in/ref':>15} "
          f"{'kernel ms in':>12} {'ref':>9} {'ratio':>7} {'copy ratio':>10} {'set ratio':>9}")  # fmt: skip
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if x is None or y is None:
            print(f"{name}: only in {'the reference' if x is None else 'in-process'}")
            ok_kernels = False
            continue
        rk, rc, rs = (_ratio(x[f], y[f]) for f in ("kernel_ns", "memcpy_ns", "memset_ns"))
        counts_equal = x["kernels"] == y["kernels"] and x["launches"] == y["launches"] and x["instances"] == y["instances"]
        kernel_ok = abs(rk - 1) <= 0.01
        ok_kernels &= counts_equal and kernel_ok
        copies_equal = all(x[f] == y[f] for f in ("copyset", "memcpy_bytes", "memset_bytes"))
        ok_copies &= copies_equal
        verdicts = []
        for q, r in (("memcpy", rc), ("memset", rs)):
            if abs(r - 1) <= 0.01:
                continue
            floor, stat, measured = noise_floor_ns(x, y, q, c.get(name) if c else None)
            diff = abs(x[f"{q}_ns"] - y[f"{q}_ns"])
            within = diff <= floor
            ok_copies &= within
            verdicts.append(f"{'copy' if q == 'memcpy' else 'set'} {'within noise' if within else 'TIME > NOISE'}")
            floors.append(f"  {name:10} {q}: |in - ref| {diff / 1e3:8.2f} us of {y[f'{q}_ns'] / 1e3:8.2f} us ({abs(r - 1):.1%}); "
                          f"noise floor {floor / 1e3:8.2f} us = max(3 sd of the sums {stat / 1e3:.2f} us, "
                          f"second kernels=True run {'-' if measured is None else f'{measured / 1e3:.2f} us'}) "
                          f"-> {'within noise' if within else 'BEYOND NOISE'}")  # fmt: skip
        print(f"{name:10} {x['instances']:>4} {x['kernels']:>9} {y['kernels']:>10} {x['launches']:>7}/{y['launches']:<7} "
              f"{x['kernel_ns'] / 1e6:>12.3f} {y['kernel_ns'] / 1e6:>9.3f} {rk:>7.4f} {rc:>10.4f} {rs:>9.4f}"
              f"{'' if counts_equal else '  COUNTS DIFFER'}{'' if kernel_ok else '  KERNEL TIME > 1%'}"
              f"{'' if copies_equal else '  COPY/SET COUNT OR BYTES DIFFER'}{('  ' + ', '.join(verdicts)) if verdicts else ''}")  # fmt: skip
    if floors:
        print("copy/set times off by more than 1%, against the run-to-run noise floor of those times:", *floors, sep="\n")
    print("RESULT kernels:", "PASS (counts and launches equal, kernel GPU times within 1%)" if ok_kernels else "FAIL")
    print("RESULT copies/sets:", "PASS (count and bytes equal; times within 1% or within the run-to-run noise floor)"
          if ok_copies else "FAIL")  # fmt: skip
    ok = ok_kernels and ok_copies
    print("RESULT:", "PASS" if ok else "FAIL")
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
    c.add_argument("--noise", default=None, help="a second kernels=True run of the same program (copy/set noise floor)")
    d = sub.add_parser("dump")
    d.add_argument("run_dir")
    d.add_argument("out_dir")
    args = ap.parse_args()
    if args.cmd == "run":
        workload(args.run_dir, args.kernels)
        return 0
    if args.cmd == "compare":
        return compare(args.inproc, args.nsys_run, args.sqlite, args.noise)
    dump(args.run_dir, args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
