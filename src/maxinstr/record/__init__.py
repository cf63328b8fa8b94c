"""Recording: `stage` and `mark` (the native functions themselves: no Python layer on the hot path;
`@maxinstr.stage(...)` as a decorator: :mod:`maxinstr.record.stage`), and the process-wide switch
(`disable()`, or MAXINSTR_DISABLE=1: `stage()` returns a shared no-op).
"""

from __future__ import annotations

import maxinstr._native as _native
from maxinstr import config as _config
from maxinstr._attrs import plain as _plain_attrs

# Import the decorator module before binding `stage`: importing a submodule sets the package
# attribute of the same name, which must not overwrite the function below.
from maxinstr.record import stage as _stage_module  # noqa: F401

stage = _native.stage
mark = _native.mark

_native._set_attrs_hook(_plain_attrs)  # attrs are data: no reference to the user's objects is kept
is_enabled = _native.is_enabled
clock_ns = _native.clock_ns


def enable() -> None:
    """Record stages and marks again (process-wide)."""
    _native.set_enabled(True)


def disable() -> None:
    """Make `stage()` return a shared no-op and `mark()` do nothing (process-wide)."""
    _native.set_enabled(False)


def set_gpu_budget(share: float) -> None:
    """Share of wall time GPU timing may cost the program (default 0.0025; env MAXINSTR_GPU_BUDGET):
    past it, top-level stages with ``gpu=None`` go untimed (``GPU_SAMPLED_OUT``) until the cost is
    back under budget; ``gpu=True`` stages are always timed; ``0`` times every stage (docs/stage-core.md)."""
    _native._configure_events(gpu_budget=float(share))


__all__ = ["stage", "mark", "enable", "disable", "is_enabled", "clock_ns", "set_gpu_budget"]

# A process started from inside an open session (spawn/forkserver children, subprocesses) or
# under `maxinstr run` joins that run here, so its stages land in a part of its own. Never lets a
# problem there break `import maxinstr.record`.
if _config.session_dir() or _config.run_dir():
    try:
        # only then: the session module brings numpy and the writer, which `import maxinstr` must not
        from maxinstr.record.session import ensure_env_session as _ensure_env_session

        _ensure_env_session()
    except Exception:  # noqa: BLE001
        pass
