"""The multi-rank part of the report (``report["ranks"]``) as rows of strings, shared by the
text, Markdown and HTML renderers so they show the same numbers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from maxinstr.render import _fmt as f

if TYPE_CHECKING:
    from maxinstr.analyze.schema import RanksSection, Report


STAGES_SHOWN = 12


def section(report: Report) -> RanksSection | None:
    sec = report.get("ranks")
    return sec if isinstance(sec, dict) and sec.get("stages") is not None else None


def rank_rows(sec: RanksSection) -> tuple[list[str], list[list[str]]]:
    """One row per rank: identity, records, and GPU time with its collective share when a trace was given."""
    gpu = {g["rank"]: g for g in sec.get("gpu") or []}
    header = ["rank", "local rank", "host", "pids", "records"]
    if gpu:
        header += ["GPU time", "collective", "top family"]
    rows = []
    for r in sec.get("ranks") or []:
        row = [str(r["rank"]) + (" (unclosed)" if r.get("unclosed") else ""), _s(r.get("local_rank")), _s(r.get("host")),
               ", ".join(str(p) for p in r.get("pids") or []), str(r.get("records", 0))]
        if gpu:
            g = gpu.get(r["rank"]) or {}
            row += [f.ns(g.get("gpu_ns")), f"{f.ns(g.get('collective_ns'))} ({f.pct(g.get('collective_share'))})" if g else "-",
                    _s(g.get("top_family"))]
        rows.append(row)
    return header, rows


def stage_rows(sec: RanksSection, limit: int = STAGES_SHOWN) -> tuple[list[str], list[list[str]]]:
    """Per stage and rank: steady count, host median and p90, GPU median, how often the rank is
    the slowest / the last to arrive over the aligned steps, its median excess over the other
    ranks, and in synchronising stages its median wait."""
    stages = (sec.get("stages") or [])[:limit]
    basis = next((s.get("gpu_basis") for s in stages if s.get("gpu_basis")), None)
    header = ["stage", "rank", "n", "host median", "host p90"]
    if basis:
        header.append("GPU median" + (" (event)" if basis == "gpu_event_ns" else " (proj)"))
    header += ["steps", "slowest", "last in", "vs others", "wait"]  # wait: in [sync] stages only
    rows = []
    for s in stages:
        for i, r in enumerate(s["per_rank"]):
            name = s["stage"] + (" [sync]" if s.get("sync") else "") if i == 0 else ""
            row = [name, str(r["rank"]), str((r.get("host_ns") or {}).get("n", 0)), f.ns(f.stat(r.get("host_ns"))),
                   f.ns(f.stat(r.get("host_ns"), "p90"))]
            if basis:
                row.append(f.ns(f.stat(r.get(basis))))
            judged = s.get("groups", 0) > 0
            row += [str(s.get("groups", 0)) if i == 0 else "",
                    f.pct(r.get("slowest_share")) if judged else "-",
                    f.pct(r.get("last_arrival_share")) if judged else "-",
                    f.signed_ns(r.get("excess_median_ns")) if judged else "-",
                    f.ns(r.get("wait_median_ns")) if r.get("wait_median_ns") is not None else "-"]
            rows.append(row)
    return header, rows


def straggler_lines(sec: RanksSection) -> list[str]:
    """Plain sentences naming each straggler rank with its numbers (empty: balanced)."""
    out: list[str] = []
    for sg in sec.get("stragglers") or []:
        r = sg["rank"]
        for s in sg.get("slowest_in") or []:
            out.append(f"rank {r} is the slowest at '{s['stage']}' in {f.pct(s['slowest_share'])} of {s['groups']} steps: "
                       f"median {f.ns(s['median_ns'])} vs {f.ns(s['others_median_ns'])} on the other ranks "
                       f"(+{f.ns(s['excess_median_ns'])} per step, {f.ns(s['excess_total_ns'])} in all)")
        for w in sg.get("others_wait_in") or []:
            waits = ", ".join(f"rank {k} {f.ns(v)}" for k, v in (w.get("wait_median_ns") or {}).items()
                              if k != str(r) and v is not None)
            out.append(f"the other ranks wait for rank {r} in '{w['stage']}' (synchronising) in "
                       f"{f.pct(w['least_wait_share'])} of {w['groups']} steps (median wait per step: {waits}; "
                       f"{f.ns(sg['others_wait_total_ns'])} in all); it arrives last in {f.pct(w['last_arrival_share'])}, "
                       f"median {f.ns(w['arrival_median_ns'])} after the first")
    return out


def summary_line(sec: RanksSection) -> str:
    n = sec.get("world_size")
    if sec.get("stragglers"):
        return f"{n} ranks; straggler: rank " + ", ".join(str(s["rank"]) for s in sec["stragglers"])
    return f"{n} ranks; no straggler"


def _s(v: Any) -> str:
    return "-" if v is None else str(v)
