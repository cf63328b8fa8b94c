"""Number formatting shared by the text and Markdown renderers."""

from __future__ import annotations

import math
from typing import Any


def ns(value: float | int | None) -> str:
    """A duration in ns as a short human string: '813.7 us', '21.62 ms', '1.234 s'."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    v = float(value)
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.3f} s"
    if a >= 1e6:
        return f"{v / 1e6:.2f} ms"
    if a >= 1e3:
        return f"{v / 1e3:.1f} us"
    return f"{v:.0f} ns"


def pct(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{100 * value:.{digits}f}%"


def stat(s: dict | None, key: str = "median") -> float | None:
    """``s[key]`` when the statistic rests on at least one value, else None."""
    if not s or not s.get("n"):
        return None
    return s.get(key)


def gpu_stat(stage: dict) -> tuple[str, dict | None]:
    """The stage's GPU time statistic to show: event-based when recorded, else trace-projected."""
    for key, label in (("gpu_event_ns", "event"), ("gpu_proj_ns", "proj")):
        if (stage.get(key) or {}).get("n"):
            return label, stage[key]
    return "", None


def excluded(stage: dict) -> int:
    """Instances of a stage kept out of its statistics: warm-up, cold start, and those nested in
    a warm-up or cold-start instance of an enclosing stage."""
    return int(stage.get("warmup", 0) + stage.get("cold_start", 0) + stage.get("inside_startup", 0))


def warmup_line(w: dict) -> str:
    """What the statistics leave out, in one sentence (after 'warm-up')."""
    inside = w.get("inside_startup_instances", 0)
    return (f"{w.get('n', 0)} per stage declared; {w.get('instances', 0)} warm-up and "
            f"{w.get('cold_start_instances', 0)} cold-start instances"
            + (f", and the {inside} nested in them," if inside else "")
            + " kept out of the steady numbers (an instance inside a warm-up or cold-start instance "
              "of an enclosing stage is warm-up too)")


def short(name: str | None, n: int = 60) -> str:
    if not name:
        return "-"
    return name if len(name) <= n else name[: n - 1] + "…"


def evidence_text(evidence: dict[str, Any], limit: int = 6) -> str:
    parts = []
    for k, v in list(evidence.items())[:limit]:
        if v is None:
            continue
        if isinstance(v, bool):
            v = str(v).lower()
        elif isinstance(v, (int, float)) and (k.endswith("_ns") or "_ns_" in k):
            v = ns(v)
        elif isinstance(v, float):
            if k.endswith("_ns") or k.endswith("_ns_median"):
                v = ns(v)
            elif k.endswith("share") or k.endswith("frac") or "frac_" in k:
                v = pct(v, 1)
            else:
                v = f"{v:.3g}"
        elif isinstance(v, dict):
            v = ", ".join(f"{a}={b}" for a, b in v.items()) or "-"
        elif isinstance(v, str) and len(v) > 60:
            v = short(v, 60)
        parts.append(f"{k}={v}")
    return "; ".join(parts)


def signed_ns(v: float | None) -> str:
    """A duration delta with its sign: '+2.00 ms', '-149.4 us'."""
    if v is None:
        return "-"
    return ("+" if v > 0 else "") + ns(v)


def setting(value: Any) -> str:
    """A meta value for display: command lists as a shell line."""
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        import shlex

        return shlex.join(value)
    return "-" if value is None else str(value)
