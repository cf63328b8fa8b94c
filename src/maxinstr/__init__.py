"""maxinstr: in-process GPU stage instrumentation (``with maxinstr.session("runs/decode", warmup=2):``
``with maxinstr.stage("decode", step=0): ...``). Public names are imported lazily so `import
maxinstr` stays cheap and never touches a GPU.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from maxinstr._version import __version__

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "stage": "maxinstr.record", "mark": "maxinstr.record", "enable": "maxinstr.record", "disable": "maxinstr.record",
    "is_enabled": "maxinstr.record", "set_gpu_budget": "maxinstr.record", "session": "maxinstr.record.session",
    "Session": "maxinstr.record.session", "current_session": "maxinstr.record.session", "load": "maxinstr.rundir",
    "Run": "maxinstr.rundir", "instrument": "maxinstr.launch.instrument"}

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover  (`X as X`: re-exported, for type checkers and linters)
    from maxinstr._native import stage as stage  # what maxinstr.record.stage is (a submodule shares the name)
    from maxinstr.launch.instrument import instrument as instrument
    from maxinstr.record import disable as disable, enable as enable, is_enabled as is_enabled, mark as mark
    from maxinstr.record import set_gpu_budget as set_gpu_budget
    from maxinstr.record.session import Session as Session, current_session as current_session, session as session
    from maxinstr.rundir import Run as Run, load as load


def __getattr__(name: str) -> Any:
    if (module := _EXPORTS.get(name)) is None:
        raise AttributeError(f"module 'maxinstr' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
