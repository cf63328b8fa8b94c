"""`max generate` bare against `max generate` under `maxinstr run` (the max preset's wrap
points; --profiler none here, so the cost is the stages' own; bare runs with MAX's telemetry on,
its default, and off, as the preset sets it): MAX's own throughput lines
(token generation, prompt eval) and the process's wall time, configurations interleaved and
rotated round by round (harness.py).

    python benchmarks/max_generate_overhead.py MODEL_DIR [--rounds 4] [--tokens 64] [--devices cpu]
    (MODEL_DIR: examples/tiny_llama.py's; its graphs compiled once before, so no run compiles)

Prints a table (medians over the rounds, and each configuration's per-round ratio to bare) and a
RESULT line. On a GPU add `--devices gpu` and drop `--quantization-encoding float32` with
`--encoding ''`; there `maxinstr run` adds nsys unless `--profiler none` stays (it does here).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from harness import Stats, emit_result, interleave, load_average, print_table, ratios, run_child

TPUT = {
    "decode_tok_s": re.compile(r"Eval throughput \(token-generation\): ([0-9.]+) tokens per second"),
    "prefill_tok_s": re.compile(r"Prompt eval throughput \(context-encoding\): ([0-9.]+) tokens per second"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--devices", default="cpu")
    ap.add_argument("--encoding", default="float32", help="--quantization-encoding ('' to leave it out)")
    a = ap.parse_args()
    max_exe = shutil.which("max")
    if max_exe is None:
        sys.exit("max_generate_overhead: no `max` on PATH (pip install '.[max-pipelines]')")
    gen = [max_exe, "generate", "--model-path", str(a.model), "--devices", a.devices, "--prompt", "hello world",
           "--max-new-tokens", str(a.tokens), "--ignore-eos"] + (["--quantization-encoding", a.encoding] if a.encoding else [])
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    tmp = Path(tempfile.mkdtemp(prefix="max-overhead-"))
    # the preset turns MAX's telemetry off (MAX_SERVE_DISABLE_TELEMETRY=1): bare runs both ways, so
    # that what maxinstr costs is read against "bare, telemetry off" and telemetry's own cost apart
    commands = {
        "bare": gen,
        "bare, telemetry off": gen,
        "maxinstr run": [sys.executable, "-m", "maxinstr", "run", "--profiler", "none", "-y", "-q", "--no-report",
                         "-o", str(tmp / "run"), "--", *gen],
    }
    env.pop("MAX_SERVE_DISABLE_TELEMETRY", None)  # bare: MAX's default (the preset sets it for maxinstr run)
    envs = {name: dict(env, MAX_SERVE_DISABLE_TELEMETRY="1") if "telemetry off" in name else env for name in commands}

    def measure(name: str, r: int) -> dict[str, float | None]:
        child = run_child(commands[name], env=envs[name], limit_s=900)
        text = child.stdout + child.stderr
        if name != "bare":
            text += (tmp / "run" / "child.log").read_text(errors="replace") if (tmp / "run" / "child.log").exists() else ""
        out: dict[str, float | None] = {k: float(m.group(1)) if (m := rx.search(text)) else None for k, rx in TPUT.items()}
        out["wall_s"] = child.wall_s if child.rc == 0 else None
        return out

    samples = interleave(list(commands), a.rounds, measure)
    rows = []
    result: dict[str, dict[str, float]] = {}
    for metric in ("decode_tok_s", "prefill_tok_s", "wall_s"):
        series = {name: [s[metric] for s in runs] for name, runs in samples.items()}
        rel = ratios(series, "bare, telemetry off")
        for name, values in series.items():
            got = [v for v in values if v is not None]
            med = Stats.of(got).median if got else float("nan")
            rows.append([metric, name, len(got), med, rel[name].median])
            result.setdefault(name, {})[metric] = med
            result[name][f"{metric}_ratio"] = rel[name].median
    print(f"max generate, {a.tokens} tokens, {a.devices}, {a.rounds} rounds rotated; {load_average()}")
    print_table(["metric", "configuration", "n", "median", "ratio to bare, telemetry off (median of rounds)"], rows,
                [None, None, None, ".2f", ".3f"])
    emit_result(result)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
