"""The serving loop (:func:`maxinstr.analyze.serving.serving_summary`) as plain text lines."""

from __future__ import annotations

from typing import Any

from maxinstr._units import ns_text


def _dist(stat: dict[str, Any], unit: str = "") -> str:
    if not stat.get("n"):
        return "-"
    if unit == "ns":
        return f"median {ns_text(stat['median'])}, p90 {ns_text(stat['p90'])}, max {ns_text(stat['max'])}"
    return f"mean {stat['mean']:.1f}, max {stat['max']:.0f}"


def serving_text(summary: dict[str, Any]) -> list[str]:
    """One line a step kind (count, host time, contexts and tokens a step), then tokenize and the
    requests' queueing before their first step; says so when the run has no serving stages."""
    steps = summary["steps"]
    queue = summary["queue"]
    if not steps and not queue["requests"]:
        return ["serving loop: no prefill, decode or queued records in this span (the max preset records them: "
                "maxinstr server start --preset max, automatic for `max serve`)"]
    lines = ["serving loop (server side, from the run's records):"]
    for name, step in steps.items():
        lines.append(f"  {name:<8} {step['n']:>5} steps  host {_dist(step['host_ns'], 'ns')};  "
                     f"contexts/step {_dist(step['batch'])};  tokens/step {_dist(step['tokens'])}")
    if summary["tokenize_ns"].get("n"):
        lines.append(f"  tokenize {summary['tokenize_ns']['n']:>5} calls  host {_dist(summary['tokenize_ns'], 'ns')}")
    if queue["requests"]:
        lines.append(f"  queueing before the first step ({queue['started']} of {queue['requests']} requests): "
                     f"{_dist(queue['wait_ns'], 'ns')}"
                     + (f"; {queue['not_started']} never started a step" if queue["not_started"] else ""))
    return lines
