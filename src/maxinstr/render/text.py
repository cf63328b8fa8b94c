"""The report as rich terminal tables: readable at a glance, most important first."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from maxinstr.render import _fmt as f


class _Fit:
    """A table whose right-aligned (numeric) columns keep their longest cell whole, so a
    100-column terminal wraps names rather than splitting '813.7 us' into '813.7' over 'us'.
    When that does not fit, the p90 columns are left out first (the caption says so; --format
    md/json keep them); when even that does not fit, rich's own wrapping."""

    def __init__(self, table: Table) -> None:
        self.table = table

    @staticmethod
    def _longest(col) -> int:
        from rich.cells import cell_len

        cells = [c.plain if isinstance(c, Text) else str(c) for c in col._cells]
        head = col.header.plain if isinstance(col.header, Text) else str(col.header)
        return max([cell_len(c) for c in cells] + [cell_len(head), 1])

    def _plan(self, cols: list, max_width: int) -> dict[int, int] | None:
        """Widths for the free text columns when the numbers fit whole, else None."""
        longest = [self._longest(c) for c in cols]
        fixed = [i for i, c in enumerate(cols) if c.justify == "right" or (c.no_wrap and c.overflow != "ellipsis")]
        free = [i for i in range(len(cols)) if i not in fixed]
        budget = max_width - 3 * len(cols) - 1 - sum(longest[i] for i in fixed)
        if budget < 6 * len(free):
            return None
        plan = {}
        for k, i in enumerate(sorted(free, key=lambda i: longest[i])):  # water-fill, shortest first
            plan[i] = min(longest[i], budget // (len(free) - k))
            budget -= plan[i]
        return plan

    def __rich_console__(self, console, options):
        t = self.table
        plan = self._plan(t.columns, options.max_width)
        if plan is None and any("p90" in str(c.header) for c in t.columns):
            kept = [c for c in t.columns if "p90" not in str(c.header)]
            plan = self._plan(kept, options.max_width)
            if plan is not None:
                t.columns[:] = kept
                note = f"p90 columns left out to fit {options.max_width} columns (--format md has them)"
                t.caption = f"{t.caption}\n{note}" if t.caption else note
                t.caption_justify = "left"
        if plan is not None:
            for i, col in enumerate(t.columns):
                if i in plan:
                    col.width = plan[i]
                elif col.justify == "right":
                    col.min_width = max(self._longest(col), col.min_width or 0)
        yield t

def _numbers_whole(table: Table) -> "_Fit":
    return _Fit(table)


def _header(report: dict) -> Panel:
    src = report.get("sources", {})
    lines = []
    if src.get("run"):
        lines.append(f"run      {src['run']}")
    if src.get("trace"):
        lines.append(f"trace    {src['trace']} ({src.get('trace_format')})")
    if src.get("unprofiled_run"):
        lines.append(f"headline {src['unprofiled_run']} (unprofiled)")
    env = report.get("environment", {})
    gpus = env.get("gpus") or []
    if gpus:
        lines.append("gpu      " + ", ".join(str(g.get("name", "?")) for g in gpus[:4])
                     + (f" | driver {env['driver']}" if env.get("driver") else "")
                     + (f" | cuda {env['cuda']}" if env.get("cuda") else ""))
    if src.get("join"):
        lines.append(f"join     {src['join']} ({src.get('records_joined')} records joined to trace ranges)")
    w = report.get("warmup", {})
    lines.append(f"warm-up  {f.warmup_line(w)}")
    text = Text("\n".join(lines))
    if report.get("perturbed") and report.get("headline_source") != "unprofiled_run":
        text.append(f"\nperturbed: {report.get('perturbed_reason')}", style="yellow")
    return Panel(text, title="maxinstr report", title_align="left")


def _stage_table(report: dict) -> Any:
    stages = report.get("stages") or []
    if not stages:
        return None
    unprof = any(s.get("headline_from") == "unprofiled_run" for s in stages)
    gpu_labels = {f.gpu_stat(s)[0] for s in stages} - {""}
    gpu_cols = bool(gpu_labels)
    trace_cols = any((s.get("gpu_busy_frac") or {}).get("n") or s.get("mix") for s in stages)
    with_samples = [s for s in stages if (s.get("samples") or {}).get("gpu_util_pct_mean") is not None
                    or (s.get("samples") or {}).get("power_w_mean") is not None]
    short_window = [s for s in with_samples if s["samples"].get("window_limited")]
    # util/power of a stage whose NVML windows were mostly spent elsewhere (or that no window
    # covers) describe the time around it: not printed ("-", with a note), and no column at
    # all when no stage has them
    sampled = len(with_samples) > len(short_window)
    throttle_col = any((s.get("samples") or {}).get("throttled_share") for s in stages)
    notes = []
    if unprof:
        notes.append("* host times from the unprofiled run; GPU columns from the profiled one")
    if gpu_labels == {"event"}:
        notes.append("GPU: CUDA/HIP events on the stage's stream")
    elif gpu_labels == {"proj"}:
        notes.append("GPU: the trace's span per instance, first kernel start to last kernel end")
    elif gpu_labels:
        notes.append("GPU: events on the stage's stream, or (p) the trace's first-to-last kernel span")
    if trace_cols:
        notes.append("busy: share of that trace span in which a kernel ran; kernels: per instance")
    if short_window:
        shortest = min(short_window, key=lambda s: f.stat(s["host_ns"]) or 0)
        names = ", ".join(s["name"] for s in short_window[:3]) + (" ..." if len(short_window) > 3 else "")
        notes.append(("util, power not shown for " if sampled else "util, power not shown: ")
                     + f"{names}: NVML's utilization windows (200 ms on the H200, 1/6 s to 1 s) were mostly "
                     f"spent outside {'it' if len(short_window) == 1 else 'them'} (median instance "
                     f"{f.ns(f.stat(shortest['host_ns']))}), or none covers {'it' if len(short_window) == 1 else 'them'}, "
                     "so the samples describe the GPU around the stage, not the stage; read "
                     + ("busy" if trace_cols else "GPU time" if gpu_cols else "the HTML report's timeline"))
    only_warm = [s["name"] for s in stages if not s["steady"] and f.excluded(s)]
    if only_warm:
        notes.append(f"n (+k): steady instances (+ warm-up / cold-start ones); {', '.join(only_warm[:3])}"
                     f"{' ...' if len(only_warm) > 3 else ''} ran only as warm-up: see Startup below")
    if with_samples and not throttle_col:
        notes.append("throttled: no hardware clock limit in any stage's samples")
    t = Table(title="Stages (steady state)", title_justify="left", header_style="bold")
    t.add_column("stage", no_wrap=True)
    t.add_column("n", justify="right")
    t.add_column("host median", justify="right")
    t.add_column("host p90", justify="right")
    if gpu_cols:
        t.add_column("GPU median", justify="right")
        t.add_column("GPU p90", justify="right")
    if trace_cols:
        t.add_column("busy", justify="right")
        t.add_column("kernels", justify="right")
        t.add_column("top family")
    if sampled:
        t.add_column("util", justify="right")
        t.add_column("power", justify="right")
    if throttle_col:
        t.add_column("throttled", justify="right")
    for s in stages:
        label, g = f.gpu_stat(s)
        head = s.get("headline_host_ns") or s["host_ns"]
        n = str(s["steady"])
        if s.get("headline_from") == "unprofiled_run":
            n = f"{(s.get('headline_host_ns') or {}).get('n', 0)}*"
        extra = f.excluded(s)
        if extra:
            n += f" (+{extra})"
        mix = s.get("mix") or {}
        fam = mix.get("families", [{}])[0] if mix.get("families") else {}
        cells = []
        smp = s.get("samples") or {}
        if sampled:
            util = smp.get("gpu_util_pct_mean")
            power = smp.get("power_w_mean")
            util_s = f"{util:.0f}%" if util is not None else "-"
            power_s = f"{power:.0f} W" if power is not None else "-"
            if smp.get("window_limited"):
                util_s = power_s = "-"
            cells = [util_s, power_s]
        if throttle_col:
            cells.append(f.pct(smp.get("throttled_share")))
        row = ["  " * s.get("depth", 0) + s["name"], n, f.ns(f.stat(head)), f.ns(f.stat(head, "p90"))]
        if gpu_cols:
            mark = " p" if len(gpu_labels) > 1 and label == "proj" else ""
            row += [f.ns(f.stat(g)) + mark, f.ns(f.stat(g, "p90"))]
        if trace_cols:
            kpi = f.stat(s.get("kernels_per_instance"))
            row += [f.pct(f.stat(s.get("gpu_busy_frac"))), f"{kpi:.0f}" if kpi is not None else "-",
                    f"{fam.get('family')} {f.pct(fam.get('share'))}" if fam else "-"]
        t.add_row(*row, *cells)
    # the notes under the table at the console's width (a caption would wrap at the table's)
    return Group(_numbers_whole(t), Text("\n".join(notes), style="dim")) if notes else _numbers_whole(t)


_BASIS = {"gpu_busy_ns": "GPU busy", "gpu_event_ns": "GPU", "gpu_proj_ns": "GPU span", "host_ns": "host"}


def _bottlenecks(report: dict) -> Table | None:
    rows = report.get("bottlenecks") or []
    if not rows:
        return None
    t = Table(title="Where the time goes (ranked)", title_justify="left", header_style="bold")
    for col in ("#", "stage", "share", "self time, total", "top kernel", "findings"):
        t.add_column(col, justify="right" if col in ("#", "share", "self time, total") else "left",
                     no_wrap=col == "top kernel", overflow="ellipsis" if col == "top kernel" else "fold")
    for r in rows[:10]:
        t.add_row(str(r["rank"]), r["stage"] + (" (self)" if r.get("has_children") else ""), f.pct(r["share"]),
                  f.ns(r["self_ns"]) + f" ({_BASIS.get(r['basis'], r['basis'])})",
                  f"{f.pct(r.get('top_kernel_share'))} {f.short(r.get('top_kernel'), 48)}" if r.get("top_kernel") else "-",
                  ", ".join(r["findings"]) or "-")
    return _numbers_whole(t)


def _families(report: dict) -> Table | None:
    gpu = report.get("gpu") or {}
    fams = gpu.get("families") or []
    if not fams:
        return None
    t = Table(title="GPU time by kernel family", caption=f"{gpu.get('ops')} ops, {f.ns(gpu.get('gpu_ns'))} of GPU time",
              title_justify="left", caption_justify="left", header_style="bold")
    t.add_column("family")
    t.add_column("share", justify="right")
    t.add_column("time", justify="right")
    t.add_column("ops", justify="right")
    for r in fams:
        t.add_row(r["family"], f.pct(r["share"], 1), f.ns(r["gpu_ns"]), str(r["count"]))
    return _numbers_whole(t)


def _kernels(report: dict, n: int = 10) -> Table | None:
    ks = (report.get("gpu") or {}).get("kernels") or []
    if not ks:
        return None
    t = Table(title=f"Top kernels", title_justify="left", header_style="bold")
    t.add_column("kernel", overflow="fold", max_width=80)
    t.add_column("family")
    t.add_column("share", justify="right")
    t.add_column("count", justify="right")
    t.add_column("median", justify="right")
    for k in ks[:n]:
        t.add_row(f.short(k["name"], 80), k["family"], f.pct(k["share"], 1), str(k["count"]), f.ns(k["median_ns"]))
    return _numbers_whole(t)


def _diagnosis(report: dict) -> Panel | None:
    from rich.padding import Padding

    fs = report.get("diagnosis") or []
    if not fs:
        return None
    parts: list[Any] = []
    for verdict, style in (("fact", "bold green"), ("hypothesis", "bold yellow")):
        group = [x for x in fs if x["verdict"] == verdict]
        if not group:
            continue
        parts.append(Text("Facts" if verdict == "fact" else "Hypotheses", style=style))
        for x in group:
            head = Text()
            head.append(f"[{x['id']}] ", style="bold")
            head.append(x["title"])
            parts.append(Padding(head, (0, 0, 0, 2)))  # wrapped lines keep their indentation
            ev = f.evidence_text(x.get("evidence") or {})
            if ev:
                parts.append(Padding(Text(f"evidence: {ev}", style="dim"), (0, 0, 0, 6)))
            if x.get("next_step"):
                parts.append(Padding(Text(f"next: {x['next_step']}"), (0, 0, 0, 6)))
            if x.get("command"):
                parts.append(Padding(Text(f"$ {x['command']}", style="cyan"), (0, 0, 0, 6)))
    return Panel(Group(*parts), title="Diagnosis", title_align="left")


def _startup(report: dict, n: int = 8) -> Table | None:
    rows = report.get("startup") or []
    if not rows:
        return None
    total = f"{len(rows)}{'+' if len(rows) >= 50 else ''} instances"
    t = Table(title="Startup (kept out of the numbers above)", title_justify="left", header_style="bold",
              caption=f"{total}; the {n} longest shown" if len(rows) > n else None, caption_justify="left")
    for col in ("stage", "#", "why", "host", "GPU", "robust z"):
        t.add_column(col, justify="left" if col in ("stage", "why") else "right")
    for r in sorted(rows, key=lambda r: -r["host_ns"])[:n]:
        t.add_row(r["stage"], str(r["occurrence"]), r["reason"], f.ns(r["host_ns"]),
                  f.ns(r.get("gpu_event_ns") if r.get("gpu_event_ns") is not None else r.get("gpu_proj_ns")),
                  f"{r['robust_z']:.0f}" if r.get("robust_z") is not None else "-")
    return _numbers_whole(t)


def _notes(report: dict) -> Text | None:
    notes = (report.get("sources") or {}).get("notes") or []
    if not notes:
        return None
    return Text("notes:\n" + "\n".join(f"  - {n}" for n in notes), style="dim")


def _ranks(report: dict) -> Group | None:
    """Per-rank stage statistics and the stragglers (multi-rank runs only)."""
    from maxinstr.render import _ranks as rk

    sec = rk.section(report)
    if sec is None:
        return None
    out: list[Any] = []
    header, rows = rk.rank_rows(sec)
    t = Table(title=f"Ranks ({rk.summary_line(sec)})", title_justify="left", header_style="bold")
    for h in header:
        t.add_column(h, justify="left" if h in ("host", "pids", "top family") else "right")
    for r in rows:
        t.add_row(*(Text(c) for c in r))
    out.append(t)
    header, rows = rk.stage_rows(sec)
    t = Table(title="Per-rank stage statistics (steady state; steps = instances aligned across ranks)",
              title_justify="left", header_style="bold",
              caption=Text("slowest / last in: share of steps where the rank took longest / started last; vs others: "
                           "median excess over the other ranks; wait: time spent waiting for the last rank in a [sync] "
                           "stage (one the ranks leave together)"),
              caption_justify="left")
    for h in header:
        t.add_column(h, justify="left" if h == "stage" else "right", no_wrap=h == "stage")
    for r in rows:
        t.add_row(*(Text(c) for c in r))
    out.append(t)
    lines = rk.straggler_lines(sec)
    if lines:
        out.append(Text("stragglers:\n" + "\n".join(f"  - {x}" for x in lines), style="yellow"))
    return Group(*out)


def renderables(report: dict) -> list[Any]:
    """The report's parts as rich renderables, in reading order."""
    parts = [_header(report), _stage_table(report), _ranks(report), _bottlenecks(report), _diagnosis(report),
             _startup(report), _families(report), _kernels(report), _notes(report)]
    return [p for p in parts if p is not None]


def render(report: dict, width: int = 120, color: bool = False) -> str:
    """The report as terminal text (ANSI colours when ``color``)."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, color_system="auto" if color else None)
    console.print(Group(*renderables(report)))
    return buf.getvalue()


def print_report(report: dict, console: Console | None = None) -> None:
    """Print the report to a console (stdout by default; 120 columns when not a terminal)."""
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=120)
    console.print(Group(*renderables(report)))


# ----------------------------------------------------------------------------- compare
_VERDICT_STYLE = {"faster": "green", "slower": "red", "within noise": "dim"}


def _signed_ns(v: float | None) -> str:
    if v is None:
        return "-"
    return ("+" if v > 0 else "") + f.ns(v)


def _delta_table(title: str, rows: list[dict]) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold",
              caption="noise ±: the difference of medians the runs' own spread allows; p90 A/B: in --format json/md",
              caption_justify="left")
    for col in ("stage", "n A/B", "median A", "median B", "delta", "noise ±", "p90 delta", "verdict"):
        t.add_column(col, justify="left" if col in ("stage", "verdict") else "right")
    for r in rows:
        if "a" not in r:
            verdict = f"only in {r['only_in'].upper()}" if r.get("only_in") else r["verdict"]
            t.add_row(r["stage"], "-", "-", "-", "-", "-", "-", verdict)
            continue
        rel = r.get("median_delta_rel")
        t.add_row(
            r["stage"], f"{r['a']['n']}/{r['b']['n']}", f.ns(r["a"]["median"]), f.ns(r["b"]["median"]),
            _signed_ns(r["median_delta_ns"]) + (f" ({rel:+.1%})" if rel is not None else ""),
            f.ns(r["noise_bound_ns"]), _signed_ns(r["p90_delta_ns"]),
            Text(r["verdict"], style=_VERDICT_STYLE.get(r["verdict"], "")),
        )
    return _numbers_whole(t)


def compare_renderables(result: dict) -> list[Any]:
    parts: list[Any] = []
    for c in result.get("comparisons", []):
        parts.append(Panel(Text(f"A = {c['a']}\nB = {c['b']}"), title="maxinstr compare", title_align="left"))
        if c["stages"]:
            parts.append(_delta_table("Host time per stage (steady state)", c["stages"]))
        if c["gpu_stages"]:
            parts.append(_delta_table("GPU time per stage", c["gpu_stages"]))
        fams = [r for r in c["families"] if r["changed"]]
        if fams:
            t = Table(title="Kernel-mix changes (share of GPU time)", title_justify="left", header_style="bold")
            for col in ("family", "A", "B", "change"):
                t.add_column(col, justify="left" if col == "family" else "right")
            for r in fams:
                t.add_row(r["family"], f.pct(r["a_share"], 1), f.pct(r["b_share"], 1), f"{100 * r['delta_share']:+.1f} pt")
            parts.append(t)
        for key, label in (("kernels_appeared", "Kernels only in B"), ("kernels_disappeared", "Kernels only in A")):
            if c[key]:
                more = len(c[key]) - 8
                t = Table(title=label, title_justify="left", header_style="bold",
                          caption=f"... and {more} more (--format json lists them)" if more > 0 else None,
                          caption_justify="left")
                t.add_column("kernel", overflow="fold", max_width=70)
                t.add_column("family")
                t.add_column("GPU time", justify="right")
                for k in c[key][:8]:
                    t.add_row(f.short(k["name"], 70), k["family"], f.ns(k["gpu_ns"]))
                parts.append(t)
        if c["kernels_changed_family"]:
            parts.append(Text("Kernels classified differently: " + "; ".join(
                f"{f.short(k['name'], 50)}: {k['a_family']} -> {k['b_family']}" for k in c["kernels_changed_family"][:8])))
        if c["settings"]:
            t = Table(title="Settings that differ", title_justify="left", header_style="bold")
            t.add_column("setting")
            t.add_column("A", overflow="fold", max_width=45)
            t.add_column("B", overflow="fold", max_width=45)
            for r in c["settings"][:40]:
                t.add_row(r["key"], f.setting(r["a"]), f.setting(r["b"]))
            parts.append(t)
        else:
            parts.append(Text("Settings: no recorded difference.", style="dim"))
        if any(c["perturbed"].values()):
            parts.append(Text("note: a side was captured under a profiler: its timings include the profiler's overhead",
                              style="yellow"))
    return parts


def render_compare(result: dict, width: int = 120, color: bool = False) -> str:
    """A comparison (``maxinstr-compare``) as terminal text."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, color_system="auto" if color else None)
    console.print(Group(*compare_renderables(result)))
    return buf.getvalue()
