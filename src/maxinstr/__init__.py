"""maxinstr: in-process GPU stage instrumentation.

    import maxinstr

    with maxinstr.session("runs/decode", warmup=2):
        with maxinstr.stage("decode", step=0):
            ...

Public names are imported lazily so `import maxinstr` stays cheap and never touches a GPU.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "stage": "maxinstr.record",
    "mark": "maxinstr.record",
    "enable": "maxinstr.record",
    "disable": "maxinstr.record",
    "is_enabled": "maxinstr.record",
    "set_gpu_budget": "maxinstr.record",
    "session": "maxinstr.record.session",
    "Session": "maxinstr.record.session",
    "current_session": "maxinstr.record.session",
    "load": "maxinstr.rundir",
    "Run": "maxinstr.rundir",
    "instrument": "maxinstr.launch.instrument",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from maxinstr.launch.instrument import instrument
    from maxinstr.record import disable, enable, is_enabled, mark, set_gpu_budget, stage
    from maxinstr.record.session import Session, current_session, session
    from maxinstr.rundir import Run, load


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'maxinstr' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
