"""The run directory: what a session writes and ``maxinstr.load`` reads (docs/formats.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from maxinstr.rundir.format import FORMAT_VERSION, STAGE_DTYPE
    from maxinstr.rundir.reader import RUN_STAGE_DTYPE, Run, load

__all__ = ["FORMAT_VERSION", "RUN_STAGE_DTYPE", "STAGE_DTYPE", "Run", "load"]


def __getattr__(name: str) -> Any:
    # on first use, not at import: the sampler's child process imports rundir.samples alone (no numpy)
    if name in __all__:
        from maxinstr.rundir import format, reader

        return getattr(format if hasattr(format, name) else reader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
