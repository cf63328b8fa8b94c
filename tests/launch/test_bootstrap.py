"""The start-up hook injected into the profiled process: stage specs, session, capture window."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from maxinstr import config
from maxinstr.launch import bootstrap, layout

from _launch_helpers import PKG_ROOT, base_env


def _py(args, env, cwd=None):
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=60, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def test_specs_from_env():
    assert config.stage_specs({"MAXINSTR_STAGES": "a:f\n\n  b:C.g=x \n"}) == ["a:f", "b:C.g=x"]
    assert config.stage_specs({}) == []


def test_sitecustomize_runs_and_chains_the_one_it_shadows(tmp_path):
    other = tmp_path / "other_site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE_RAN'] = '1'\n")
    env = base_env()
    env["PYTHONPATH"] = os.pathsep.join([layout.site_dir(), str(other), PKG_ROOT])
    env["MAXINSTR_STAGES"] = "json:dumps=encode"
    res = _py(["-c", "import os, json, sys; json.dumps(1); "
               "print(os.environ.get('OTHER_SITE_RAN'), getattr(json.dumps, '__maxinstr_stage__', None), "
               "sys.modules['sitecustomize'].__file__)"], env)
    assert res.returncode == 0, res.stderr
    ran, stage, site = res.stdout.split()
    assert ran == "1" and stage == "encode"
    assert site == str(other / "sitecustomize.py")


def test_a_bad_spec_never_breaks_the_program(tmp_path):
    env = base_env()
    env["PYTHONPATH"] = os.pathsep.join([layout.site_dir(), PKG_ROOT])
    env["MAXINSTR_STAGES"] = "json:nothing_here\nnot a spec"
    res = _py(["-c", "import json; print(json.dumps([1]))"], env)
    assert res.returncode == 0 and res.stdout == "[1]\n"
    assert "maxinstr: --stage json:nothing_here: json has no nothing_here" in res.stderr
    assert "maxinstr: --stage 'not a spec': expected MODULE:QUALNAME[=name]" in res.stderr


def test_module_form_runs_a_script_with_stages(tmp_path, script):
    pytest.importorskip("maxinstr.record")
    (tmp_path / "helper.py").write_text("def work(i):\n    return i\n")
    prog = script("main.py", """
        import helper
        print(sum(helper.work(i) for i in range(5)))
    """)
    out = tmp_path / "run"
    res = _py(["-m", "maxinstr.launch.bootstrap", "--stage", "helper:work=w", str(prog)],
              base_env(MAXINSTR_RUN_DIR=str(out)), cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert res.stdout == "10\n"
    import maxinstr

    run = maxinstr.load(out)
    assert (run["name"].astype(str) == "w").sum() == 5


def test_capture_window_stops_the_capture_after_the_window(monkeypatch):
    native = pytest.importorskip("maxinstr._native")
    started = []
    monkeypatch.setattr(native, "profiler_start", lambda: started.append(1) or True)
    stopped = threading.Event()
    seen_ctx = []
    win = bootstrap.CaptureWindow(0.2, stop=lambda ctx: (seen_ctx.append(ctx), stopped.set()), context=lambda: "ctx-0")
    assert win.install()
    assert native.profiler_start() is True  # what the session calls at steady state
    assert started == [1]
    assert stopped.wait(5) and seen_ctx == ["ctx-0"]
    assert not win.install()  # already wrapped: never twice


def test_start_without_a_context_on_the_calling_thread_is_retried(monkeypatch):
    # The session may call profiler_start from its flusher thread, where no CUDA context is
    # current: the native call returns False there. The wrapper retries it with the
    # program's primary context made current, and the window stops on that context.
    native = pytest.importorskip("maxinstr._native")
    attempts = []
    monkeypatch.setattr(native, "profiler_start", lambda: attempts.append("call") or len(attempts) > 1)
    retried = []

    def retry(fn):
        retried.append(1)
        return fn(), "primary-ctx"

    stopped = threading.Event()
    seen_ctx = []
    win = bootstrap.CaptureWindow(0.1, stop=lambda ctx: (seen_ctx.append(ctx), stopped.set()), context=lambda: None,
                                  retry=retry)
    assert win.install()
    assert native.profiler_start() is True
    assert attempts == ["call", "call"] and retried == [1]
    assert stopped.wait(5) and seen_ctx == ["primary-ctx"]


def test_no_window_still_retries_but_never_stops(monkeypatch):
    native = pytest.importorskip("maxinstr._native")
    monkeypatch.setattr(native, "profiler_start", lambda: False)
    win = bootstrap.CaptureWindow(None, stop=lambda ctx: pytest.fail("stopped"), context=lambda: None,
                                  retry=lambda fn: None)  # no active primary context: nothing to retry with
    assert win.install()
    assert native.profiler_start() is False and win._timer is None
