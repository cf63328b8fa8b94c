"""README's demo command runs and leaves a real run directory with nested stages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import maxinstr

ROOT = Path(__file__).parents[2]


def test_demo_writes_a_run_and_prints_a_summary(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(Path(maxinstr.__file__).parents[1]), OMP_NUM_THREADS="1")
    env.pop("MAXINSTR_RUN_DIR", None)
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), str(tmp_path / "demo")],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "decode" in out.stdout and "steady" in out.stdout
    # one view of the run, the report's: no second hand-made table that nests attention under
    # prefill with decode's instances counted in (what the demo printed before)
    assert out.stdout.count("Stages (steady state)") == 1 and "% of steady decode" not in out.stdout
    assert "250 stage records and 24 marks" in out.stdout and "maxinstr report" in out.stdout
    run = maxinstr.load(tmp_path / "demo")
    assert run.meta["status"] == "closed" and run.meta["warmup"] == 2
    names = run.stage_names()
    assert (names == "decode").sum() == 24 and (names == "token").sum() == 24
    assert set(names[run["depth"] == 1]) >= {"attention", "mlp", "sample"}
    decode_ids = run["id"][names == "decode"]
    assert np.isin(run["parent_id"][names == "sample"], decode_ids).all()
    assert run.warmup_mask()[names == "decode"].sum() == 2
