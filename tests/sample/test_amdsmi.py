"""AMD SMI path: an autospec of a spec mirroring amdsmi 7.0.2 (checked against the installed
source), the guarded import, NOT_SUPPORTED per metric, a lost GPU."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import math
import sys
from pathlib import Path
from unittest import mock

import pytest

from maxinstr.sample import amdsmi as amd
from maxinstr.sample import open_backend, read_samples, start_sampler
from maxinstr.rundir.samples import THROTTLE_BIT
from maxinstr.sample.base import COL, ErrorLog, nan_values
from maxinstr.sample.writer import clock_ns


def backend(fake, env=None):
    errors = ErrorLog(clock_ns)
    return amd.AmdSmiBackend(errors, smi=fake.smi, env=env or {}, interval_s=0.01), errors


def _installed_interface() -> Path | None:
    spec = importlib.util.find_spec("amdsmi")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "amdsmi_interface.py"
    return path if path.exists() else None


def test_amdsmi_spec_matches_installed_source(amdsmi_spec):
    spec_functions = [n for n in vars(amdsmi_spec) if n.startswith("amdsmi_")]
    path = _installed_interface()
    if path is None:
        pytest.skip("amdsmi not installed (it is in the test extra)")
    real = {n.name: n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
    for name in spec_functions:
        assert name in real, f"amdsmi has no {name}"
        real_args = [a.arg for a in real[name].args.args]
        ours = list(inspect.signature(getattr(amdsmi_spec, name)).parameters)
        assert ours == real_args, f"{name}: spec {ours} != amdsmi {real_args}"
    # and the names the sampler calls are all in the spec (a typo in amd.py fails here too)
    used = {n.attr for n in ast.walk(ast.parse(Path(amd.__file__).read_text()))
            if isinstance(n, ast.Attribute) and n.attr.startswith("amdsmi_")}
    assert used <= set(spec_functions), used - set(spec_functions)


def test_amdsmi_status_codes_match_installed_source():
    path = _installed_interface()
    if path is None:
        pytest.skip("amdsmi not installed")
    consts = {}
    for node in ast.parse((path.parent / "amdsmi_wrapper.py").read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id.startswith("AMDSMI_STATUS_"):
                consts[target.id] = node.value.value
    assert consts["AMDSMI_STATUS_NOT_SUPPORTED"] == amd.STATUS_NOT_SUPPORTED
    assert consts["AMDSMI_STATUS_NOT_YET_IMPLEMENTED"] == amd.STATUS_NOT_YET_IMPLEMENTED
    assert consts["AMDSMI_STATUS_NO_PERM"] == amd.STATUS_NO_PERM
    assert consts["AMDSMI_STATUS_NOT_FOUND"] == amd.STATUS_NOT_FOUND
    assert consts["AMDSMI_STATUS_DRIVER_NOT_LOADED"] == amd.STATUS_DRIVER_NOT_LOADED


def test_reads_every_metric_with_units(fake_amdsmi):
    fake = fake_amdsmi(1)
    b, errors = backend(fake)
    [dev] = b.devices()
    assert dev.info.name == "AMD Instinct MI300X" and dev.info.mem_total_bytes == 196592 * 2**20
    assert dev.info.sm_clock_max_mhz == 2100 and "sm_active_pct" in dev.info.absent
    v = nan_values()
    flags, bits, raw = dev.read(v, 0, 0)
    assert v[COL["gpu_util_pct"]] == 93 and v[COL["mem_util_pct"]] == 35
    assert v[COL["mem_used_bytes"]] == 1024 * 2**20
    assert v[COL["sm_clock_mhz"]] == 2100 and v[COL["mem_clock_mhz"]] == 1300
    assert v[COL["power_w"]] == 550
    assert v[COL["energy_j"]] == pytest.approx(10_000_000 * 15.259e-6)
    assert v[COL["temp_c"]] == 52 and v[COL["proc_mem_bytes"]] == 0
    assert bits == 0 and errors.snapshot() == []


def test_throttle_from_violation_status_and_indep_bits(fake_amdsmi):
    fake = fake_amdsmi(1)
    fake.violation["active_ppt_pwr"] = True
    fake.metrics["indep_throttle_status"] = (1 << 36) | (1 << 16)  # amdsmi < 7: TEMP_HOTSPOT, TDC_GFX
    b, _ = backend(fake)
    [dev] = b.devices()
    _, bits, raw = dev.read(nan_values(), 0, 0)
    assert bits == THROTTLE_BIT["sw_power_cap"] | THROTTLE_BIT["hw_thermal"] | THROTTLE_BIT["current_limit"]
    assert raw == (1 << 36) | (1 << 16)
    fake.violation["active_ppt_pwr"] = False
    fake.metrics["indep_throttle_status"] = True  # amdsmi 7: a bool
    _, bits, _ = dev.read(nan_values(), 1, 0)
    assert bits == 0  # gpu_metrics is read on slow ticks only (every 10th at 100 Hz)
    _, bits, _ = dev.read(nan_values(), 10, 0)
    assert bits == THROTTLE_BIT["throttled_unknown"]


def test_not_supported_per_metric_never_stops_sampling(fake_amdsmi):
    # modular#7141: consumer Radeon answers NOT_SUPPORTED for some metrics
    fake = fake_amdsmi(1)
    fake.fail[("amdsmi_get_violation_status", 0)] = (amd.STATUS_NOT_SUPPORTED, 0)
    fake.fail[("amdsmi_get_energy_count", 0)] = (amd.STATUS_NOT_SUPPORTED, 0)
    fake.activity["umc_activity"] = "N/A"
    fake.power.update(current_socket_power="N/A", average_socket_power="N/A", socket_power="N/A")
    b, errors = backend(fake)
    [dev] = b.devices()
    for tick in range(4):
        v = nan_values()
        dev.read(v, tick, 0)
        assert v[COL["gpu_util_pct"]] == 93
        assert math.isnan(v[COL["energy_j"]]) and math.isnan(v[COL["power_w"]]) and math.isnan(v[COL["mem_util_pct"]])
    assert fake.calls[("amdsmi_get_energy_count", 0)] == 1
    assert fake.calls[("amdsmi_get_gpu_activity", 0)] == 4
    kinds = {(e["metric"], e["kind"]) for e in errors.snapshot()}
    assert {("violation_status", "absent"), ("energy_j", "absent"), ("power_w", "absent")} <= kinds
    assert len(errors.snapshot()) == 3


def test_gpu_lost_mid_run(fake_amdsmi, tmp_path):
    fake = fake_amdsmi(1)
    fake.fail[("amdsmi_get_gpu_activity", 0)] = (amd.STATUS_DRIVER_NOT_LOADED, 2)
    b, errors = backend(fake)
    s = start_sampler(tmp_path, 0.002, backend=b)
    import time

    deadline = time.monotonic() + 5
    while s.running and time.monotonic() < deadline:
        time.sleep(0.01)
    s.stop()
    r = read_samples(tmp_path)
    assert len(r) == 3 and r.flags[-1] & 4
    assert [e["kind"] for e in r.errors] == ["lost"]
    fake.smi.amdsmi_shut_down.assert_called_once()


@pytest.mark.parametrize(
    "body, expect",
    [
        ("print('Unable to find libamd_smi.so'); raise KeyError('libamd_smi.so')", "no AMD SMI library \\(libamd_smi.so not found"),  # the package without ROCm's library
        ("import sys; sys.stderr.write('boom\\n'); raise OSError('libdrm.so.2: cannot open')", "OSError"),
        ("raise SystemExit(1)", "SystemExit"),
        ("raise RuntimeError('half a ROCm')", "RuntimeError"),
    ],
)
def test_import_that_fails_oddly_is_contained(tmp_path, monkeypatch, capfd, body, expect):
    pkg = tmp_path / "amdsmi"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    monkeypatch.setattr(amd, "_import_failure", None)
    with pytest.raises(amd.Unavailable, match=expect):
        amd.import_amdsmi()
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    # remembered: a second attempt does not import again
    (pkg / "__init__.py").write_text("raise AssertionError('imported twice')\n")
    with pytest.raises(amd.Unavailable, match=expect):
        amd.import_amdsmi()


def test_real_amdsmi_without_rocm_is_contained(monkeypatch, capfd):
    if _installed_interface() is None:
        pytest.skip("amdsmi not installed")
    if Path("/opt/rocm/lib/libamd_smi.so").exists():
        pytest.skip("ROCm present: amdsmi imports here")
    monkeypatch.setattr(amd, "_import_failure", None)
    with pytest.raises(amd.Unavailable, match=r"no AMD SMI library \(libamd_smi.so not found: no ROCm here\)"):
        amd.import_amdsmi()
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_no_vendor_library_at_all(tmp_path, monkeypatch, capfd):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    monkeypatch.setattr(amd, "_import_failure", None)
    backend_, reason = open_backend(ErrorLog(clock_ns))
    assert backend_.name == "none"
    assert "nvidia-ml-py is not installed" in reason and "amdsmi" in reason
    s = start_sampler(tmp_path, 0.01)
    assert not s.running
    s.stop()
    s.stop()  # idempotent
    r = read_samples(tmp_path)
    assert len(r) == 0 and r.meta["backend"] == "none" and "nvidia-ml-py" in r.unavailable
    assert r.meta["status"] == "closed"
    assert capfd.readouterr() == ("", "")


def test_amd_chosen_when_nvml_has_no_library(fake_amdsmi, fake_nvml, monkeypatch):
    from maxinstr.sample import nvml

    nv = fake_nvml(1)
    import pynvml

    nv.nv.nvmlInit.side_effect = pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    fake = fake_amdsmi(2)
    with mock.patch.object(nvml, "import_pynvml", return_value=nv.nv), \
         mock.patch.object(amd, "import_amdsmi", return_value=fake.smi):
        b, reason = open_backend(ErrorLog(clock_ns))
    assert b.name == "amdsmi" and reason == ""
    assert len(b.devices()) == 2
