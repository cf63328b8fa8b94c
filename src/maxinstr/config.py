"""Every ``MAXINSTR_*`` environment variable, read in one place with one rule (and the launcher's
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, with one rule of their own, at the end). docs/sessions.md
("Environment variables") says what each does; tests/test_config.py holds the code to this module
and to that table. The native core reads its own at import with csrc/core/base.h's helpers, which
follow the same rules.

**The truth rule** (every yes/no variable, in C and in Python alike): unset, empty or blank: the
default; ``1``/``true``/``yes``/``on``: true, ``0``/``false``/``no``/``off``: false (ASCII case and
blanks around the word ignored); anything else: one line of warning naming the variable and the
value, and the default. Numbers alike: a value that is not a number of the right kind, or is out of
range, is one warning and the default. Nothing here raises.

Accessors take an optional ``environ`` (default ``os.environ``), so that code reading another
process's environment (``maxinstr run``'s child, a launch.json) uses the same rules. This module
imports nothing of maxinstr: the sampler's child process and the start-up hook use it first.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

T_co = TypeVar("T_co", covariant=True)

# -- the names ------------------------------------------------------------------------------
# read by Python (the accessors below)
RUN_DIR = "MAXINSTR_RUN_DIR"
SESSION_DIR = "MAXINSTR_SESSION_DIR"
SESSION_PID = "MAXINSTR_SESSION_PID"
CAPTURE = "MAXINSTR_CAPTURE"
CAPTURE_WINDOW_S = "MAXINSTR_CAPTURE_WINDOW_S"
STAGES = "MAXINSTR_STAGES"
WARMUP = "MAXINSTR_WARMUP"
PROFILER = "MAXINSTR_PROFILER"
SERVER_TOKEN = "MAXINSTR_SERVER_TOKEN"
MEMORY_RECORDS = "MAXINSTR_MEMORY_RECORDS"
NATIVE_WRITER = "MAXINSTR_NATIVE_WRITER"
WRITER_INTERVAL_MS = "MAXINSTR_WRITER_INTERVAL_MS"
WRITER_THRESHOLD = "MAXINSTR_WRITER_THRESHOLD"
CUPTI_TAGS = "MAXINSTR_CUPTI_TAGS"
SAMPLER_GIL = "MAXINSTR_SAMPLER_GIL"
SAMPLER_PROFILE = "MAXINSTR_SAMPLER_PROFILE"
SAMPLER_NVML_LIB = "MAXINSTR_SAMPLER_NVML_LIB"
NO_NATIVE_COLUMNS = "MAXINSTR_NO_NATIVE_COLUMNS"
NO_DIRECT_SCAN = "MAXINSTR_NO_DIRECT_SCAN"
NO_MALLOC_TUNING = "MAXINSTR_NO_MALLOC_TUNING"
NO_NVTX_V2 = "MAXINSTR_NO_NVTX_V2"
MAX_PROFILING_BY_RUN = "MAXINSTR_MAX_PROFILING_BY_RUN"
RUN_SAMPLED = "MAXINSTR_RUN_SAMPLED"
DEBUG = "MAXINSTR_DEBUG"
CUDA_LIBRARY = "MAXINSTR_CUDA_LIBRARY"  # also read by the native core
# read by the native core at import (csrc/core/module.cpp, markers.cpp, dispatch.cpp)
DISABLE = "MAXINSTR_DISABLE"
EVENT_POOL = "MAXINSTR_EVENT_POOL"
EVENT_SHARE_NS = "MAXINSTR_EVENT_SHARE_NS"
GPU_FLOOR_NS = "MAXINSTR_GPU_FLOOR_NS"
GPU_BUDGET = "MAXINSTR_GPU_BUDGET"
ASYNC_PLACE = "MAXINSTR_ASYNC_PLACE"
TIME_DRIVER = "MAXINSTR_TIME_DRIVER"
MARKERS = "MAXINSTR_MARKERS"
HIP_LIBRARY = "MAXINSTR_HIP_LIBRARY"
ROCTX_LIBRARY = "MAXINSTR_ROCTX_LIBRARY"
# read at build time (csrc/core/CMakeLists.txt) and by the test suite
NVTX3_INCLUDE_DIR = "MAXINSTR_NVTX3_INCLUDE_DIR"
ARTIFACTS = "MAXINSTR_ARTIFACTS"
DOCS_OUT = "MAXINSTR_DOCS_OUT"
FUZZ_RANDOM = "MAXINSTR_FUZZ_RANDOM"
GPU_RESULTS = "MAXINSTR_GPU_RESULTS"
THREADS_CAPTURE = "MAXINSTR_THREADS_CAPTURE"
EXAMPLES_PYTHON = "MAXINSTR_EXAMPLES_PYTHON"
TEST_NVTX_LOG = "MAXINSTR_TEST_NVTX_LOG"
TEST_ROCTX_LOG = "MAXINSTR_TEST_ROCTX_LOG"

VARIABLES: dict[str, str] = {
    **dict.fromkeys(
        (RUN_DIR, SESSION_DIR, SESSION_PID, CAPTURE, CAPTURE_WINDOW_S, STAGES, WARMUP, PROFILER, MEMORY_RECORDS,
         NATIVE_WRITER, WRITER_INTERVAL_MS, WRITER_THRESHOLD, CUPTI_TAGS, SAMPLER_GIL, SAMPLER_PROFILE,
         SAMPLER_NVML_LIB, NO_NATIVE_COLUMNS, NO_DIRECT_SCAN, NO_MALLOC_TUNING, NO_NVTX_V2, MAX_PROFILING_BY_RUN,
         RUN_SAMPLED, DEBUG, SERVER_TOKEN), "python"),
    CUDA_LIBRARY: "python, native",
    **dict.fromkeys(
        (DISABLE, EVENT_POOL, EVENT_SHARE_NS, GPU_FLOOR_NS, GPU_BUDGET, ASYNC_PLACE, TIME_DRIVER, MARKERS,
         HIP_LIBRARY, ROCTX_LIBRARY), "native"),
    NVTX3_INCLUDE_DIR: "build",
    **dict.fromkeys((ARTIFACTS, DOCS_OUT, FUZZ_RANDOM, GPU_RESULTS, THREADS_CAPTURE, EXAMPLES_PYTHON, TEST_NVTX_LOG,
                     TEST_ROCTX_LOG), "tests"),
}
"""Every variable maxinstr reads, and what reads it (docs/sessions.md has one row for each)."""

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
_BLANKS = b" \t\n\r\v\f"  # what C's isspace() calls blank in the C locale


# -- the rules ------------------------------------------------------------------------------
def text(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """A string variable as it is set, or None when unset or blank."""
    value = (os.environ if environ is None else environ).get(name)
    return value if value is not None and _word(value) else None


def _word(value: str) -> bytes:
    """``value`` as the C helpers see it: its bytes, ASCII blanks around it removed, ASCII
    letters lowered (no Unicode case or blank rules, so C and Python cannot disagree)."""
    try:
        raw = value.encode("utf-8", "surrogateescape")  # how os.environ holds bytes that are not UTF-8
    except UnicodeEncodeError:  # a lone surrogate no environment can hold (a mapping given by code)
        raw = value.encode("utf-8", "backslashreplace")
    return raw.strip(_BLANKS).lower()


def _warn(name: str, value: str, expected: str, default: object, *, stacklevel: int = 4,
          instead: str | None = None) -> None:
    """One line: stacklevel 4 names the code that called the accessor that called flag().
    ``instead`` says what is used when the default is no value to name (a variable that, unset,
    leaves the choice to someone else)."""
    warnings.warn(f"maxinstr: {name}={value!r} is not {expected}; {instead or f'the default ({default}) is used'}",
                  RuntimeWarning, stacklevel=stacklevel)


def parse_flag(value: str | None) -> bool | None:
    """The truth rule on one value: True, False, or None (unset, blank, or not a yes/no word)."""
    word = None if value is None else _word(value).decode("ascii", "replace")
    return True if word in TRUE_WORDS else False if word in FALSE_WORDS else None


def flag(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """A yes/no variable under the truth rule (module docstring)."""
    value = text(name, environ)
    if value is None:
        return default
    parsed = parse_flag(value)
    if parsed is None:
        _warn(name, value, "one of " + "/".join(TRUE_WORDS) + " or " + "/".join(FALSE_WORDS),
              "on" if default else "off")
        return default
    return parsed


def integer(name: str, default: int, *, minimum: int | None = None, environ: Mapping[str, str] | None = None) -> int:
    """A whole number (at least ``minimum``), else one warning and ``default``."""
    return _checked(name, default, environ, int, lambda n: minimum is None or n >= minimum,
                    "a whole number" + (f" >= {minimum}" if minimum is not None else ""))


def number(name: str, default: float, *, positive: bool = True, environ: Mapping[str, str] | None = None) -> float:
    """A finite number (> 0 when ``positive``, else >= 0), else one warning and ``default``."""
    return _checked(name, default, environ, float, lambda x: (x > 0 if positive else x >= 0) and x != float("inf"),
                    "a number > 0" if positive else "a number >= 0")


def _checked(name: str, default: Any, environ: Mapping[str, str] | None, parse: Callable[[bytes], Any],
             ok: Callable[[Any], bool], expected: str, *, stacklevel: int = 5, instead: str | None = None) -> Any:
    value = text(name, environ)
    if value is None:
        return default
    try:
        parsed = parse(_word(value))
    except ValueError:
        parsed = None
    if parsed is None or not ok(parsed):  # NaN fails every comparison in ok()
        _warn(name, value, expected, default, stacklevel=stacklevel, instead=instead)
        return default
    return parsed


# -- the accessors (one a variable read by Python) ------------------------------------------
class Accessor(Protocol[T_co]):
    def __call__(self, environ: Mapping[str, str] | None = None) -> T_co: ...


def _text_variable(name: str, doc: str) -> Accessor[str | None]:
    def read(environ: Mapping[str, str] | None = None) -> str | None:
        return text(name, environ)

    read.__doc__ = f"``{name}``: {doc}"
    return read


def _flag_variable(name: str, default: bool, doc: str) -> Accessor[bool]:
    def read(environ: Mapping[str, str] | None = None) -> bool:
        return flag(name, default, environ)

    read.__doc__ = f"``{name}`` (default {'on' if default else 'off'}): {doc}"
    return read


run_dir = _text_variable(RUN_DIR, "set by ``maxinstr run``: where every session of the run writes")
session_dir = _text_variable(SESSION_DIR, "set by an open session: the run a child process joins")
profiler_json = _text_variable(PROFILER, "the JSON ``maxinstr run`` passes about the wrapping profiler")
sampler_nvml_library = _text_variable(SAMPLER_NVML_LIB, "a stand-in libnvidia-ml to load (tests, benchmarks)")
cuda_library = _text_variable(CUDA_LIBRARY, "the driver library to load instead of libcuda.so.1")
native_writer_enabled = _flag_variable(NATIVE_WRITER, True, "the core's writer thread writes the records")
cupti_tags = _flag_variable(CUPTI_TAGS, True, "kernels=True ties ops to stages with the core's launch tags; "
                            "off: with CUPTI's API + external-correlation activity records")
sampler_profile = _flag_variable(SAMPLER_PROFILE, False, "samples.json also gets each call's CPU time")
no_native_columns = _flag_variable(NO_NATIVE_COLUMNS, False, "the nsys SQLite reader stays in Python")
no_direct_scan = _flag_variable(NO_DIRECT_SCAN, False, "the native nsys reader asks SQLite for every table "
                                "instead of scanning integer tables' b-trees itself")
no_malloc_tuning = _flag_variable(NO_MALLOC_TUNING, False, "report/compare leave glibc malloc's and OpenBLAS's "
                                  "settings as the environment has them")
no_nvtx_v2 = _flag_variable(NO_NVTX_V2, False, "do not provide NVTX's v2 entry points for MAX")
max_profiling_by_run = _flag_variable(MAX_PROFILING_BY_RUN, False, "``maxinstr run`` set MODULAR_ENABLE_PROFILING "
                                      "itself (the user did not), so the start-up hook may turn MAX's markers off "
                                      "where they would abort MAX")
run_sampled = _flag_variable(RUN_SAMPLED, False, "``maxinstr run`` samples the GPUs from its own process for the "
                             "whole run, so the run's session in the program starts no sampler")
debug = _flag_variable(DEBUG, False, "CLI errors show the traceback (as ``--debug``)")
disabled = _flag_variable(DISABLE, False, "stages are no-ops, as the native core reads it at import (Python does "
                          "not act on it; tests hold the two answers equal)")


def session_pid(environ: Mapping[str, str] | None = None) -> int | None:
    """``MAXINSTR_SESSION_PID``: the pid of the process whose open session set SESSION_DIR."""
    value = text(SESSION_PID, environ)
    try:
        return None if value is None else int(_word(value))
    except ValueError:
        return None  # not a pid: no process owns it, so this process is not that one either


def capture_request(environ: Mapping[str, str] | None = None) -> str | None:
    """``MAXINSTR_CAPTURE``: what asked for the profiler capture at steady state (``maxinstr
    run`` sets ``1``; the value is kept as meta.json ``capture.requested``), or None: unset,
    blank, or a false word (the truth rule's ``0``/``false``/``no``/``off``)."""
    value = text(CAPTURE, environ)
    return None if value is None or parse_flag(value) is False else value


def capture_window_s(environ: Mapping[str, str] | None = None) -> float | None:
    """``MAXINSTR_CAPTURE_WINDOW_S``: stop the capture this long after it started (None: at close)."""
    if text(CAPTURE_WINDOW_S, environ) is None:
        return None
    window = number(CAPTURE_WINDOW_S, 0.0, positive=False, environ=environ)
    return window if window > 0 else None


def stage_specs(environ: Mapping[str, str] | None = None) -> list[str]:
    """``MAXINSTR_STAGES``: the ``--stage`` specs of ``maxinstr run``, one a line."""
    return [line.strip() for line in (text(STAGES, environ) or "").splitlines() if line.strip()]


def warmup_instances(environ: Mapping[str, str] | None = None) -> int | None:
    """``MAXINSTR_WARMUP`` (``maxinstr run --warmup N``): the run's warm-up count, or None when
    unset (then the script's own session says it)."""
    return _checked(WARMUP, None, environ, int, lambda n: n >= 0, "a whole number >= 0", stacklevel=4,
                    instead="it is ignored, as if unset")


DEFAULT_WRITER_INTERVAL_MS = 2.0
DEFAULT_WRITER_THRESHOLD_RECORDS = 8192


def memory_records(environ: Mapping[str, str] | None = None) -> int:
    """``MAXINSTR_MEMORY_RECORDS``: bound of the default in-memory session (1Mi records)."""
    return integer(MEMORY_RECORDS, 1 << 20, minimum=0, environ=environ)


def writer_interval_ms(environ: Mapping[str, str] | None = None) -> float:
    """``MAXINSTR_WRITER_INTERVAL_MS``: the native writer writes at least this often (2 ms)."""
    return number(WRITER_INTERVAL_MS, DEFAULT_WRITER_INTERVAL_MS, environ=environ)


def writer_threshold_records(environ: Mapping[str, str] | None = None) -> int:
    """``MAXINSTR_WRITER_THRESHOLD``: the native writer writes at once at this many records (8192)."""
    return integer(WRITER_THRESHOLD, DEFAULT_WRITER_THRESHOLD_RECORDS, minimum=1, environ=environ)


SAMPLER_GIL_MODES = ("process", "auto", "release")


def sampler_gil(environ: Mapping[str, str] | None = None) -> str:
    """``MAXINSTR_SAMPLER_GIL``: ``process`` (default), ``auto`` or ``release`` (docs/sampler.md)."""
    value = text(SAMPLER_GIL, environ)
    if value is None:
        return "process"
    mode = _word(value).decode("utf-8", "surrogateescape")
    if mode not in SAMPLER_GIL_MODES:
        _warn(SAMPLER_GIL, value, "one of " + "/".join(SAMPLER_GIL_MODES), "process", stacklevel=3)
        return "process"
    return mode


# -- the launcher's variables (torchrun and the like): one rule for RANK, LOCAL_RANK, WORLD_SIZE --------
def _launcher_number(name: str, environ: Mapping[str, str] | None) -> int | None:
    """A whole number >= 0, ASCII blanks around it ignored; None when unset, blank or anything else
    (``x``, ``-1``, ``2.5``): such a value names no rank, silently, as a program's own variable may."""
    value = text(name, environ)
    try:
        n = None if value is None else int(_word(value))
    except ValueError:
        return None
    return n if n is not None and n >= 0 else None


def rank(environ: Mapping[str, str] | None = None) -> int | None:
    """``RANK``: this process's rank (its part is ``r<rank>.p<pid>``), or None (``p<pid>``)."""
    return _launcher_number("RANK", environ)


def local_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """``LOCAL_RANK``: the rank on this host (the sampler runs where it is 0 or None)."""
    return _launcher_number("LOCAL_RANK", environ)


def world_size(environ: Mapping[str, str] | None = None) -> int | None:
    """``WORLD_SIZE``: how many ranks the job has."""
    return _launcher_number("WORLD_SIZE", environ)
