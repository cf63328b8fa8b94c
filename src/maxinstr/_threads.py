"""The threads maxinstr starts leave the terminating signals to the program's threads."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable
from typing import Any

TERMINATING = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT}


def block_terminating_signals() -> None:
    """Called first on every thread maxinstr starts. The kernel gives a process-directed signal
    (``kill``, ``Pool.terminate()``) to any thread that does not block it, and Python runs its
    handlers on the main thread only: taken by a thread of ours while the main thread waits in C
    (a lock, a queue), the handler waits with it. Blocked here, it goes to a thread of the program."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # (no pthread_sigmask: not POSIX)
        signal.pthread_sigmask(signal.SIG_BLOCK, TERMINATING)


def start_thread(target: Callable[..., Any], name: str, *args: Any) -> threading.Thread:
    """A daemon thread running ``target(*args)`` with the terminating signals blocked."""

    def run() -> None:
        block_terminating_signals()
        target(*args)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
