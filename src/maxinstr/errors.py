"""Errors maxinstr raises at its boundaries (vendor errors are translated into these where they enter)."""

from __future__ import annotations


class MaxinstrError(Exception):
    """Base of every error maxinstr raises on purpose."""


class _PathError(MaxinstrError):
    def __init__(self, path: object, problem: str) -> None:
        self.path = str(path)
        self.problem = " ".join(problem.split())  # a library's quoted problem (SQL, newlines and all) on one line
        super().__init__(f"{self.path}: {self.problem}")


class TraceError(_PathError):
    """A trace file cannot be read. The message names the file and the problem in one line."""


class RunDirError(_PathError):
    """A run directory cannot be read. The message names the directory and the problem in one line."""
