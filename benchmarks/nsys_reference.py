"""Per-stage-instance kernel counts and times from an nsys capture of a maxinstr program, as JSON:
the reference that another source of the same program's kernels (a torch.profiler trace, an
in-process collection of another run) is held to in tests, without carrying the capture.

    python benchmarks/nsys_reference.py RUN_DIR TRACE.sqlite > reference.json

Stage instances are listed per stage name in start order, each as [kernels, kernel_ns], as
maxinstr attributes them (all rules).
"""

from __future__ import annotations

import json
import sys

import numpy as np

from maxinstr.attribute import attribute
from maxinstr.rundir import load
from maxinstr.traces import open_trace


def reference(run_dir: str, trace_path: str) -> dict:
    run = load(run_dir)
    att = attribute(open_trace(trace_path), run=run)
    by_record = {int(r): i for i, r in enumerate(att.range_record_id) if r >= 0}
    names = np.asarray(run.stage_names(), dtype=object)
    stages: dict[str, list[list[int]]] = {}
    for k in np.argsort(run.stages["host_start_ns"], kind="stable"):
        r = by_record.get(int(run.stages["id"][k]))
        stages.setdefault(str(names[k]), []).append([-1, -1] if r is None else [int(att.kernel_count[r]), int(att.kernel_ns[r])])
    return {"source": trace_path, "run": run_dir, "stages": stages}


if __name__ == "__main__":
    json.dump(reference(sys.argv[1], sys.argv[2]), sys.stdout)
    sys.stdout.write("\n")
