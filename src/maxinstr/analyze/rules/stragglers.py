"""A rank the others wait for, or the slowest at a stage (``report["ranks"]["stragglers"]``,
analyze/ranks.py)."""

from __future__ import annotations

from typing import Any

from maxinstr.analyze.commands import Commands
from maxinstr.analyze.rules.base import Draft
from maxinstr.analyze.schema import Report


def rule_straggler(report: Report, cmd: Commands) -> list[Draft]:
    sec = report.get("ranks") or {}
    out: list[Draft] = []
    if not sec.get("stragglers"):
        return out
    top_total = sum(float((st.get("host_ns") or {}).get("total", 0.0)) for st in report.get("stages", [])
                    if st.get("depth", 0) == 0)
    per_rank_total = top_total / max(int(sec.get("world_size") or 1), 1)
    gpu = {g["rank"]: g for g in (sec.get("gpu") or [])}
    for sg in sec.get("stragglers") or []:
        r = sg["rank"]
        slow = sg.get("slowest_in") or []
        late = sg.get("others_wait_in") or []
        ev: dict[str, Any] = {"rank": r}
        parts = []
        if slow:
            s0 = slow[0]
            ev.update({"slow_stage": s0["stage"], "rank_median_ns": s0["median_ns"],
                       "other_ranks_median_ns": s0["others_median_ns"]})
        if late:
            l0 = late[0]
            ev["sync_stage"] = l0["stage"]
            for k, v in (l0.get("wait_median_ns") or {}).items():
                if k != str(r) and v is not None:
                    ev[f"rank{k}_wait_median_ns"] = v
        if slow:
            ev.update({"slowest_in_share": round(s0["slowest_share"], 3),
                       "excess_median_ns": s0["excess_median_ns"], "groups": s0["groups"]})
            parts.append(f"slowest at '{s0['stage']}' in {s0['slowest_share']:.0%} of {s0['groups']} steps")
        if late:
            l0 = late[0]
            ev.update({"waited_for_share": round(l0["least_wait_share"], 3),
                       "arrives_last_share": round(l0["last_arrival_share"], 3),
                       "arrival_lag_median_ns": l0["arrival_median_ns"],
                       "others_wait_total_ns": sg["others_wait_total_ns"]})
            parts.append(f"the other ranks wait for it in '{l0['stage']}' in {l0['least_wait_share']:.0%} of "
                         f"{l0['groups']} steps")
            for other, g in gpu.items():
                other_share = g.get("collective_share")
                if other != r and other_share is not None:
                    ev[f"rank{other}_collective_gpu_share"] = round(other_share, 3)
            own_share = gpu[r].get("collective_share") if r in gpu else None
            if own_share is not None:
                ev[f"rank{r}_collective_gpu_share"] = round(own_share, 3)
        cost = max(sg.get("others_wait_total_ns", 0.0), sg.get("excess_total_ns", 0.0))
        score = min(cost / per_rank_total, 1.0) if per_rank_total > 0 else 0.0
        stage = (slow[0]["stage"] if slow else late[0]["stage"])
        out.append(Draft(
            "straggler_rank", f"Rank {r} is the straggler: " + "; ".join(parts), "fact", stage, ev,
            f"Find why rank {r} is slower at '{stage}': uneven data or work per rank, a slower or throttled GPU, "
            "a busy host CPU, or its own I/O. Compare its per-rank statistics with the others; profile that rank.",
            validation="After the fix, the per-rank table shows the stage's medians within 10% of each other "
                       "and no rank slowest in most steps.",
            score=score))
    return out
