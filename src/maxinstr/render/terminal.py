"""How wide terminal text is drawn: the one rule for every view that prints to a terminal."""

from __future__ import annotations

import os
import shutil


def text_width(terminal: bool, width: int | None = None) -> int:
    """Columns for terminal text: ``--width``, else ``COLUMNS``, else the terminal's own width,
    else 120 (piped output). At least 40."""
    if width is None:
        env = os.environ.get("COLUMNS", "")
        if env.strip().isdigit():
            width = int(env)
        elif terminal:
            width = shutil.get_terminal_size((120, 40)).columns
        else:
            width = 120
    return max(40, width)
