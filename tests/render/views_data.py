"""Inputs for the Perfetto and HTML view tests: real fixtures and real sessions.

``recorded_run`` records a real maxinstr session on this machine (CPU: host times only) with
the GPU sampler fed by a replay of REAL H200 samples (tests/render/data/h200_samples, recorded
by benchmarks/device/30-sampler.sh on the lent H200: 1 s idle, 1.5 s bf16 matmuls, 1 s tiny
kernels). The replay goes through the real sampler writer and reader, ten times faster than
recorded (a row a millisecond), with stages idle / matmul / tiny timed to the recorded phases,
so the views get a run directory with stage records and sampler rows on one clock.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[1] / "data"
SAMPLES = Path(__file__).resolve().parent / "data" / "h200_samples"
SPEEDUP = 10


def replay_backend():
    from maxinstr.sample import read_samples
    from maxinstr.sample.base import COL, Backend, Device, DeviceInfo

    rec = read_samples(SAMPLES)
    rows = rec.for_device(0).rows
    info = dict(rec.devices[0])
    metrics = [m for m in rec.metric_names if m in COL]

    class ReplayDevice(Device):
        def __init__(self) -> None:
            self.info = DeviceInfo(**{k: v for k, v in info.items() if k in DeviceInfo.__dataclass_fields__})

        def read(self, values, tick, now_ns):
            row = rows[min(tick, len(rows) - 1)]
            for m in metrics:
                v = float(row[m])
                if np.isfinite(v):
                    values[COL[m]] = v
            return int(row["flags"]), int(row["throttle"]), int(row["throttle_raw"])

    class ReplayBackend(Backend):
        name = "replay"

        def devices(self):
            return [ReplayDevice()]

    return ReplayBackend()


def phases_s() -> list[tuple[str, float]]:
    """(stage, replayed seconds) of the recorded phases."""
    marks = json.loads((SAMPLES / "phases.json").read_text())
    names = ["idle", "matmul", "tiny"]
    bounds = [marks[n] for n in names] + [marks["end"]]
    return [(n, (b - a) / 1e9 / SPEEDUP) for n, a, b in zip(names, bounds, bounds[1:])]


def recorded_run(path: Path, monkeypatch) -> Path:
    """A real session's run directory with replayed H200 samples (see the module docstring)."""
    import maxinstr
    import maxinstr.sample as sample

    interval = 0.01 / SPEEDUP
    monkeypatch.setattr(sample, "start_sampler",
                        functools.partial(sample.start_sampler, backend=replay_backend(), flush_interval_s=0.05))
    with maxinstr.session(str(path), warmup=0, sample_hz=1.0 / interval):
        with maxinstr.stage("run"):
            for name, seconds in phases_s():
                steps = 5
                for step in range(steps):
                    with maxinstr.stage(name, step=step):
                        time.sleep(seconds / steps)
            maxinstr.mark("done")
    return path
