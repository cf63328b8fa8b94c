"""`maxinstr snapshot`: verdict rules, the command with an autospec NVML, and no GPU at all."""

from __future__ import annotations

import json
import sys
from unittest import mock

import pytest

from maxinstr.cli import main
from maxinstr.sample import amdsmi as amd
from maxinstr.sample import nvml
from maxinstr.sample.summary import verdict


@pytest.mark.parametrize(
    "util_mean, util_peak, sm, expect",
    [
        (0.0, 0.0, float("nan"), "idle"),
        (float("nan"), float("nan"), 40.0, "unknown"),
        (1.0, 4.0, 0.5, "idle"),
        (98.0, 100.0, 91.0, "busy"),
        (98.0, 100.0, float("nan"), "busy"),  # no GPM: util alone
        (95.0, 100.0, 3.0, "launch/sync-bound"),
        (30.0, 60.0, 2.0, "host-bound"),
        (69.9, 100.0, 80.0, "host-bound"),
    ],
)
def test_verdict_rules(util_mean, util_peak, sm, expect):
    v, why = verdict(util_mean, util_peak, sm)
    assert v == expect and ("%" in why or v == "unknown")


def test_snapshot_with_a_command_exits_with_its_status(fake_nvml, capsys):
    fake = fake_nvml(1)
    fake.util = [(100, 60)]
    fake.reasons = [0x20]  # sw_thermal
    with mock.patch.object(nvml, "import_pynvml", return_value=fake.nv):
        code = main(["snapshot", "--interval", "0.01", "--json", "--",
                     sys.executable, "-c", "import time, sys; print('child out'); time.sleep(0.4); sys.exit(3)"])
    out, err = capsys.readouterr()
    assert code == 3
    doc = json.loads(err[err.index("{"):])  # the summary goes to stderr beside a command
    [gpu] = doc["gpus"]
    assert gpu["verdict"] == "busy" and gpu["util_mean_pct"] == 100 and gpu["sm_active_mean_pct"] == 55
    assert gpu["throttle_pct"] == {"sw_thermal": 100.0} and gpu["hw_throttle_pct"] == 100.0
    assert gpu["thermal_hw_pct"] == 100.0 and gpu["power_cap_pct"] == 0.0
    assert gpu["samples"] >= 10 and gpu["mem_total_bytes"] == 143_771_090_944


def test_snapshot_exit_status_of_a_killed_command(fake_nvml, capsys):
    fake = fake_nvml(1)
    with mock.patch.object(nvml, "import_pynvml", return_value=fake.nv):
        code = main(["snapshot", "--interval", "0.01", "--", sys.executable, "-c",
                     "import os, signal, time; time.sleep(0.2); os.kill(os.getpid(), signal.SIGTERM)"])
    assert code == 128 + 15
    assert "GPU snapshot" in capsys.readouterr().err


def test_snapshot_table_names_the_thresholds(fake_nvml, capsys):
    fake = fake_nvml(1)
    fake.util = [(20, 5)]
    fake.gpm_values = {2: 3.0, 3: 2.0, 5: 0.0, 10: 1.0}
    with mock.patch.object(nvml, "import_pynvml", return_value=fake.nv):
        code = main(["snapshot", "--duration", "0.35", "--interval", "0.01"])
    out, _ = capsys.readouterr()
    assert code == 0
    assert "host-bound" in out and "util 20% < 70%" in out and "thresholds:" in out


def test_snapshot_shows_power_cap_apart_from_thermal_hw_slowdown(fake_nvml, capsys):
    # sw_power_cap is the driver keeping a loaded GPU under its power limit (the H200 showed it
    # in 98% of the samples of a matmul loop): its own column, not "HW throttle"
    fake = fake_nvml(1)
    fake.util = [(100, 60)]
    fake.reasons = [pynvml_reason("SwPowerCap")]
    with mock.patch.object(nvml, "import_pynvml", return_value=fake.nv):
        code = main(["snapshot", "--duration", "0.3", "--interval", "0.01", "--json"])
    gpu = json.loads(capsys.readouterr().out)["gpus"][0]
    assert code == 0 and gpu["power_cap_pct"] == 100.0 and gpu["thermal_hw_pct"] == 0.0
    with mock.patch.object(nvml, "import_pynvml", return_value=fake.nv):
        main(["snapshot", "--duration", "0.3", "--interval", "0.01"])
    out = capsys.readouterr().out
    header = out[out.index("GPU snapshot"):out.index("GPU 0 (NVIDIA H200):")]
    assert "power" in header and "cap" in header and "thermal/" in header and "HW slow" in header
    assert "clock limits (% of samples): sw_power_cap 100%" in " ".join(out.split())  # rich wraps lines
    row = next(line for line in out.splitlines() if line.startswith(" 0 "))
    assert "100%" in row and row.rstrip().endswith("busy") and "none" in row  # cap 100%, thermal/HW none


def pynvml_reason(name: str) -> int:
    pynvml = pytest.importorskip("pynvml")
    return getattr(pynvml, f"nvmlClocksEventReason{name}")


def test_snapshot_without_gpu_is_one_line_and_nonzero(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    monkeypatch.setattr(amd, "_import_failure", None)
    code = main(["snapshot", "--duration", "0.1"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("maxinstr: no GPU to watch (") and "nvidia-ml-py" in err
