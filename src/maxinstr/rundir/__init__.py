"""The run directory: what a session writes and ``maxinstr.load`` reads (docs/formats.md)."""

from __future__ import annotations

from maxinstr.rundir.format import FORMAT_VERSION, STAGE_DTYPE
from maxinstr.rundir.reader import RUN_STAGE_DTYPE, Run, load

__all__ = ["FORMAT_VERSION", "RUN_STAGE_DTYPE", "STAGE_DTYPE", "Run", "load"]
