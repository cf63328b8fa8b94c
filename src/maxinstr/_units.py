"""Durations as short text for the analysis (finding titles) and the views alike."""

from __future__ import annotations

import math


def ns_text(value: float | int | None) -> str:
    """A duration in ns as a short human string: '813.7 us', '21.62 ms', '1.234 s'; '-' for none."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    v = float(value)
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.3f} s"
    if a >= 1e6:
        return f"{v / 1e6:.2f} ms"
    return f"{v / 1e3:.1f} us" if a >= 1e3 else f"{v:.0f} ns"
