"""The report as a Markdown diagnosis note: baseline and environment, stage table, ranked
bottlenecks, facts apart from hypotheses, candidate optimisations with the validation each
needs, and the exact commands to reproduce."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal

from maxinstr._text import kernel_label, shown
from maxinstr.render import _fmt as f
from maxinstr.render import _ranks as rk

if TYPE_CHECKING:
    from maxinstr.analyze.compare import CompareResult
    from maxinstr.analyze.report import Analysis
    from maxinstr.analyze.schema import Report, StartupRow


class Md(str):
    """Text that is Markdown already (a code span, an indentation): tables take it as it is."""


# CommonMark: any ASCII punctuation may be backslash-escaped. These are the characters that
# start inline markup (emphasis, code, links and images (a `]` without its `[` is text), raw
# HTML, entities, strikethrough, table cells) or a heading; `_` only where it can open or close
# emphasis (not inside a word).
_INLINE = re.compile(r"[\\`*\[<>&|~!#]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_BLOCK_START = re.compile(r"^(\s*)([-+=>]|\d+[.)])")


def _text(value: Any) -> Md:
    """Data (a name, a path, a sentence quoting names) as Markdown that shows exactly that text:
    no emphasis, link, image, raw HTML or table cell break can come out of it."""
    return Md(_INLINE.sub(lambda m: "\\" + m.group(), shown(value)))


def _item(value: Any) -> Md:
    """:func:`_text` that begins a list item: it cannot start a nested list, quote or heading either."""
    return Md(_BLOCK_START.sub(lambda m: m.group(1) + "\\" + m.group(2), _text(value)))


def _code(value: Any, *, in_table: bool = True) -> Md:
    """A code span holding ``value`` whatever backticks it contains (a fence one longer than its
    longest run); in a table, pipes are escaped as GFM wants inside code spans too."""
    s = shown(value)
    fence = "`" * (max((len(r) for r in re.findall("`+", s)), default=0) + 1)
    pad = " " if s[:1] in ("`", " ") or s[-1:] in ("`", " ") else ""
    if in_table:
        s = s.replace("|", "\\|")
    return Md(f"{fence}{pad}{s}{pad}{fence}")


def _fenced(command: str, info: str = "sh") -> list[str]:
    """A fenced code block for ``command``: its fence is longer than any backtick run inside."""
    body = shown(command)
    fence = "`" * max(3, max((len(r) for r in re.findall("`+", body)), default=0) + 1)
    return [fence + info, body, fence]


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(c if isinstance(c, Md) else _text(c) for c in r) + " |" for r in rows] + [""]


def _baseline(report: Report) -> list[str]:
    src, env = report.get("sources", {}), report.get("environment", {})
    out = ["## Baseline", ""]
    for rep in report.get("reproduce", []):
        if rep["what"] == "the program, as run":
            out += ["Command:", ""] + _fenced(rep["command"]) + [""]
    sources: tuple[tuple[Literal["run", "trace", "unprofiled_run"], str], ...] = (
        ("run", "run directory"), ("trace", "trace"), ("unprofiled_run", "unprofiled run (headline)"))
    rows: list[list[Any]] = [[label, _code(src[key])] for key, label in sources if src.get(key)]
    rows += [["trace format", src.get("trace_format")]] if src.get("trace_format") else []
    rows += [["record join", f"{src.get('join')} ({src.get('records_joined')} records)"]] if src.get("join") else []
    rows += [["join failed", src.get("join_problem")]] if src.get("join_problem") else []
    rows += [["capture empty", src.get("capture_problem")]] if src.get("capture_problem") else []
    git = env.get("git") or {}
    rows += [["git", f"{git.get('commit', '?')}{' (dirty)' if git.get('dirty') else ''}"]] if git else []
    text_keys: tuple[Literal["host", "python", "driver", "cuda", "rocm", "maxinstr"], ...] = (
        "host", "python", "driver", "cuda", "rocm", "maxinstr")
    rows += [[k, env[k]] for k in text_keys if env.get(k)]
    rows += [["gpus", ", ".join(str(g.get("name")) for g in env.get("gpus") or [])]] if env.get("gpus") else []
    dict_keys: tuple[Literal["frameworks", "user", "env"], ...] = ("frameworks", "user", "env")
    rows += [[k, ", ".join(f"{a}={b}" for a, b in env[k].items())] for k in dict_keys if env.get(k)]
    rows.append(["warm-up", f.warmup_line(report.get("warmup", {}))])
    if report.get("perturbed"):
        rows.append(["perturbed", f"{report.get('perturbed_reason')}" + (
            "; headline timings from the unprofiled run" if report.get("headline_source") == "unprofiled_run" else "")])
    return out + _table(["what", "value"], rows)


def _stages(report: Report) -> list[str]:
    if not (stages := report.get("stages") or []):
        return ["## Stage timings", "", "No stages in this input.", ""]
    gpu_cols = any(f.gpu_stat(s)[1] for s in stages)
    busy_col = any((s.get("gpu_busy_frac") or {}).get("n") for s in stages)
    header = ["stage", "n", "excluded", "host median", "host p90"]
    header += ["GPU median", "GPU p90"] if gpu_cols else []
    header += ["GPU busy"] if busy_col else []
    rows = []
    pops = []
    for s in stages:
        depth, label = f.stage_label(s["name"], s.get("depth", 0))
        indent = "&nbsp;&nbsp;" * depth
        units = [(s, Md(indent + _text(label)), f.excluded(s))]
        groups = (s.get("populations") or {}).get("groups") or []
        units += [(f.population_row(g), Md(indent + "&nbsp;&nbsp;· " + _text(g["label"])), 0)
                  for g in groups]
        if groups:
            pops.append(s)
        for u, name, excluded in units:
            head = u.get("headline_host_ns") or u["host_ns"]
            label, g = f.gpu_stat(u)
            row = [name, u["steady"], excluded, f.ns(f.stat(head)), f.ns(f.stat(head, "p90"))]
            if gpu_cols:
                row += [(f.ns(f.stat(g)) + f" ({label})") if g else "-", f.ns(f.stat(g, "p90"))]
            if busy_col:
                row += [f.pct(f.stat(u.get("gpu_busy_frac")))]
            rows.append(row)
    note = ("Median and p90 over steady instances; warm-up and cold-start instances, and the instances "
            "nested in them, are counted apart.")
    for s in pops:
        p = s.get("populations") or {}  # (each has two populations: they were listed for that)
        note += (f" {_code(s['name'], in_table=False)} has two populations ("
                 + (f"told apart by {_text(p['by'])}" if p.get("by") else _text(f.unexplained_populations(p.get("basis") == "host_ns")))
                 + "), each in its own row" + ("; the stage's median lies between them" if p.get("median_in_gap") else "")
                 + ".")
    if raised := f.raised_note(stages):
        note += f" {_text(raised[0].upper() + raised[1:])}."
    if any(s.get("headline_from") == "unprofiled_run" for s in stages):
        note += " Host times come from the unprofiled run; GPU columns from the profiled one."
    return ["## Stage timings (steady state)", "", note, ""] + _table(header, rows)


def _bottlenecks(report: Report) -> list[str]:
    if not (rows := report.get("bottlenecks") or []):
        return []
    body = [[r["rank"], f.stage_name(r["stage"]) + (" (self)" if r.get("has_children") else ""), f.pct(r["share"]), f.ns(r["self_ns"]), r["basis"],
             f"{r['top_family']} {f.pct(r.get('top_family_share'))}" if r.get("top_family") else "-",
             _code(f.short(kernel_label(r.get("top_kernel") or ""), 60)) if r.get("top_kernel") else "-",
             ", ".join(r["findings"]) or "-"] for r in rows]
    return ["## Ranked bottlenecks", ""] + _table(
        ["#", "stage", "share", "self time", "basis", "top family", "top kernel", "findings"], body)


def _findings(report: Report) -> list[str]:
    groups = dict(f.finding_groups(report.get("diagnosis") or []))
    out: list[str] = []
    for group, title in (("Facts", "Facts (measured)"), ("Hypotheses", "Hypotheses (to confirm)"),
                         ("Also noted (nothing at stake)", "Also noted (nothing at stake)")):
        if not (fs := groups.get(group, [])):
            out += [f"## {title}", "", "None.", ""] if group != title else []  # (facts and hypotheses always)
            continue
        out += [f"## {title}", ""]
        for x in fs:
            out.append(f"- **{_text(x['id'])}** ({f.at_stake(x.get('score'))}): {_text(x['title'])}")
            if ev := f.evidence_text(x.get("evidence") or {}, x["id"], limit=8):
                out.append(f"  - evidence: {_text(ev)}")
            if x.get("next_step"):
                out.append(f"  - next step: {_text(x['next_step'])}")
            if x.get("command"):
                out.append(f"  - command: {_code(x['command'], in_table=False)}")
        out.append("")
    return out


def _optimisations(report: Report) -> list[str]:
    fs = [x for x in report.get("diagnosis") or [] if x.get("validation")]
    out = ["## Candidate optimisations", ""]
    if not fs:
        return out + ["None suggested by the rules.", ""]
    for i, x in enumerate(fs, 1):
        stage = f", stage {_text(x['stage'])}" if x.get("stage") else ""
        out.append(f"{i}. {_item(x['next_step'])} (from **{_text(x['id'])}**{stage})")
        out.append(f"   - validation: {_text(x['validation'])}")
    return out + [""]


def _families(report: Report) -> list[str]:
    fams, ks, scope, caption = f.gpu_tables(report)
    if not fams:
        return []
    rows = [[r["family"], f.pct(r["share"], 1), f.ns(r["gpu_ns"]), r["count"]] for r in fams]
    out = [f"## GPU time by kernel family ({scope})", "", _text(caption[0].upper() + caption[1:]) + ".", ""]
    out += _table(["family", "share", "time", "ops"], rows)
    if ks:
        out += [f"Top kernels ({scope}):", ""] + _table(
            ["kernel", "family", "share", "count", "median"],
            [[_code(f.short(kernel_label(k["name"]), 90)), k["family"], f.pct(k["share"], 1), k["count"], f.ns(k["median_ns"])] for k in ks[:10]])
    return out


def _inside_stages(report: Report) -> list[str]:
    rows, tied = f.inside_stages(report)
    tied_line = [_text("Ops tied to their stage: " + "; ".join(tied) + "."), ""] if tied else []
    if not rows:
        return tied_line
    return [f"## {f.INSIDE_TITLE}", ""] + _table(
        ["stage", "range", "share", "ops / inst", "GPU / inst"],
        [[f.stage_name(r["stage"]), _code(r["range"]), f.pct(r["share"]), f"{r['per_instance']:.4g}", f.ns(r["gpu_per_instance_ns"])]
         for r in rows]) + tied_line


def _startup(report: Report) -> list[str]:
    if not report.get("startup"):
        return []
    rows, caption = f.startup_shown(report)

    def gpu(r: StartupRow) -> str:
        basis, v = f.startup_gpu(r)
        return f"{f.ns(v)} ({basis})" if basis else "-"

    body = [[f.stage_name(r["stage"]), r["occurrence"], r["reason"].replace("_", " "), f.ns(r["host_ns"]), gpu(r),
             r.get("nested") or "-", f"{r['robust_z']:.0f}" if r.get("robust_z") is not None else "-"] for r in rows]
    return ["## Startup (kept out of the numbers above)", ""] + _table(
        ["stage", "#", "why", "host", "GPU", "nested", "robust z"], body) + [_text(caption[0].upper() + caption[1:]) + ".", ""]


def _reproduce(report: Report) -> list[str]:
    return ["## Reproduce", ""] + [line for r in report.get("reproduce") or []
                                   for line in [f"{_text(r['what'])}:", ""] + _fenced(r["command"]) + [""]]


def _ranks(report: Report) -> list[str]:
    if (sec := rk.section(report)) is None:
        return []
    out = ["## Ranks", "", _text(rk.summary_line(sec) + f". Clock: {sec.get('clock')}."), ""]
    out += _table(*rk.rank_rows(sec))
    out += ["### Per-rank stage statistics", "",
            "_steps: instances aligned across ranks (the k-th of the stage on every rank); slowest / last in: share of "
            "steps where the rank took longest / started last; vs others: median excess over the other ranks; wait: "
            "time waiting for the last rank in a [sync] stage (one that the ranks leave together)._", ""]
    out += _table(*rk.stage_rows(sec))
    if lines := rk.straggler_lines(sec):
        out += ["**Stragglers**", ""] + [f"- {_item(x)}" for x in lines] + [""]
    return out


def render(report: Report, analysis: Analysis | None = None, *, width: int = 120, color: bool = False) -> str:
    """The report as a Markdown document."""
    src = report.get("sources", {})
    title = src.get("run") or src.get("trace") or "report"
    lines = [f"# Performance note: {_text(title)}", "",
             f"_maxinstr {report.get('generated', {}).get('maxinstr', '?')}, "
             f"{report.get('generated', {}).get('utc', '')}; report schema {report.get('schema')} v{report.get('version')}_", ""]
    lines += _baseline(report)
    if watching := f.footprint_line(report):
        lines += [f"_Watching: {_text(watching)}._", ""]
    for part in (_stages, _ranks, _bottlenecks, _findings, _optimisations, _startup, _families, _inside_stages,
                 _reproduce):
        lines += part(report)
    if notes := src.get("notes") or []:
        lines += ["## Notes", ""] + [f"- {_item(n)}" for n in notes] + [""]
    return "\n".join(lines)


def render_compare(result: CompareResult, *, width: int = 120, color: bool = False) -> str:
    """A comparison (``maxinstr-compare``) as Markdown."""
    lines = ["# maxinstr compare", ""]
    for c in result.get("comparisons", []):
        lines += [f"A = {_code(c['a'], in_table=False)}, B = {_code(c['b'], in_table=False)}", ""]
        for rows, title in ((c["stages"], "Host time per stage"), (c["gpu_stages"], "GPU time per stage")):
            if not any("a" in r for r in rows):
                continue
            lines += [f"## {title}", ""] + [f"- {_item(n)}" for n in f.compare_notes(rows)] + [""] + _table(
                ["stage", "n A/B", "median A", "median B", "delta", "noise ±", "p90 A", "p90 B", "verdict"],
                [[stage, f.runs_n(r), f.ns(r["a"]["median"]), f.ns(r["b"]["median"]),
                  f.signed_ns(r["median_delta_ns"]), f.ns(r["noise_bound_ns"]), f.ns(r["a"]["p90"]), f.ns(r["b"]["p90"]),
                  r["verdict"]] if "a" in r else
                 [stage] + ["-"] * 7 + [f"only in {r['only_in'].upper()}" if r.get("only_in") else r["verdict"]]
                 for stage, r in f.delta_rows(rows)])
        if c.get("checks"):
            lines += ["## What the diagnosis asks to check", ""] + _table(*f.check_rows(c["checks"]))
        if fams := [r for r in c["families"] if r["changed"]]:
            lines += ["## Kernel-mix changes", ""] + _table(
                ["family", "A share", "B share"], [[r["family"], f.pct(r["a_share"], 1), f.pct(r["b_share"], 1)] for r in fams])
        for ks, title in ((c["kernels_appeared"], "Kernels only in B"), (c["kernels_disappeared"], "Kernels only in A")):
            if ks:
                lines += [f"## {title}", ""] + _table(["kernel", "family", "GPU time"], [
                    [_code(f.short(kernel_label(k["name"]), 100)), k["family"], f.ns(k["gpu_ns"])] for k in ks[:20]])
        if c["settings"]:
            lines += ["## Settings that differ", ""] + _table(
                ["setting", "A", "B"], [[r["key"], _code(f.setting(r["a"])), _code(f.setting(r["b"]))] for r in c["settings"]])
        if any((c.get("perturbed") or {}).values()):
            lines += ["_A side was captured under a profiler: its timings include the profiler's overhead._", ""]
        if c.get("notes"):
            lines += ["## Notes", ""] + [f"- {_item(n)}" for n in c["notes"]] + [""]
    return "\n".join(lines)
