"""Start-up code `maxinstr run` injects into every Python process it starts (its ``sitecustomize``, or
``python -m maxinstr.launch.bootstrap [--stage SPEC]... script.py ARGS``): the ``--stage`` specs, the
capture window, the session writing ``MAXINSTR_RUN_DIR``. Nothing here may break the user's program:
every problem is one line on stderr."""

from __future__ import annotations

import contextlib
import ctypes
import os
import runpy
import sys
import threading
from pathlib import Path

from maxinstr import _native, config
from maxinstr.errors import MaxinstrError
from maxinstr.integrations.max import max_profiling_problem
from maxinstr.launch import layout
from maxinstr.launch.instrument import instrument, on_outcome, rebind_aliases

_started = False


def _say(message: str) -> None:
    sys.stderr.write(f"maxinstr: {message}\n")


class CaptureWindow:
    """The steady-state capture started reliably and ended after a window (docs/cli.md): a
    ``_native.profiler_start()`` from the flusher thread (no CUDA context current: it fails) is retried
    with device 0's primary context current, if active; a timer calls ``cuProfilerStop`` on it."""

    def __init__(self, window_s: float | None, stop=None, context=None, retry=None) -> None:
        self.window_s = window_s
        self._stop_fn, self._context_fn = stop or _cuda_profiler_stop, context or _current_cuda_context
        self._retry_fn = retry or _call_with_primary_context
        self.stopped = threading.Event()
        self._timer: threading.Timer | None = None

    def install(self) -> bool:
        original = getattr(_native, "profiler_start", None)
        if original is None or getattr(original, "__maxinstr_window__", False):
            return False

        def profiler_start(*args, **kwargs):
            result, ctx = original(*args, **kwargs), self._context_fn()
            if not result and ctx is None:
                if (retried := self._retry_fn(lambda: original(*args, **kwargs))) is not None:
                    result, ctx = retried
            if result:
                self._arm(ctx)
            return result

        profiler_start.__maxinstr_window__ = True  # type: ignore[attr-defined]
        _native.profiler_start = profiler_start
        return True

    def _arm(self, ctx) -> None:
        if self._timer is not None or not self.window_s:
            return
        self._timer = threading.Timer(self.window_s, self._stop, args=(ctx,))
        self._timer.daemon = True
        self._timer.start()

    def _stop(self, ctx) -> None:
        try:
            self._stop_fn(ctx)
        except Exception as exc:  # noqa: BLE001
            _say(f"could not end the capture window: {exc}")
        self.stopped.set()


def _libcuda():
    return ctypes.CDLL("libcuda.so.1")


def _current_cuda_context():
    ctx = ctypes.c_void_p()
    with contextlib.suppress(OSError):
        if _libcuda().cuCtxGetCurrent(ctypes.byref(ctx)) == 0 and ctx.value:
            return ctx
    return None


def _call_with_primary_context(fn):
    """``(fn(), ctx)`` with device 0's primary context current for the call; None without libcuda or
    where that context is not active (never created here)."""
    try:
        lib = _libcuda()
    except OSError:
        return None
    dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    if lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(dev), 0) != 0:
        return None
    if lib.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) != 0 or not active.value:
        return None
    ctx = ctypes.c_void_p()
    if lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) != 0:
        return None
    release = getattr(lib, "cuDevicePrimaryCtxRelease_v2", None) or lib.cuDevicePrimaryCtxRelease
    try:
        lib.cuCtxSetCurrent(ctx)
        return fn(), ctx
    finally:
        lib.cuCtxSetCurrent(None)
        release(dev)


def _cuda_profiler_stop(ctx) -> None:
    lib = _libcuda()
    if ctx is not None:
        lib.cuCtxSetCurrent(ctx)
    if (rc := lib.cuProfilerStop()) != 0:
        raise RuntimeError(f"cuProfilerStop returned CUresult {rc}")


def startup(environ: dict[str, str] | os._Environ = os.environ) -> None:  # once per process; never raises
    global _started
    if _started:
        return
    _started = True
    # each step on its own: a failed wrap once left the run without its session (nothing recorded)
    for step in (_apply_specs_step, _capture_step, _max_markers_step, _session_step):
        try:
            step(environ)
        except Exception as exc:  # noqa: BLE001 - the user's program must run regardless
            _say(f"start-up hook failed: {exc.__class__.__name__}: {exc}")


def _apply_specs_step(environ) -> None:  # lazily (now for modules imported), each outcome recorded
    if not (specs := config.stage_specs(environ)):
        return
    on_outcome(layout.record_spec_outcome)
    for text in specs:
        try:
            instrument(text, lazy=True)
        except MaxinstrError as exc:
            _say(str(exc))
        except Exception as exc:  # noqa: BLE001 - one spec never takes the others (or the program) down
            _say(f"--stage {text}: {type(exc).__name__}: {exc}")
    rebind_aliases(specs)


