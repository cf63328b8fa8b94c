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
    from maxinstr.launch.instrument import instrument as instrument
    from maxinstr.record import disable as disable
    from maxinstr.record import enable as enable
    from maxinstr.record import is_enabled as is_enabled
    from maxinstr.record import mark as mark
    from maxinstr.record import set_gpu_budget as set_gpu_budget
    from maxinstr._native import stage as stage  # what maxinstr.record.stage is (a submodule shares the name)
    from maxinstr.record.session import Session as Session
    from maxinstr.record.session import current_session as current_session
    from maxinstr.record.session import session as session
    from maxinstr.rundir import Run as Run
    from maxinstr.rundir import load as load


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'maxinstr' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
