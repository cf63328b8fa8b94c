"""maxinstr demo: a small decode-like pipeline, instrumented, on whatever this machine has.

    python examples/demo.py [RUN_DIR]          # default: runs/demo

It runs a toy "language model" made of numpy matrix products (the CPU stands in for a GPU
when there is none), marks its stages with `maxinstr.stage`, records them in a run directory
with `maxinstr.session`, reads the run back with `maxinstr.load`, and prints the per-stage
report (`maxinstr report RUN_DIR`): warm-up apart from steady state, median and p90 host time,
a ranking by self time, and the diagnosis.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

import maxinstr

WARMUP = 2
STEPS = 24
LAYERS = 4
HIDDEN = 256


class ToyModel:
    """Matrix products shaped like a transformer decode step (sizes kept CPU-friendly)."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        scale = 1.0 / np.sqrt(HIDDEN)
        self.attn = [rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) * scale for _ in range(LAYERS)]
        self.mlp_up = [rng.standard_normal((HIDDEN, 4 * HIDDEN)).astype(np.float32) * scale for _ in range(LAYERS)]
        self.mlp_down = [rng.standard_normal((4 * HIDDEN, HIDDEN)).astype(np.float32) * scale for _ in range(LAYERS)]
        self.vocab = rng.standard_normal((HIDDEN, 4096)).astype(np.float32) * scale
        self.cache: list[np.ndarray] = []

    def layer(self, i: int, x: np.ndarray) -> np.ndarray:
        with maxinstr.stage("attention", layer=i):
            x = x + np.tanh(x @ self.attn[i])
        with maxinstr.stage("mlp", layer=i):
            x = x + np.maximum(x @ self.mlp_up[i], 0) @ self.mlp_down[i]
        return x / (np.linalg.norm(x, axis=-1, keepdims=True) + 1e-6)

    @maxinstr.stage("prefill")
    def prefill(self, tokens: np.ndarray) -> np.ndarray:
        x = np.eye(HIDDEN, dtype=np.float32)[tokens % HIDDEN]
        for i in range(LAYERS):
            x = self.layer(i, x)
        self.cache = [x]
        return x[-1:]

    def decode(self, x: np.ndarray, step: int) -> np.ndarray:
        with maxinstr.stage("decode", step=step):
            if step < WARMUP:
                time.sleep(0.004)  # stands in for compilation / cache fill on the first steps
            for i in range(LAYERS):
                x = self.layer(i, x)
            with maxinstr.stage("sample"):
                logits = x @ self.vocab
                token = int(np.argmax(logits))
            maxinstr.mark("token", id=token)
        return x


def run(run_dir: Path) -> None:
    model = ToyModel()
    with maxinstr.session(run_dir, warmup=WARMUP, dtype="float32", model="toy-4L-256", steps=STEPS):
        with maxinstr.stage("tokenize"):
            tokens = np.frombuffer(b"where does the time go, stage by stage?", dtype=np.uint8).astype(np.int64)
        x = model.prefill(tokens)
        for step in range(STEPS):
            x = model.decode(x, step)


def summarize(run_dir: Path) -> None:
    """What the run directory holds, read back with ``maxinstr.load`` (the same data the report
    below is computed from; ``run.stages`` is a numpy structured array, one row per record)."""
    run = maxinstr.load(run_dir)
    marks = int(((run.stages["flags"] & 4) != 0).sum())  # instant marks have no duration
    gpus = ", ".join(g.get("name", "?") for g in run.meta.get("gpus") or []) or "none seen (host times only)"
    print(f"run directory: {run_dir}: {len(run.stages) - marks} stage records and {marks} marks; GPUs: {gpus}")
    print(f"read it back with maxinstr.load({str(run_dir)!r}); report it with `maxinstr report {run_dir}`")
    for note in run.notes:
        print(f"note: {note}")


def report(run_dir: Path) -> None:
    """The same run through maxinstr's per-stage report (what `maxinstr report RUN_DIR` prints)."""
    from maxinstr.analyze.report import build_report
    from maxinstr.render.text import print_report

    print_report(build_report(run=run_dir))


def main(argv: list[str]) -> int:
    run_dir = Path(argv[1] if len(argv) > 1 else "runs/demo")
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)  # a fresh run each time
    run(run_dir)
    summarize(run_dir)
    report(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