def _capture_step(environ) -> None:
    if config.capture_request(environ) is not None:
        CaptureWindow(config.capture_window_s(environ)).install()


_MARKERS_OFF = ("", "off", "0", "false")
_run_warnings: list[str] = []  # said on stderr before the session opened; kept in the run's events once it is


def _max_markers_step(environ) -> None:
    """MAX's markers abort MAX where NVTX's v2 entry points are missing (CUDA 13): provided before MAX is
    imported, or `maxinstr run`'s own default turned off, or a level the user set refused at MAX's import."""
    level = environ.get("MODULAR_ENABLE_PROFILING", "off").strip().lower()
    if level in _MARKERS_OFF or (problem := max_profiling_problem()) is None:
        return
    if config.max_profiling_by_run(environ):
        # MAX reads the variable when it is first imported, after this hook
        environ["MODULAR_ENABLE_PROFILING"] = "off"
        _run_warnings.append(f"running without MAX's op ranges (MODULAR_ENABLE_PROFILING=off, not maxinstr run's "
                             f"detailed): {problem}")
        _say(_run_warnings[-1])
    else:
        sys.meta_path.insert(0, RefuseMaxImport(f"MODULAR_ENABLE_PROFILING={level}: {problem}"))


class RefuseMaxImport:
    """A finder that stops the program at MAX's import (one line, status 2): the markers would abort it."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] != "max":
            return None
        _say(self.reason)
        raise SystemExit(2)


def _session_step(environ) -> None:
    if config.run_dir(environ):
        # here, not at the top: importing maxinstr.record joins the run's session (record/__init__.py),
        # which must come after the specs and the capture window
        from maxinstr.record.session import ensure_env_session

        if (session := ensure_env_session()) is not None:
            for message in _run_warnings:
                session._event("warning", message)  # the run's events.jsonl: what the run went without


USAGE = "usage: python -m maxinstr.launch.bootstrap [--stage SPEC]... [-o RUN_DIR] (SCRIPT | -m MODULE) [ARGS]"


def main(argv: list[str] | None = None) -> int:
    """:data:`USAGE`. The run directory: ``-o``, else ``MAXINSTR_RUN_DIR``, else (unless joining another's
    session) ``runs/<script>-<time>``, said: records kept only in memory are lost at exit."""
    args = list(sys.argv[1:] if argv is None else argv)
    specs: list[str] = []
    out: str | None = None
    while args and args[0] in ("--stage", "-s", "-o", "--out"):
        if len(args) < 2:
            _say("--stage needs MODULE:QUALNAME[=name]" if args[0] in ("--stage", "-s") else "-o needs a directory")
            return 2
        if args[0] in ("-o", "--out"):
            out = args[1]
        else:
            specs.append(args[1])
        args = args[2:]
    if args and args[0] == "--":
        args = args[1:]
    if not args or (args[0] == "-m" and len(args) < 2):
        _say(USAGE)
        return 2
    if specs:
        os.environ[config.STAGES] = "\n".join(config.stage_specs() + specs)
    if out is not None:
        try:  # as `maxinstr run -o`: a previous run there is replaced, a live one never
            if os.path.isdir(out):
                layout.clear_previous_run(Path(out))
        except (MaxinstrError, OSError) as exc:
            _say(str(exc))
            return 2
        os.environ[config.RUN_DIR] = os.path.abspath(out)
    elif not config.run_dir() and not config.session_dir():
        target = args[1] if args[0] == "-m" else args[0]
        os.environ[config.RUN_DIR] = os.path.abspath(layout.default_run_dir([target]))
        _say(f"writing the run to {os.path.relpath(os.environ[config.RUN_DIR])} (-o DIR or MAXINSTR_RUN_DIR to choose)")
    startup()
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
            runpy.run_path(args[0], run_name="__main__")
    finally:
        try:
            _say_unapplied()
        except Exception as exc:  # noqa: BLE001 - the program has run; nothing of ours fails it now
            _say(f"could not say which --stage specs were applied: {type(exc).__name__}: {exc}")
    return 0


def _say_unapplied() -> None:
    """At the end: the specs never applied, in the run as `maxinstr run` says them, and in one line those
    whose module was never imported (a failed one was said when it failed)."""
    run_dir, specs = config.run_dir(), config.stage_specs()
    if not run_dir or not specs:
        return
    unapplied = layout.unapplied_stage_specs(Path(run_dir), specs)
    never = {text: why for text, why in unapplied.items() if why.startswith("no process of the run")}
    if never:
        _say("never applied: " + "; ".join(f"--stage {text} ({why})" for text, why in never.items()))
    # where the root session writes (no import of maxinstr.record here: that joins the run)
    process = sys.modules.get("maxinstr.record.process")
    root = process.PROCESS.root if process is not None else None
    if root is not None and not root.closed:
        for text, why in unapplied.items():
            root.sink.event("warning", f"--stage {text} was never applied: {why}")


if __name__ == "__main__":
    sys.exit(main())
