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


RULE_WORDS = {"same_thread": "launched on the stage's thread", "cross_thread": "launched by another thread (a runtime's worker)",
              "graph": "graph replays", "start_end": "start/end ranges", "time_overlap": "by GPU time only (no launch call)"}
INSIDE_TITLE = "Inside the stages: the ranges their GPU work ran under (MAX ops, framework ranges)"


def inside_stages(report: dict, n_stages: int = 4, n_ranges: int = 6) -> tuple[list[dict], list[str]]:
    """What every view shows of ``stages[].mix.ranges`` / ``mix.rules``: per leaf stage (most GPU
    time first), its top ranges of other domains as rows {stage, range, share, per_instance,
    gpu_per_instance_ns}, and one line per stage whose ops were tied to it otherwise than on its
    own thread ("forward: 100% launched by another thread (a runtime's worker)")."""
    stages = report.get("stages") or []
    parents = {s.get("parent") for s in stages}
    leaves = [s for s in stages if s["name"] not in parents and s.get("mix")]
    leaves.sort(key=lambda s: -float(s["mix"].get("gpu_ns") or 0))
    rows: list[dict] = []
    tied: list[str] = []
    for s in leaves[:n_stages]:
        mix = s["mix"]
        n_inst = max(int(mix.get("instances") or 1), 1)
        for r in (mix.get("ranges") or [])[:n_ranges]:
            rows.append({"stage": s["name"], "range": r["name"] or "-", "share": r["share"],
                         "per_instance": r["per_instance"], "gpu_per_instance_ns": r["gpu_ns"] / n_inst})
        rules = mix.get("rules") or {}
        if set(rules) - {"same_thread"}:
            total = sum(rules.values()) or 1
            tied.append(f"{s['name']}: " + ", ".join(f"{pct(c / total)} {RULE_WORDS.get(k, k)}" for k, c in rules.items()))
    return rows, tied
