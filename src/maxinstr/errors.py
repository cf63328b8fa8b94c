"""Errors maxinstr raises at its boundaries (vendor errors are translated into these where they enter)."""

from __future__ import annotations


class MaxinstrError(Exception):
    """Base of every error maxinstr raises on purpose."""


def one_line(text: str) -> str:
    """``text`` with every run of whitespace as one space: a library's quoted problem stays on one line."""
    return " ".join(text.split())


class _PathError(MaxinstrError):
    def __init__(self, path: object, problem: str) -> None:
        self.path = str(path)
        self.problem = one_line(problem)
        super().__init__(f"{self.path}: {self.problem}")


class TraceError(_PathError):
    """A trace file cannot be read. The message names the file and the problem in one line."""


class RunDirError(_PathError):
    """A run directory cannot be read. The message names the directory and the problem in one line."""
