"""`max generate` (or any `max` subcommand) inside a maxinstr session with kernels=True: the
in-process CUPTI collector beside the max preset's stages, for comparing per-stage kernels with an
nsys capture of the same command (benchmarks/device/64-max-pipelines.sh).

    maxinstr run --profiler none --preset max -o RUN -- python benchmarks/max_generate_kernels.py \\
        generate --model-path DIR --devices gpu --prompt "hello world" --max-new-tokens 64 --ignore-eos

`maxinstr run` opens the run's session; this script's session joins it and asks for kernels=True
there (docs/sessions.md). MAX's CLI re-executes itself for jemalloc with the same argv, so this
script runs again in the new image, before any stage (nothing is recorded before the execve).
"""

from __future__ import annotations

import os
import sys

import maxinstr


def main() -> int:
    from max._entrypoints.pipelines import main as max_main

    run_dir = os.environ.get("MAXINSTR_RUN_DIR") or "runs/max-generate-kernels"
    with maxinstr.session(run_dir, kernels=True):
        sys.argv = ["max", *sys.argv[1:]]
        try:
            max_main()  # click: ends with SystemExit
        except SystemExit as done:
            return int(done.code or 0) if not isinstance(done.code, str) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
