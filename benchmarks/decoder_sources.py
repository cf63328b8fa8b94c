"""Every way a PyTorch user can watch a decoder, against the decoder alone: tokens/s and stderr.

    python benchmarks/decoder_sources.py [--rounds 3] [--out DIR] [-- EXTRA_DECODER_ARGS]

Runs examples/torch_decode.py (default here: 6 layers, hidden 1024, bf16, KV cache, 3 requests
of 64 steps, batch 1) in fresh processes, one per configuration per round, the order rotated
each round:

  bare        MAXINSTR_DISABLE=1: the stages are no-ops (the program as if uninstrumented)
  default     maxinstr's session as the example has it (stages with GPU events and NVTX)
  kernels     the same with kernels=True (CUPTI in the process)
  run         `maxinstr run --profiler none` (the start-up hook, the run's sampler, no profiler)
  nsys        `maxinstr run --capture all` (nsys -t cuda,nvtx around the whole run)
  torchprof   the program inside torch.profiler (CPU + CUDA activities)

A run's throughput is the mean decode tokens/s of its steady requests (all but the first, which
holds first-call work), as the example prints it. Printed: per configuration the median over
rounds and its ratio to bare's median, each round's ratio to that round's bare run, and the
lines each configuration wrote to stderr (a profiler must write none into the program's
output: maxinstr's own `maxinstr run` lines go to the run's log). JSON in OUT/sources.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
from pathlib import Path

from harness import bootstrap_ci, interleave, print_table, ratio, run_child, verdict

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "torch_decode.py"
DECODER_ARGS = ["--layers", "6", "--hidden", "1024", "--requests", "3", "--steps", "64", "--batch", "1", "--no-report"]
CONFIGS = ("bare", "default", "kernels", "run", "nsys", "torchprof")
_TPS = re.compile(r"decode tokens/s per request \[([^\]]*)\]")


def command(config: str, run_dir: Path, extra: list[str]) -> tuple[list[str], dict[str, str]]:
    py = [sys.executable, str(EXAMPLE), *DECODER_ARGS, *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAXINSTR_")}
    if config == "bare":
        env["MAXINSTR_DISABLE"] = "1"
        return [*py, "--run-dir", str(run_dir)], env
    if config == "kernels":
        return [*py, "--run-dir", str(run_dir), "--kernels"], env
    if config == "torchprof":
        return [*py, "--run-dir", str(run_dir), "--torch-profiler", str(run_dir) + ".pt.trace.json"], env
    if config == "nsys":
        return [sys.executable, "-m", "maxinstr", "run", "-y", "--quiet", "--no-report", "--capture", "all", "-o", str(run_dir), "--", *py], env
    if config == "run":
        return [sys.executable, "-m", "maxinstr", "run", "-y", "--quiet", "--no-report", "--profiler", "none", "-o", str(run_dir), "--", *py], env
    return [*py, "--run-dir", str(run_dir)], env


def steady_tokens_per_s(text: str) -> float | None:
    found = _TPS.findall(text)
    if not found:
        return None
    values = [float(v) for v in found[-1].split(",") if v.strip()]
    return sum(values[1:]) / len(values[1:]) if len(values) > 1 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("/tmp/decoder-sources"))
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--timeout", type=float, default=240)
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    configs = [c for c in args.configs.split(",") if c]
    args.out.mkdir(parents=True, exist_ok=True)

    def run(config: str, r: int) -> dict:
        run_dir = args.out / f"{config}-r{r + 1}"
        cmd, env = command(config, run_dir, extra)
        done = run_child(cmd, limit_s=args.timeout, env=env, cwd=REPO)
        stdout = done.stdout
        if config in ("nsys", "run"):  # the program's own output is in the run's child log
            log = run_dir / "child.log"
            stdout += log.read_text(errors="replace") if log.exists() else ""
        program_stderr = [ln for ln in done.stderr.splitlines() if not ln.startswith("maxinstr:")] if config in ("nsys", "run") else done.stderr.splitlines()
        row = {"round": r + 1, "rc": done.rc, "timed_out": done.timed_out, "wall_s": round(done.wall_s, 2),
               "tokens_per_s": steady_tokens_per_s(stdout), "stderr_lines": len(program_stderr),
               "stderr_head": program_stderr[:3]}
        status = f"no result within {args.timeout:g} s" if done.timed_out else f"rc={done.rc}"
        print(f"round {r + 1} {config:10s} {status} {row['tokens_per_s']} tok/s, "
              f"{len(program_stderr)} stderr lines, {done.wall_s:.1f} s", flush=True)
        return row

    results = interleave(configs, args.rounds, run)
    tps = {config: [row["tokens_per_s"] for row in rows] for config, rows in results.items()}
    bare = tps.get("bare", [None] * args.rounds)
    print()
    summary = {}
    table = []
    for config, rows in results.items():
        got = [v for v in tps[config] if v]
        med = statistics.median(got) if got else None
        vs_bare = ratio(tps[config], bare)  # per round: against that round's bare run
        of_medians = round(vs_bare.of_medians, 3) if not math.isnan(vs_bare.of_medians) else None
        per_round = [round(x, 3) for x in vs_bare.per_round]
        summary[config] = {"tokens_per_s_median": med, "vs_bare": of_medians, "per_round_vs_bare": per_round,
                           "stderr_lines": [row["stderr_lines"] for row in rows], "runs": rows}
        lo, hi = bootstrap_ci(vs_bare.per_round)
        summary[config]["per_round_vs_bare_median_ci90"] = [vs_bare.median, lo, hi]
        table.append([config, med, of_medians, f"{vs_bare.median:.3f} [{lo:.3f}..{hi:.3f}]", str(per_round),
                      str(summary[config]["stderr_lines"])])
    print_table(["configuration", "tok/s (median)", "vs bare", "per round: median [90% CI]", "per-round vs that round's bare",
                 "stderr lines"], table, ["", ".1f", ".3f"])
    print("\ntargets (issue 26), tok/s of the steady requests against bare, per round:")
    for config, target in (("kernels", 0.90), ("default", 0.99), ("run", 0.99)):
        if config in results and "bare" in results:
            v = verdict(f"{config} tok/s vs bare", ratio(tps[config], bare).per_round, target, at_least=True)
            summary.setdefault("verdicts", {})[config] = v.__dict__
            print(v.line())
    (args.out / "sources.json").write_text(json.dumps(summary, indent=1))
    return 0 if all(row["rc"] == 0 for rows in results.values() for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
