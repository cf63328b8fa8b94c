"""Sessions on a real GPU (run on the lent H200: pytest -m gpu tests/reliability).

Session start must not create a CUDA context; meta.json must name the GPU, driver, CUDA and
the frameworks the program imported; GPU-timed records must reach the run directory through
the flusher, also from a process killed with SIGKILL and from a fork child."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import maxinstr
from maxinstr.rundir import format as fmt

pytestmark = pytest.mark.gpu

SRC = str(Path(maxinstr.__file__).parents[1])


def _run_child(tmp_path: Path, body: str, *args: str, kill_after: str | None = None, timeout: float = 120):
    path = tmp_path / "child.py"
    path.write_text(textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p))
    for key in [k for k in env if k.startswith("MAXINSTR_")]:
        env.pop(key)
    env["MAXINSTR_GPU_BUDGET"] = "0"  # these tests follow every record's GPU time: no budget sampling
    proc = subprocess.Popen([sys.executable, str(path), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if kill_after:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith(kill_after) or (not line and proc.poll() is not None):
                break
        proc.kill()
        out, err = proc.communicate()
        return proc.returncode, out, err
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def test_session_meta_names_the_gpu_without_creating_a_context(tmp_path):
    rc, out, err = _run_child(
        tmp_path,
        """
        import ctypes, json, sys
        import torch, maxinstr

        def primary_context_active():
            cuda = ctypes.CDLL("libcuda.so.1")
            assert cuda.cuInit(0) == 0  # cuInit creates no context
            dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
            assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
            assert cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) == 0
            return bool(active.value)

        with maxinstr.session(sys.argv[1], dtype="bf16") as s:
            torch_init, primary = torch.cuda.is_initialized(), primary_context_active()
            print("CTX_AFTER_START", torch_init or primary, "torch initialized", torch_init, "primary active", primary, flush=True)
            x = torch.randn(2048, 2048, device="cuda")
            stream = torch.cuda.current_stream().cuda_stream
            for i in range(20):
                with maxinstr.stage("matmul", step=i, stream=stream):
                    y = x @ x
            torch.cuda.synchronize()
            import time; time.sleep(0.3)  # a few sampler ticks
        """,
        str(tmp_path / "run"),
    )
    assert rc == 0, err
    assert "CTX_AFTER_START False" in out, out  # metadata collection (NVML) made no CUDA context
    run = maxinstr.load(tmp_path / "run")
    meta = run.meta
    assert meta["gpus"] and meta["gpus"][0]["name"] and meta["gpus"][0]["uuid"].startswith("GPU-")
    assert meta["driver"] and meta["cuda"]
    assert meta["frameworks"]["torch_imported"] is True and meta["frameworks"].get("cudnn")
    print(json.dumps({k: meta[k] for k in ("gpus", "driver", "cuda", "frameworks")}, indent=1))
    mm = run.stages[run["name"] == "matmul"]
    assert len(mm) == 20
    timed = (mm["flags"] & fmt.GPU_TIMED) != 0
    assert timed.sum() >= 19, mm["flags"]
    gpu_ms = (mm["gpu_end_ns"] - mm["gpu_start_ns"])[timed] / 1e6
    assert np.all(gpu_ms > 0.05)  # a 2048^3 matmul is not free
    assert np.all(mm["gpu_start_ns"][timed] >= mm["host_start_ns"][timed])  # the GPU runs after the launch
    # samples came from NVML
    samples = run.samples[run.parts[0]["name"]]
    assert len(samples.rows) > 0


def test_sigkill_keeps_gpu_timed_records(tmp_path):
    rc, out, err = _run_child(
        tmp_path,
        """
        import sys, time
        import torch, maxinstr
        x = torch.randn(1024, 1024, device="cuda")
        s = maxinstr.session(sys.argv[1], sample_hz=0)
        s.start()
        stream = torch.cuda.current_stream().cuda_stream
        for i in range(200):
            with maxinstr.stage("work", step=i, stream=stream):
                y = x @ x
        torch.cuda.synchronize()
        time.sleep(0.5)
        print("READY", flush=True)
        time.sleep(60)
        """,
        str(tmp_path / "run"),
        kill_after="READY",
    )
    assert rc == -signal.SIGKILL, err
    run = maxinstr.load(tmp_path / "run")
    assert len(run) == 200 and run.meta["status"] == "running"
    assert ((run["flags"] & fmt.GPU_TIMED) != 0).sum() >= 199


def test_fork_child_after_cuda_writes_host_only_part(tmp_path):
    rc, out, err = _run_child(
        tmp_path,
        """
        import os, sys
        import torch, maxinstr
        x = torch.randn(512, 512, device="cuda")
        with maxinstr.session(sys.argv[1], sample_hz=0):
            with maxinstr.stage("parent-gpu", stream=torch.cuda.current_stream().cuda_stream):
                y = x @ x
            torch.cuda.synchronize()
            pid = os.fork()
            if pid == 0:
                with maxinstr.stage("child-host"):
                    sum(range(1000))
                sys.exit(0)
            os.waitpid(pid, 0)
        """,
        str(tmp_path / "run"),
    )
    assert rc == 0, err
    run = maxinstr.load(tmp_path / "run")
    names = run.stage_names()
    by_part = {p["name"]: set(names[run["part"] == i].tolist()) for i, p in enumerate(run.parts)}
    assert sorted(by_part.values(), key=sorted) == [{"child-host"}, {"parent-gpu"}]
    child = run.stages[names == "child-host"]
    assert (child["flags"] & fmt.GPU_TIMED == 0).all()


@pytest.mark.slow
def test_16_threads_x_100k_gpu_stages(tmp_path):
    rc, out, err = _run_child(
        tmp_path,
        """
        import json, sys, threading, time
        import torch, maxinstr
        torch.zeros(1, device="cuda"); torch.cuda.synchronize()
        def work():
            torch.cuda.set_device(0)
            stream = torch.cuda.current_stream().cuda_stream
            for i in range(50_000):
                with maxinstr.stage("outer", step=i, stream=stream):
                    with maxinstr.stage("inner", stream=stream):
                        pass
        t0 = time.perf_counter()
        with maxinstr.session(sys.argv[1], sample_hz=0) as s:
            ts = [threading.Thread(target=work) for _ in range(16)]
            [t.start() for t in ts]; [t.join() for t in ts]
        print("ELAPSED", time.perf_counter() - t0, flush=True)
        """,
        str(tmp_path / "run"),
        timeout=300,
    )
    assert rc == 0, err
    run = maxinstr.load(tmp_path / "run")
    part = run.parts[0]
    dropped = part["dropped_records"]
    flags = run["flags"]
    print(out.strip(), f"records {len(run)} dropped {dropped} gpu_timed {(flags & fmt.GPU_TIMED != 0).sum()} "
          f"gpu_dropped {(flags & fmt.GPU_DROPPED != 0).sum()} native {json.dumps(part['native'])}")
    assert len(run) + dropped == 1_600_000
    assert len(np.unique(run["id"])) == len(run)
    inner = run.stages[run.stage_names() == "inner"]
    assert np.isin(inner["parent_id"], run["id"]).sum() >= len(inner) - dropped


def test_sigterm_mid_gpu_loop_finishes_the_run(tmp_path):
    path = tmp_path / "child.py"
    path.write_text(textwrap.dedent("""
        import sys
        import torch, maxinstr
        x = torch.randn(2048, 2048, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        with maxinstr.session(sys.argv[1], sample_hz=0):
            i = 0
            while True:
                with maxinstr.stage("work", step=i, stream=stream):
                    y = x @ x
                i += 1
                if i == 100:
                    print("READY", flush=True)
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p))
    env["MAXINSTR_GPU_BUDGET"] = "0"
    proc = subprocess.Popen([sys.executable, str(path), str(tmp_path / "run")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not proc.stdout.readline().startswith("READY"):
        assert proc.poll() is None, proc.stderr.read()
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    run = maxinstr.load(tmp_path / "run")
    assert run.meta["status"] == "closed" and len(run) >= 100
    steps = run["step"][run.stage_names() == "work"]
    assert sorted(steps.tolist()) == list(range(len(steps)))  # no gap
    timed = (run["flags"] & fmt.GPU_TIMED) != 0
    print(f"SIGTERM mid GPU loop: {len(run)} records, {timed.sum()} GPU-timed, flags {np.unique(run['flags']).tolist()}")
    assert timed.sum() >= len(run) - 5
