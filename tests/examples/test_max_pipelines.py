"""MAX's own commands under maxinstr, with the installed MAX (CI installs it: README's test command).

- the max preset's wrap points are where MAX 26.7 had them: a new MAX release that moves one fails
  here, naming the wrap point and what moved (launch/presets.py, integrations/max_pipeline.py);
- `max generate` on the CPU under `maxinstr run`, with a tiny random Llama (examples/tiny_llama.py):
  the report has tokenize, prefill, decode, forward, sample and graph with the counts MAX's loop
  implies for the tokens asked (HF_HUB_OFFLINE=1: nothing is downloaded);
- `max serve` under `maxinstr server` with examples/serve_load.py in a window: the API server's
  and the spawned model worker's records merge in one run, and the serving loop adds up.

The first `max generate` compiles the model and the sampler cold (minutes on 2 cores; cached in
MAX's compile cache after, which `max serve` then reads).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest

import maxinstr
from maxinstr.integrations import max_pipeline

from examples_runner import EXAMPLES, child_env, python_with

MAX_PYTHON = python_with("max.pipelines")


def _check(name: str) -> None:
    """Run tests/examples/max_wrap_points.py's check ``name`` in a process of its own (why: there)."""
    if MAX_PYTHON is None:
        pytest.skip("MAX is not installed for any candidate interpreter (README's test command installs it)")
    done = subprocess.run([MAX_PYTHON, str(Path(__file__).with_name("max_wrap_points.py")), name],
                          capture_output=True, text=True, env=child_env(MAX_PYTHON), timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_every_wrap_point_is_where_the_preset_expects_it():
    _check("wrap_points")


def test_every_architecture_s_model_has_an_execute_the_forward_hook_can_wrap():
    _check("architectures")


def test_a_step_over_real_max_contexts_is_prefill_then_decode():
    _check("steps")


# --- max generate and max serve on the CPU -------------------------------------------------------

TOKENS = 6


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    if MAX_PYTHON is None:
        pytest.skip("MAX is not installed for any candidate interpreter (README's test command installs it)")
    out = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    done = subprocess.run([MAX_PYTHON, str(EXAMPLES / "tiny_llama.py"), str(out)], capture_output=True, text=True,
                          env=child_env(MAX_PYTHON), timeout=120)
    assert done.returncode == 0, done.stderr
    assert {p.name for p in out.iterdir()} >= {"config.json", "tokenizer.json", "model.safetensors"}
    return out


def _max_env(python: str) -> dict[str, str]:
    bindir = str(Path(python).parent)  # the venv's `max` and `maxinstr`
    return child_env(python, HF_HUB_OFFLINE="1", PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.fixture(scope="module")
def generate_run(tiny_model, tmp_path_factory):
    assert MAX_PYTHON is not None
    out = tmp_path_factory.mktemp("generate") / "run"
    done = subprocess.run(
        [MAX_PYTHON, "-m", "maxinstr", "run", "--profiler", "none", "-y", "-o", str(out), "--", "max", "generate",
         "--model-path", str(tiny_model), "--devices", "cpu", "--quantization-encoding", "float32",
         "--prompt", "hello world", "--max-new-tokens", str(TOKENS), "--ignore-eos"],
        capture_output=True, text=True, env=_max_env(MAX_PYTHON), timeout=1500, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, done


@pytest.mark.slow
def test_max_generate_has_its_loop_stages_with_the_counts_it_implies(generate_run):
    out, done = generate_run
    run = maxinstr.load(out)
    names = run.stage_names()
    counts = {str(n): int((names == n).sum()) for n in np.unique(names)}
    # one prompt: one tokenization and one prefill step (it makes the first token), then one
    # decode step a token; each step runs the model once and samples once, each of those one
    # compiled graph; the text is printed one step at a time
    assert counts["tokenize"] == 1 and counts["prefill"] == 1 and counts["decode"] == TOKENS - 1
    assert counts["forward"] == TOKENS and counts["sample"] == TOKENS and counts["detokenize"] == TOKENS
    assert counts["graph"] == 2 * TOKENS
    assert counts["compile"] >= 2  # the model and the sampler at least
    by_id = {int(i): k for k, i in enumerate(run.stages["id"])}

    def parents(child: str) -> set[str]:
        return {str(names[by_id[int(p)]]) for p in run.stages["parent_id"][names == child]}

    assert parents("forward") == parents("sample") == {"prefill", "decode"}
    assert parents("graph") == {"forward", "sample"}
    # the run says what it applied, and where MAX compiled
    launch = json.loads((out / "launch.json").read_text())
    assert launch["presets"] == ["max"] and launch["env"]["MAX_SERVE_DISABLE_TELEMETRY"] == "1"
    assert launch["stage_specs_unapplied"] == {} and "never applied" not in done.stderr
    cache = launch["max_compile_cache"]
    assert set(cache["dirs"]) == {"max", "mogg", "mojo"}
    # the folders named are where MAX put the graphs it compiled (MODULAR_DERIVED_PATH too)
    assert cache["files_after"]["max"] > 0 and cache["files_after"]["mogg"] > 0
    assert cache["cold"] == (sum(cache["files_after"].values()) > sum(cache["files_before"].values()))
    assert f"preset max: {len(max_pipeline.WRAP_POINTS)} wrap points" in done.stderr and "MAX's compile cache" in done.stderr + done.stdout
    for name in ("tokenize", "prefill", "decode", "decode/forward", "decode/sample", "decode/forward/graph"):
        assert name in done.stdout, name  # the report printed at the end


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_max_serve_worker_and_server_merge_and_the_loop_adds_up(tiny_model, generate_run, tmp_path):
    assert MAX_PYTHON is not None
    out, port, requests = tmp_path / "serve", _free_port(), 8
    env = _max_env(MAX_PYTHON)
    cli = [MAX_PYTHON, "-m", "maxinstr", "server"]
    start = subprocess.run(
        [*cli, "start", "--profiler", "none", "-o", str(out), "--ready", "Server ready", "--ready-timeout", "900", "--",
         "max", "serve", "--model-path", str(tiny_model), "--devices", "cpu", "--quantization-encoding", "float32",
         "--max-batch-size", "4", "--port", str(port)],
        capture_output=True, text=True, env=env, timeout=1000, stdin=subprocess.DEVNULL)
    try:
        assert start.returncode == 0, start.stderr + (out / "server.log").read_text(errors="replace")[-3000:]
        window = subprocess.run(
            [*cli, "window", str(out), "--", MAX_PYTHON, str(EXAMPLES / "serve_load.py"), "--url", f"http://127.0.0.1:{port}",
             "--requests", str(requests), "--concurrency", "4", "--max-tokens", str(TOKENS)],
            capture_output=True, text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
    finally:
        subprocess.run([*cli, "stop", str(out)], capture_output=True, env=env, timeout=120)
    assert window.returncode == 0, window.stdout + window.stderr
    assert f"client: {requests}/{requests} requests ok" in window.stdout
    assert f"queueing before the first step ({requests} of {requests} requests)" in window.stderr
    run = maxinstr.load(out)
    names = run.stage_names()
    part_of = np.array([p["pid"] for p in run.parts])[run.stages["part"]]
    api = set(part_of[names == "tokenize"].tolist())
    worker = set(part_of[names == "prefill"].tolist())
    assert len(api) == 1 and len(worker) == 1 and api != worker  # two processes, one run
    assert "never applied" not in start.stderr
    # every request made TOKENS tokens, each in a step that had it in its batch: a prefill makes
    # one token for each context in it, a decode one for each too
    from maxinstr.analyze.serving import serving_summary

    summary = serving_summary(run)
    made = sum(run.attrs[int(i)]["batch"] for i in run.stages["id"][np.isin(names, ["prefill", "decode"])])
    assert made == requests * TOKENS
    assert summary["queue"]["started"] == summary["queue"]["requests"] == requests
    assert summary["steps"]["prefill"]["batch"]["max"] <= 4 and summary["steps"]["decode"]["batch"]["max"] <= 4
