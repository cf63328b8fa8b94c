"""The report as rich terminal tables: readable at a glance, most important first."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, JustifyMethod, RenderResult
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from maxinstr._text import kernel_label, shown, visible
from maxinstr.render import _fmt as f
from maxinstr.render import _ranks as rk
from maxinstr.render.terminal import text_width

if TYPE_CHECKING:
    from maxinstr.analyze.compare import CompareResult, DeltaRow
    from maxinstr.analyze.report import Analysis
    from maxinstr.analyze.schema import FamilyRow, Populations, Report, Stage


def _cell(value: Any) -> Any:
    """A table cell: strings become Text, so a name is never read as rich markup (``[/]``,
    ``[link=...]``) or emoji codes, and control characters show as escapes."""
    return Text(shown(value)) if isinstance(value, str) else value


def _lines(lines: list[str], style: str = "") -> Text:
    return Text("\n".join(shown(x) for x in lines), style=style)


class Col:
    """A column of a :class:`Fitted` table. ``key``: the row key (the stage), repeated in every
    continuation table; ``wrap``: free text folded into the width left over; ``cut``: free text
    cut to one line (kernel names; --format json has them whole); ``move``: the order in which
    columns move to a continuation table when the console is too narrow (highest first;
    docs/report.md); ``drop``: left out instead when only such columns would move (a one-column
    table of p90s reads worse than a note)."""

    def __init__(self, header: str, justify: JustifyMethod = "right", key: bool = False, wrap: bool = False,
                 move: int = 0, cut: bool = False, drop: bool = False, keep: int | None = None) -> None:
        self.header, self.justify, self.key, self.move = header, justify, key, move
        self.wrap, self.cut, self.drop = wrap or cut, cut, drop
        self.keep = WRAP_MIN if keep is None else keep  # a free-text column's width before others move out


KEY_MIN = 24
"""A stage name longer than half the console (and than this) folds over lines, never cut."""
WRAP_MIN = 24
"""Free-text columns are not squeezed below this (a kernel name folded into 10 columns is
unreadable): another column moves out first."""
KERNEL_KEEP = 40
"""The Top kernels table's name column keeps this much before another column moves out: a label
cut at 24 characters no longer tells ``nvjet_sm90_tst_256x8_...`` tiles apart."""


def _cut_middle(cell: Any, width: int) -> Any:
    """A cut cell of a plain name (no template brackets) longer than ``width``: its head, an
    ellipsis and its tail, which is where such names differ (``nvjet_..._v_bz_TNT`` against
    ``..._v_bz_splitK_TNT``, MAX's ``..._f30e14de`` hashes). Other cells are cut at the end by the
    table (a template's tail is brackets)."""
    text = cell.plain if isinstance(cell, Text) else str(cell)
    if len(text) <= width or "<" in text or width < 12:
        return cell
    head = (width - 1) * 3 // 5
    tail = width - 1 - head
    return Text(text[:head] + "…" + text[-tail:], style=cell.style if isinstance(cell, Text) else "")


class Fitted:
    """A table that fits the console without cutting anything a reader needs whole.

    Every column is as wide as its widest cell, so numbers and stage names are never split or
    shortened; headers wrap at their spaces. When that is wider than the console, columns move
    to a continuation table that repeats the key column, in the order of their ``move`` rank
    (a note under the table says which); free-text columns fold into the width left over."""

    def __init__(self, title: str, cols: list[Col], rows: list[list[Any]], caption: str | list[str] | None = None
                 ) -> None:
        self.title, self.cols, self.caption = title, cols, caption
        # cells are data: a name such as "[param|cuda]" is text, not console markup, and control
        # characters show as escapes; made Text once, so each is measured as printed
        self.rows = [[_cell(c) if isinstance(c, (str, Text)) else Text(str(c)) for c in r] for r in rows]

    @staticmethod
    def _len(cell: Any) -> int:
        text = cell.plain if isinstance(cell, Text) else str(cell)
        return max((cell_len(line) for line in text.split("\n")), default=0)

    def _natural(self, i: int, width: int) -> int:
        col = self.cols[i]
        cells = [self._len(r[i]) for r in self.rows]
        # a cut column's header is cut with its cells: keep it whole; others wrap it at spaces
        head = self._len(col.header) if col.cut else max((self._len(w) for w in col.header.split()), default=1)
        nat = max(cells + [head, 1])
        # a key longer than half the console folds (never cut), leaving room for its numbers
        return min(nat, max(KEY_MIN, width // 2)) if col.key else nat

    def _plan(self, width: int) -> list[list[int]]:
        nat = [self._natural(i, width) for i in range(len(self.cols))]
        need = lambda idx: sum(min(nat[i], self.cols[i].keep) if self.cols[i].wrap else nat[i]  # noqa: E731
                               for i in idx) + 3 * len(idx) + 1
        keys = [i for i, c in enumerate(self.cols) if c.key]
        rest = [i for i, c in enumerate(self.cols) if not c.key]
        tables: list[list[int]] = []
        while rest:
            cols = list(rest)
            while need(keys + cols) > width and len(cols) > 1:
                cols.remove(max(cols, key=lambda i: (self.cols[i].move, i)))
            tables.append(sorted(keys + cols))
            rest = [i for i in rest if i not in cols]
        return tables or [keys]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        plan = self._plan(width)
        dropped = []
        if len(plan) > 1 and all(self.cols[i].drop for t in plan[1:] for i in t if not self.cols[i].key):
            dropped = [self.cols[i].header for t in plan[1:] for i in t if not self.cols[i].key]
            plan = plan[:1]
        nat = [self._natural(i, width) for i in range(len(self.cols))]
        for k, idx in enumerate(plan):
            fixed = sum(nat[i] for i in idx if not self.cols[i].wrap) + 3 * len(idx) + 1
            wraps = [i for i in idx if self.cols[i].wrap]
            left = max(width - fixed, WRAP_MIN * len(wraps))
            widths = {i: (min(nat[i], left // max(len(wraps), 1)) if self.cols[i].wrap else nat[i]) for i in idx}
            # notes go under the table at the console's width (a caption wraps at the table's)
            notes = []
            if k == 0 and len(plan) > 1:
                moved = [self.cols[i].header for t in plan[1:] for i in t if not self.cols[i].key]
                notes.append(f"{', '.join(moved)}: in the table below, to fit {width} columns (--width, COLUMNS)")
            if dropped:
                notes.append(f"{', '.join(dropped)} left out to fit {width} columns (--width, COLUMNS; --format md "
                             "and json have them)")
            if k == len(plan) - 1 and self.caption:
                notes += [self.caption] if isinstance(self.caption, str) else self.caption
            # the title on a line of its own at the console's width (as the table's title it wrapped at
            # the table's width, which a continuation table makes narrow), as text: rich parses a str as markup
            yield Text(shown(self.title if k == 0 else f"{self.title} (continued)"), style="table.title")
            t = Table(header_style="bold")
            for i in idx:  # only a key longer than half the console is narrower than its cells: it folds
                c = self.cols[i]
                t.add_column(c.header, justify=c.justify, width=widths[i], overflow="ellipsis" if c.cut else "fold",
                             no_wrap=c.cut)
            for r in self.rows:
                t.add_row(*(_cut_middle(r[i], widths[i]) if self.cols[i].cut else r[i] for i in idx))
            yield t
            if notes:
                yield _lines(notes, style="dim")


def _header(report: Report) -> Panel:
    """The sources, the GPU, the join and the warm-up: a key and its value a row."""
    src, env = report.get("sources", {}), report.get("environment", {})
    gpus = env.get("gpus") or []
    perturbed = report.get("perturbed") and report.get("headline_source") != "unprofiled_run"
    rows: list[tuple[str, str | None, str]] = [  # (key, value, style): the rows with a value
        ("run", str(src.get("run")) if src.get("run") else None, ""),
        ("trace", f"{src.get('trace')} ({src.get('trace_format')})" if src.get("trace") else None, ""),
        ("headline", f"{src.get('unprofiled_run')} (unprofiled)" if src.get("unprofiled_run") else None, ""),
        ("gpu", ", ".join(str(g.get("name", "?")) for g in gpus[:4]) + (f" | driver {env.get('driver')}" if env.get("driver")
                else "") + (f" | cuda {env.get('cuda')}" if env.get("cuda") else "") if gpus else None, ""),
        ("join", f"{src.get('join')} ({src.get('records_joined')} records joined to trace ranges)" if src.get("join")
         else None, ""),
        ("warm-up", f.warmup_line(report.get("warmup", {})), ""), ("watching", f.footprint_line(report), ""),
        ("join failed", str(src.get("join_problem")) if src.get("join_problem") else None, "bold red"),
        ("capture empty", str(src.get("capture_problem")) if src.get("capture_problem") else None, "bold red"),
        ("perturbed", str(report.get("perturbed_reason")) if perturbed else None, "yellow")]
    return Panel(_grid([(Text(k, style=st), Text(shown(v), style=st)) for k, v, st in rows if v]), title="maxinstr report",
                 title_align="left")


def _grid(rows: list[tuple[Text, Text]]) -> Table:
    """Two columns, a key and its value: a value that wraps stays under itself, not under the keys."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for key, value in rows:
        grid.add_row(key, value)
    return grid


STAGES_SHOWN = 40
"""Rows of the terminal's stage table: the stages with the most steady host time, in the
report's order (50,000 distinct stage names are data for --format json/md/html, not a table
to read in a terminal, and rich took a minute to lay them out)."""


def _shown_stages(stages: list[Stage]) -> list[Stage]:
    if len(stages) <= STAGES_SHOWN:
        return stages
    total = np.array([float((s.get("headline_host_ns") or s.get("host_ns") or {}).get("total", 0.0) or 0.0)
                      for s in stages])
    keep = np.sort(np.argsort(-total, kind="stable")[:STAGES_SHOWN])
    return [stages[i] for i in keep.tolist()]


def _stage_table(report: Report) -> Any:
    if not (all_stages := report.get("stages") or []):
        return None
    stages = _shown_stages(all_stages)
    gpu_labels = {f.gpu_stat(s)[0] for s in stages} - {""}
    trace_cols = any((s.get("gpu_busy_frac") or {}).get("n") or s.get("mix") for s in stages)
    with_samples = [s for s in stages if (s.get("samples") or {}).get("gpu_util_pct_mean") is not None
                    or (s.get("samples") or {}).get("power_w_mean") is not None]
    # util (or power) of a stage whose windows were mostly spent elsewhere (or that no window
    # covers) describes the time around it: not printed ("-", with a note), and no column at
    # all when no stage has one
    short_util = [s for s in with_samples if _limited(s, "window_limited")]
    short_power = [s for s in with_samples if _limited(s, "power_limited")]
    sampled = len(with_samples) > min(len(short_util), len(short_power))
    throttle_col = any((s.get("samples") or {}).get("throttled_share") for s in stages)
    notes = ["* host times from the unprofiled run; GPU columns from the profiled one"] * any(
        s.get("headline_from") == "unprofiled_run" for s in stages)
    if gpu_labels:
        notes.append({"event": "GPU: CUDA/HIP events on the stage's stream",
                      "proj": "GPU: the trace's span per instance, first kernel start to last kernel end"}.get(
            "".join(gpu_labels), "GPU: events on the stage's stream, or (p) the trace's first-to-last kernel span"))
    if trace_cols:
        notes.append("busy: share of that trace span in which a kernel ran; kernels: per instance")
    notes += _sample_notes(short_util, short_power, "busy" if trace_cols else "GPU time" if gpu_labels else
                           "the HTML report's timeline", throttle_col)
    if only_warm := [s["name"] for s in stages if not s["steady"] and f.excluded(s)]:
        notes.append(f"n (+k): steady instances (+ warm-up / cold-start ones); {', '.join(only_warm[:3])}"
                     f"{' ...' if len(only_warm) > 3 else ''} ran only as warm-up: see Startup below")
    if sampled and any((s.get("samples") or {}).get("power_source") == "reading" and not _limited(s, "power_limited")
                       for s in with_samples):
        notes.append("power: from the energy counter over the stage's instances; ~: NVML's power reading (a trailing "
                     "average that lags into the next stage), where the energy counter gives none")
    if with_samples and not throttle_col:
        notes.append("throttled: no hardware clock limit in any stage's samples")
    if len(stages) < len(all_stages):
        notes.append(f"{len(all_stages) - len(stages):,} more stages not shown: these are the {len(stages)} with the "
                     "most steady host time (--format json, md or html list every stage)")
    # columns move to a continuation table in this order when the console is narrow: the p90s,
    # then the sampler's, then the kernel columns (docs/report.md, "In the terminal")
    cols = [Col("stage", "left", key=True), Col("n"), Col("host median"), Col("host p90", move=9, drop=True)]
    cols += [Col("GPU median", move=1), Col("GPU p90", move=8, drop=True)] if gpu_labels else []
    cols += [Col("busy", move=2), Col("kernels", move=3), Col("top family", "left", move=4)] if trace_cols else []
    cols += [Col("util", move=6), Col("power", move=5)] if sampled else []
    cols += [Col("throttled", move=7)] if throttle_col else []
    shape = (gpu_labels, trace_cols, sampled, throttle_col)
    rows = []
    for s in stages:
        depth, label = f.stage_label(s["name"], s.get("depth", 0))
        rows.append(_stage_cells(s, label, depth, shape))
        pops = s.get("populations") or {}
        rows += [_stage_cells(f.population_row(g), f"· {g['label']}", depth + 1, shape, population=True)
                 for g in pops.get("groups") or []]
        if pops.get("groups"):
            notes.append(_population_note(s, pops))
    if raised := f.raised_note(all_stages):
        notes.append(raised)
    unexplained = [p for s in stages if (p := s.get("populations")) and p.get("groups") and not p.get("by")]
    if unexplained:  # why, once for every such stage
        notes.append(f.unexplained_populations(all(p.get("basis") == "host_ns" for p in unexplained)))
    # the notes under the table at the console's width (a caption would wrap at the table's)
    t = Fitted("Stages (steady state)", cols, rows)
    return Group(t, _lines(notes, style="dim")) if notes else t


def _limited(s: Stage, key: Literal["window_limited", "power_limited"]) -> bool:
    smp = s.get("samples") or {}
    return bool(smp.get(key, smp.get("window_limited")))


def _listed(short: list[Stage]) -> str:
    n = len(short) if len(short) <= 6 else 5
    return ", ".join(s["name"] for s in short[:n]) + (f" and {len(short) - n} more" if len(short) > n else "")


def _sample_notes(short_util: list[Stage], short_power: list[Stage], read: str, throttle_col: bool) -> list[str]:
    """Why util or power is not shown for a stage. Power from NVML's reading is judged on
    utilization's windows; from the energy counter, on the time between its readings."""
    by_energy = [s for s in short_power if (s.get("samples") or {}).get("power_source") == "energy"]
    by_reading = [s for s in short_power if s not in by_energy and (s.get("samples") or {}).get("power_w_mean") is not None]
    tail = f"; read {read}" + ("; throttle reasons are read at an instant, so throttled is shown" if throttle_col else "")
    notes = []
    if short_util and {s["name"] for s in short_util} == {s["name"] for s in by_energy + by_reading}:
        # the same stages lack both: one note
        return [f"util, power not shown for {_listed(short_util)}: NVML's utilization is an average over windows "
                "(1/6 s to 1 s; 200 ms on the H200), and power "
                + ("NVML's trailing reading" if not by_energy else "the energy counter's, read every 100 ms and "
                   "interpolated between readings")
                + "; the stage filled less than half of that time (or no window can be placed over it), so "
                "they describe the GPU around the stage" + tail]
    if short_util:
        both = {s["name"] for s in by_reading} == {s["name"] for s in short_util}
        notes.append(("util, power" if both else "util") + f" not shown for {_listed(short_util)}: NVML's utilization "
                     + ("and power reading are averages" if both else "is an average")
                     + " over windows (1/6 s to 1 s; 200 ms on the H200) that the stage filled less than half of, or "
                     "that cannot be placed over it (a value that never changed), so "
                     + ("they describe" if both else "it describes") + " the GPU around the stage"
                     + (f" (so does the power reading of {_listed(by_reading)})" if by_reading and not both else "")
                     + tail)
    if by_energy:
        notes.append(f"power not shown for {_listed(by_energy)}: the energy counter is read every 100 ms and "
                     "interpolated between readings, and the stage filled less than half of the time between the "
                     "readings around it, so the power is that of what ran around it")
    return notes


def _population_note(s: Stage, pops: Populations) -> str:
    basis = {"gpu_event_ns": "GPU time", "gpu_proj_ns": "GPU span", "host_ns": "host time"}.get(pops["basis"], pops["basis"])
    lo, hi = pops["groups"]
    text = (f"{s['name']}: two populations ({basis} median {f.ns(f.stat(lo.get(pops['basis'])))} and "
            f"{f.ns(f.stat(hi.get(pops['basis'])))})")
    text += f", told apart by {pops['by']}" if pops.get("by") else ", which nothing in the records tells apart"
    if pops.get("median_in_gap"):
        text += "; the stage's median lies between them, a time no instance took: read the rows under it"
    return text


def _stage_cells(s: Stage, label: str, depth: int, shape: tuple[set[str], bool, bool, bool],
                 population: bool = False) -> list[str]:
    gpu_labels, trace_cols, sampled, throttle_col = shape
    glabel, g = f.gpu_stat(s)
    head = s.get("headline_host_ns") or s["host_ns"]
    n = f"{(s.get('headline_host_ns') or {}).get('n', 0)}*" if s.get("headline_from") == "unprofiled_run" else str(s["steady"])
    extra = 0 if population else f.excluded(s)
    row = ["  " * depth + label, n + (f" (+{extra})" if extra else ""), f.ns(f.stat(head)), f.ns(f.stat(head, "p90"))]
    if gpu_labels:
        row += [f.ns(f.stat(g)) + (" p" if len(gpu_labels) > 1 and glabel == "proj" else ""), f.ns(f.stat(g, "p90"))]
    if trace_cols:
        kpi = f.stat(s.get("kernels_per_instance"))
        fam: FamilyRow = ((s.get("mix") or {}).get("families") or [{}])[0]
        row += [f.pct(f.stat(s.get("gpu_busy_frac"))), f"{kpi:.0f}" if kpi is not None else "-",
                f"{fam.get('family')} {f.pct(fam.get('share'))}" if fam else "-"]
    smp = s.get("samples") or {}
    if sampled:
        util, power = smp.get("gpu_util_pct_mean"), smp.get("power_w_mean")
        row += ["-" if util is None or smp.get("window_limited") else f"{util:.0f}%",
                "-" if power is None or smp.get("power_limited", smp.get("window_limited")) else
                ("~" if smp.get("power_source") == "reading" else "") + f"{power:.0f} W"]
    if throttle_col:
        row.append(f.pct(smp.get("throttled_share")))
    return row


_BASIS = {"gpu_busy_ns": "GPU busy", "gpu_event_ns": "GPU", "gpu_proj_ns": "GPU span", "host_ns": "host"}


def _bottlenecks(report: Report) -> Fitted | None:
    if not (rows := report.get("bottlenecks") or []):
        return None
    cols = [Col("#"), Col("stage", "left", key=True), Col("share"), Col("self time, total"),
            Col("top kernel", "left", cut=True, move=2), Col("findings", "left", move=1)]
    body = [[str(r["rank"]), f.stage_name(r["stage"]) + (" (self)" if r.get("has_children") else ""), f.pct(r["share"]),
             f.ns(r["self_ns"]) + f" ({_BASIS.get(r['basis'], r['basis'])})",
             f"{f.pct(r.get('top_kernel_share'))} {kernel_label(r.get('top_kernel') or '')}" if r.get("top_kernel") else "-",
             ", ".join(r["findings"]) or "-"] for r in rows[:10]]
    return Fitted("Where the time goes (ranked)", cols, body)


def _families(report: Report) -> Fitted | None:
    fams, _, scope, caption = f.gpu_tables(report)
    if not fams:
        return None
    body = [[r["family"], f.pct(r["share"], 1), f.ns(r["gpu_ns"]), str(r["count"])] for r in fams]
    return Fitted(f"GPU time by kernel family ({scope})",
                  [Col("family", "left", key=True), Col("share"), Col("time"), Col("ops")], body, caption=caption)


def _kernels(report: Report, n: int = 10) -> Fitted | None:
    _, ks, scope, _ = f.gpu_tables(report)
    if not ks:
        return None
    body = [[kernel_label(k["name"]), k["family"], f.pct(k["share"], 1), str(k["count"]), f.ns(k["median_ns"])]
            for k in ks[:n]]
    # one line a kernel, cut to the width left (--format json has the whole name)
    return Fitted(f"Top kernels ({scope})", [Col("kernel", "left", cut=True, keep=KERNEL_KEEP), Col("family", "left", move=1), Col("share"),
                                  Col("count", move=2, drop=True), Col("median", move=3, drop=True)], body)


def _inside_stages(report: Report) -> Fitted | Text | None:
    """Per leaf stage, the ranges of other domains its ops ran under (MAX's op ranges, a
    framework's): where inside the stage the GPU time goes."""
    rows, tied = f.inside_stages(report)
    if not rows:
        return _lines(["ops tied to their stage: " + "; ".join(tied)]) if tied else None
    cols = [Col("stage", "left", key=True), Col("range", "left", wrap=True), Col("share"), Col("ops / inst", move=2),
            Col("GPU / inst", move=1)]
    body = [[f.stage_name(r["stage"]) if k == 0 or rows[k - 1]["stage"] != r["stage"] else "", r["range"],
             f.pct(r["share"]), f"{r['per_instance']:.4g}", f.ns(r["gpu_per_instance_ns"])] for k, r in enumerate(rows)]
    return Fitted(f.INSIDE_TITLE, cols, body, caption="ops tied to their stage: " + "; ".join(tied) if tied else None)


def _diagnosis(report: Report) -> Panel | None:
    if not (fs := report.get("diagnosis") or []):
        return None
    parts: list[Any] = []
    styles = {"Facts": "bold green", "Hypotheses": "bold yellow"}
    for title, group in f.finding_groups(fs):
        parts.append(Text(title, style=styles.get(title, "bold")))
        for x in group:
            head = Text()
            head.append(f"[{x['id']}] ", style="bold")
            head.append(f"({f.at_stake(x.get('score'))}) ", style="dim")
            head.append(shown(x["title"]))
            parts.append(Padding(head, (0, 0, 0, 2)))  # wrapped lines keep their indentation
            ev = f.evidence_text(x.get("evidence") or {}, x["id"])
            for line, style in ((f"evidence: {shown(ev)}" if ev else "", "dim"),
                                (f"next: {shown(x.get('next_step'))}" if x.get("next_step") else "", ""),
                                (f"$ {shown(x.get('command'))}" if x.get("command") else "", "cyan")):
                if line:
                    parts.append(Padding(Text(line, style=style), (0, 0, 0, 6)))
    parts.append(Padding(Text("facts, then hypotheses, each ordered by the share of the time at stake, then what has "
                              "none at stake; --format json has every finding's full evidence", style="dim"), (0, 0, 0, 2)))
    return Panel(Group(*parts), title="Diagnosis", title_align="left")


def _startup(report: Report) -> Fitted | None:
    if not report.get("startup"):
        return None
    rows, caption = f.startup_shown(report)
    body = [[f.stage_name(r["stage"]), str(r["occurrence"]), r["reason"].replace("_", " "), f.ns(r["host_ns"]),
             f.ns(f.startup_gpu(r)[1]) + (" p" if f.startup_gpu(r)[0] == "proj" else ""),
             str(r.get("nested") or "-"), f"{r['robust_z']:.0f}" if r.get("robust_z") is not None else "-"]
            for r in rows]
    cols = [Col("stage", "left", key=True), Col("#"), Col("why", "left"), Col("host"), Col("GPU", move=2),
            Col("nested", move=3), Col("robust z", move=1)]
    if any(f.startup_gpu(r)[0] == "proj" for r in rows):
        caption += "; GPU as in the stage table (p: the trace's first-to-last op span)"
    return Fitted("Startup (kept out of the numbers above)", cols, body, caption=caption)


def _notes(report: Report) -> Group | None:
    notes = (report.get("sources") or {}).get("notes") or []
    grid = _grid([(Text("  -", style="dim"), Text(visible(n), style="dim")) for n in notes])
    return Group(Text("notes:", style="dim"), grid) if notes else None


def _ranks(report: Report) -> Group | None:
    if (sec := rk.section(report)) is None:
        return None
    (rank_head, rank_rows), (stage_head, stage_rows) = rk.rank_rows(sec), rk.stage_rows(sec)
    lines = rk.straggler_lines(sec)
    return Group(
        Fitted(f"Ranks ({rk.summary_line(sec)})", [Col(h, "left" if h in ("host", "pids", "top family") else "right",
                                                       key=i == 0) for i, h in enumerate(rank_head)], rank_rows),
        Fitted("Per-rank stage statistics (steady state; steps = instances aligned across ranks)",
               [Col(h, "left" if h == "stage" else "right", key=h == "stage") for h in stage_head], stage_rows,
               caption="slowest / last in: share of steps where the rank took longest / started last; vs "
                       "others: median excess over the other ranks; wait: time spent waiting for the last rank "
                       "in a [sync] stage (one the ranks leave together)"),
        *([_lines(["stragglers:"] + [f"  - {x}" for x in lines], style="yellow")] if lines else []))


def renderables(report: Report) -> list[Any]:
    """The report's parts as rich renderables, in reading order."""
    parts = [_header(report), _stage_table(report), _ranks(report), _bottlenecks(report), _diagnosis(report),
             _startup(report), _families(report), _kernels(report), _inside_stages(report), _notes(report)]
    return [p for p in parts if p is not None]


def _print(parts: list[Any], width: int, color: bool) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=color, color_system="auto" if color else None).print(Group(*parts))
    return buf.getvalue()


def render(report: Report, analysis: Analysis | None = None, *, width: int = 120, color: bool = False) -> str:
    """The report as terminal text (ANSI colours when ``color``)."""
    return _print(renderables(report), width, color)


def print_report(report: Report, console: Console | None = None) -> None:
    """Print the report to a console (stdout by default, as wide as :func:`text_width` says)."""
    console = console or Console(width=text_width(Console().is_terminal))
    console.print(Group(*renderables(report)))


_VERDICT_STYLE = {"faster": "green", "slower": "red", "within noise": "dim", "cannot tell": "yellow"}


def _delta_table(title: str, rows: list[DeltaRow]) -> Fitted:
    cols = [Col("stage", "left", key=True), Col("n A/B", move=2), Col("median A"), Col("median B"), Col("delta"),
            Col("noise ±", move=1), Col("p90 delta", move=3, drop=True), Col("verdict", "left", move=-1)]
    body: list[list[Any]] = []
    for stage, r in f.delta_rows(rows):
        if "a" not in r:
            verdict = f"only in {r['only_in'].upper()}" if r.get("only_in") else r["verdict"]
            body.append([stage, "-", "-", "-", "-", "-", "-", verdict])
            continue
        rel = r.get("median_delta_rel")
        body.append([
            stage, f.runs_n(r), f.ns(r["a"]["median"]), f.ns(r["b"]["median"]),
            f.signed_ns(r["median_delta_ns"]) + (f" ({f.signed_rel(rel)})" if rel is not None else ""),
            f.ns(r["noise_bound_ns"]), f.signed_ns(r["p90_delta_ns"]),
            Text(r["verdict"], style=_VERDICT_STYLE.get(r["verdict"], "")),
        ])
    return Fitted(title, cols, body, caption=f.compare_notes(rows))


def compare_renderables(result: CompareResult) -> list[Any]:
    parts: list[Any] = []
    for c in result.get("comparisons", []):
        parts.append(Panel(_lines([f"A = {c['a']}", f"B = {c['b']}"]), title="maxinstr compare", title_align="left"))
        if c["stages"]:
            parts.append(_delta_table("Host time per stage (steady state)", c["stages"]))
        if c["gpu_stages"]:
            parts.append(_delta_table("GPU time per stage", c["gpu_stages"]))
        if c.get("checks"):
            header, body = f.check_rows(c["checks"])
            parts.append(Fitted("What the diagnosis asks to check (per stage, A -> B)",
                                [Col(h, "left" if h in ("stage", "findings", "share of GPU time") else "right",
                                     key=h == "stage", wrap=h in ("findings", "share of GPU time"),
                                     move={"findings": 2, "share of GPU time": 1}.get(h, 0)) for h in header], body))
        if fams := [r for r in c["families"] if r["changed"]]:
            parts.append(Fitted("Kernel-mix changes (share of GPU time)",
                                [Col("family", "left", key=True), Col("A"), Col("B"), Col("change")],
                                [[r["family"], f.pct(r["a_share"], 1), f.pct(r["b_share"], 1),
                                  f.signed_points(r["delta_share"])] for r in fams]))
        for ks, label in ((c["kernels_appeared"], "Kernels only in B"), (c["kernels_disappeared"], "Kernels only in A")):
            if ks:
                parts.append(Fitted(label, [Col("kernel", "left", cut=True), Col("family", "left", move=1), Col("GPU time")],
                                    [[kernel_label(k["name"]), k["family"], f.ns(k["gpu_ns"])] for k in ks[:8]],
                                    caption=f"... and {len(ks) - 8} more (--format json lists them)" if len(ks) > 8 else None))
        if c["kernels_changed_family"]:
            parts.append(_lines(["Kernels classified differently: " + "; ".join(
                f"{f.short(kernel_label(k['name']), 50)}: {k['a_family']} -> {k['b_family']}" for k in c["kernels_changed_family"][:8])]))
        if c["settings"]:
            parts.append(Fitted("Settings that differ", [Col("setting", "left", key=True), Col("A", "left", wrap=True),
                                                          Col("B", "left", wrap=True)],
                                [[r["key"], f.setting(r["a"]), f.setting(r["b"])] for r in c["settings"][:40]]))
        else:
            parts.append(Text("Settings: no recorded difference.", style="dim"))
        if any(c["perturbed"].values()):
            parts.append(Text("note: a side was captured under a profiler: its timings include the profiler's overhead",
                              style="yellow"))
        if c.get("notes"):
            parts.append(_lines(c["notes"], style="dim"))
    return parts


def render_compare(result: CompareResult, *, width: int = 120, color: bool = False) -> str:
    """A comparison (``maxinstr-compare``) as terminal text."""
    return _print(compare_renderables(result), width, color)
