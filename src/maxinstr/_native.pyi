"""Type stub of maxinstr._native, the C++ stage core (csrc/core/, module.cpp first; docs/stage-core.md)."""

from collections.abc import Sequence
from collections.abc import Callable
from typing import Any, Final, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])

RECORD_SIZE: Final[int]  # 72: one row of maxinstr.rundir.format.STAGE_DTYPE
FLAG_EXCEPTION: Final[int]
FLAG_GPU_TIMED: Final[int]
FLAG_MARK: Final[int]
FLAG_GPU_DROPPED: Final[int]
FLAG_UNCLOSED: Final[int]
FLAG_GPU_SAMPLED_OUT: Final[int]

class Stage:
    """An instrumented stage. Context manager; calling it with a function decorates it."""

    @property
    def name(self) -> str: ...
    @property
    def id(self) -> int:
        """Record id of the last enter, `(pid << 32) | seq`; 0 before the first enter."""
    @property
    def attrs(self) -> dict[str, Any]: ...
    @property
    def open(self) -> bool: ...
    def __enter__(self) -> Stage: ...
    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool: ...
    def __call__(self, func: _F) -> _F: ...
    def _spec(self) -> tuple[str, dict[str, Any]]: ...

class NoopStage:
    """The shared object `stage()` returns while disabled; decorating returns the function."""

    def __enter__(self) -> NoopStage: ...
    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool: ...
    def __call__(self, func: _F) -> _F: ...

NOOP: Final[NoopStage]

def clock_ns() -> int:
    """CLOCK_MONOTONIC in ns: the host clock of all records and samples."""

def set_enabled(on: bool) -> None: ...
def _set_attrs_hook(hook: Any) -> None:
    """The function every stage's attrs go through at exit (maxinstr._attrs.plain)."""
def is_enabled() -> bool: ...
def _env_flag(name: str, default: bool) -> bool:
    """A yes/no variable as the core reads it (csrc/core/base.h env_flag; the rule of maxinstr.config)."""

def stage(
    name: str, *, stream: int | Any | None = None, gpu: bool | None = None, step: int | None = None, **attrs: Any
) -> Stage | NoopStage:
    """A stage context manager. stream: int handle (torch `.cuda_stream`, CuPy `.ptr`) or an object
    with one of those attributes; None = the legacy default stream. gpu: None = time on the GPU when a
    driver is loaded and a context is current; False = host only. step: None = inherit."""

def mark(name: str, **attrs: Any) -> None:
    """An instant record (flag MARK) and an NVTX/roctx mark."""

def drain(max_records: int = -1) -> tuple[bytes, list[tuple[int, str]], list[tuple[int, dict[str, Any]]]]:
    """Completed records since the last drain (all threads) as STAGE_DTYPE bytes; as (name_id, name)
    the names first seen since the last drain plus those the returned records use (so each drain is
    self-contained whoever drained before); attrs of the returned records as (record_id, dict)."""

def attrs_lines(pairs: list[tuple[int, dict[str, Any]]]) -> tuple[bytes, list[tuple[int, dict[str, Any]]]]:
    """The attrs.jsonl lines of the (record_id, attrs) pairs whose attrs are JSON scalars under str
    keys (rundir.writer.attrs_line's bytes, made in C++); the other pairs, for the Python path."""

def names() -> list[tuple[int, str]]:
    """Every (name_id, name) of this process, for a consumer that missed earlier drains."""

def resolve(block: bool = False) -> int:
    """Resolve finished GPU event pairs (non-blocking query); block=True waits (flush/close only)."""

def resolve_async() -> int:
    """resolve() for the session flusher: elapsed-time calls go to the core's placer thread."""

def close_open(reason: str = "closed") -> int:
    """Close every open stage on every thread with flag UNCLOSED; returns how many."""

def stats() -> dict[str, Any]: ...
def set_capacity(max_pending_records: int) -> None: ...
def profiler_start() -> bool:
    """cuProfilerStart (roctxProfilerResume); from a thread with no current context, with the
    device's active primary context pushed around the call."""

def profiler_stop() -> bool: ...
def steady_watch(n: int, hook: Callable[[int, int], object] | None) -> bool:
    """Call ``hook(name_id, t_ns)`` once, at the first top-level stage entered whose name was
    entered ``n`` times before (the steady-state trigger, maxinstr/warmup.py); ``n < 0``: off."""
def _configure_events(
    pool_size: int | None = None,
    share_ns: int | None = None,
    floor_ns: int | None = None,
    gpu_budget: float | None = None,
) -> dict[str, float]: ...
def cupti_link(path: str | None, kind: int = 0) -> bool: ...
def cupti_stats() -> dict[str, Any]: ...
def cupti_tags(path: str | None, runtime_cbids: Sequence[int] = ..., driver_cbids: Sequence[int] = ...,
               flags: int = 1) -> bool | int:
    """Tag each call of those functions with the calling thread's innermost stage (CUPTI callback
    API; kernels=True). flags: 1 entry/exit times, 2 no work (benchmarks). None unsubscribes;
    an int is cuptiSubscribe's error (39: another subscriber)."""
def cupti_tags_take() -> bytes:
    """The 48-byte tags of the calls that ended since the last take (kernels/cupti.py TAG_DTYPE)."""
def cupti_tags_stats() -> dict[str, Any]: ...
def cupti_buffers(path: str, buffer_bytes: int = ..., max_pending_bytes: int = ...) -> bool:
    """CUPTI activity buffers handled natively (no Python on CUPTI's thread); kernels=True."""
def cupti_flush(flag: int = 0) -> int:
    """cuptiActivityFlushAll, GIL released."""
def cupti_take() -> list[tuple[bytes, bytes]]:
    """Completed activity buffers and their record offsets (int64, as bytes)."""
def cupti_buffer_stats() -> dict[str, Any]: ...
