"""The report as one self-contained HTML file: inline CSS and SVG drawn here from the report (the
timeline from the analysis's columns), no script, no network; hover texts are SVG ``<title>``
elements. Why no plotting library: docs/report.md ("Views")."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from maxinstr._text import kernel_label, shown
from maxinstr.render import _fmt as f
from maxinstr.render import _ranks as rk

if TYPE_CHECKING:
    from maxinstr.analyze.report import Analysis
    from maxinstr.analyze.schema import Finding, GpuKernel, Mix, MixKernel, Report, Stage, Statistic


W = 1000
"""Width of every SVG's coordinate system (they scale to the page)."""
STEPS_MIN = 8
"""Per-step charts only for stages with at least this many steps (the re-prefill rule's minimum)."""
SERIES_POINTS = 1200
"""At most this many points per plotted sampler series (bin means)."""

FAMILY_COLORS = {
    "gemv": "#1f77b4", "gemm": "#4e79a7", "grouped_matmul": "#2c5d8a", "convolution": "#6b8fb8",
    "attention": "#e15759", "ssm": "#b0413e", "normalization": "#59a14f", "rope": "#8cd17d",
    "softmax": "#f28e2b", "elementwise": "#edc948", "reduction": "#b07aa1", "routing": "#ff9da7",
    "quantization": "#9c755f", "sampling": "#d37295", "kv_cache": "#76b7b2", "memcpy": "#86bcb6",
    "memset": "#bab0ac", "collective": "#499894", "other": "#c9c9c9",
}
STAGE_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
                "#9c755f", "#bab0ac")
C_HOST, C_SPAN, C_BUSY = "#c7ccd6", "#9ecae1", "#2166ac"

CSS = """
:root { --fg:#1d2430; --muted:#5b6577; --line:#e3e7ee; --bg:#f6f8fb; --card:#fff; --fact:#2166ac; --hyp:#b35806; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif; color:var(--fg); background:var(--bg); }
main { max-width:1180px; margin:0 auto; padding:20px 24px 48px; }
header h1 { font-size:22px; margin:0 0 4px; }
header .sub { color:var(--muted); font-size:13px; word-break:break-all; }
section { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:14px 18px 16px; margin:16px 0; }
h2 { font-size:16px; margin:0 0 8px; }
h3 { font-size:14px; margin:12px 0 6px; }
p.note, .note { color:var(--muted); font-size:12.5px; margin:4px 0 8px; }
.banner { background:#fff4e0; border:1px solid #f0c36d; border-radius:6px; padding:8px 12px; margin:12px 0 0; font-size:13px; }
.cards { display:flex; flex-wrap:wrap; gap:10px; margin-top:12px; }
.card { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:8px 12px; min-width:150px; flex:1; }
.card .v { font-size:20px; font-weight:600; }
.card .k { color:var(--muted); font-size:12px; }
svg { width:100%; height:auto; display:block; }
svg text { font-family:inherit; }
table { border-collapse:collapse; width:100%; font-size:13px; }
th, td { text-align:left; padding:4px 8px; border-bottom:1px solid var(--line); vertical-align:top; }
th { color:var(--muted); font-weight:600; font-size:12px; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
code, pre { font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace; font-size:12px; }
pre { background:#f1f3f7; border-radius:6px; padding:8px 10px; overflow-x:auto; margin:6px 0; white-space:pre-wrap; word-break:break-all; }
.legend { display:flex; flex-wrap:wrap; gap:4px 14px; font-size:12px; color:var(--muted); margin:4px 0; }
.sw { display:inline-block; width:10px; height:10px; border-radius:2px; margin-right:5px; vertical-align:-1px; }
.findings { display:grid; grid-template-columns:repeat(auto-fill, minmax(460px, 1fr)); gap:10px; }
.finding { border-left:4px solid var(--fact); background:#f7fafd; border-radius:4px; padding:8px 12px; }
.finding.hypothesis { border-left-color:var(--hyp); background:#fffaf3; }
.finding .t { font-weight:600; }
.finding .ev { color:var(--muted); font-size:12.5px; margin:4px 0; }
.tag { display:inline-block; font-size:11px; font-weight:600; border-radius:3px; padding:0 5px; margin-right:6px; color:#fff; background:var(--fact); }
.tag.hypothesis { background:var(--hyp); }
td.fam { white-space:nowrap; }
.kname { font-family:ui-monospace,Menlo,Consolas,monospace; font-size:12px; word-break:break-all; }
details { border-top:1px solid var(--line); padding:6px 0; }
details > summary { cursor:pointer; font-weight:600; }
details > summary .note { font-weight:400; }
.bar { display:inline-block; height:8px; background:#4e79a7; border-radius:2px; vertical-align:middle; }
footer { color:var(--muted); font-size:12px; margin-top:18px; }
"""


def e(text: Any) -> str:
    """HTML-escaped text, with control characters and line separators shown as escapes (a name
    is data: a raw newline or ESC in a title or a cell is not what the name reads as)."""
    return html.escape("" if text is None else shown(text), quote=True)


def _svg(width: float, height: float, body: Iterable[str], label: str, cls: str = "") -> str:
    return (f'<svg class="{cls}" viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{e(label)}" '
            f'xmlns="http://www.w3.org/2000/svg">' + "".join(body) + "</svg>")


def _rect(x: float, y: float, w: float, h: float, fill: str, title: str = "", extra: str = "") -> str:
    t = f"<title>{e(title)}</title>" if title else ""
    return f'<rect x="{x:.2f}" y="{y:.2f}" width="{max(w, 0):.2f}" height="{h:.2f}" fill="{fill}"{extra}>{t}</rect>'


def _text(x: float, y: float, text: str, size: int = 12, anchor: str = "start", fill: str = "#1d2430",
          weight: str = "normal") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{fill}" '
            f'font-weight="{weight}">{e(text)}</text>')


def _nice_step(span: float, target: int = 8) -> float:
    raw = span / max(target, 1)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next((m * mag for m in (1, 2, 2.5, 5) if raw <= m * mag), 10 * mag)


def _time_label(seconds: float, step: float) -> str:
    if step >= 1:
        return f"{seconds:.0f} s"
    if step >= 1e-3:
        return f"{seconds * 1e3:.0f} ms" if seconds < 1 or step < 0.1 else f"{seconds:.{max(0, -int(math.floor(math.log10(step))))}f} s"
    return f"{seconds * 1e6:.0f} us"


NUM = " class=num"


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]], td: Sequence[str], cls: str = "") -> str:
    """A table of HTML cells; ``td``: each column's cell attributes (a ``class=num`` column's header too)."""
    th = "".join(f"<th{NUM if a == NUM else ''}>{e(h)}</th>" for h, a in zip(header, td))
    body = "".join("<tr>" + "".join(f"<td{a}>{c}</td>" for c, a in zip(r, td)) + "</tr>" for r in rows)
    return f"<table{cls}><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _kname(name: str, n: int = 80) -> str:
    return f.short(kernel_label(name), n)


def _family_color(fam: str) -> str:
    return FAMILY_COLORS.get(fam, FAMILY_COLORS["other"])


def _header(report: Report) -> str:
    src = report.get("sources") or {}
    env = report.get("environment") or {}
    gen, gpus = report.get("generated") or {}, env.get("gpus") or []
    bits = [f"run {src['run']}"] if src.get("run") else []
    bits += [f"trace {src['trace']} ({src.get('trace_format')})"] if src.get("trace") else []
    bits += [f"headline from {src['unprofiled_run']}"] if src.get("unprofiled_run") else []
    bits += [", ".join(str(g.get("name")) for g in gpus if isinstance(g, dict))] if gpus else []
    bits.append(f"maxinstr {gen.get('maxinstr', '?')}, {gen.get('utc', '')}")
    out = [f"<header><h1>maxinstr report: {e(src.get('run') or src.get('trace') or 'report')}</h1>",
           f'<div class="sub">{e(" · ".join(bits))}</div>']
    for key, label in (("join_problem", "Join failed"), ("capture_problem", "Capture empty")):
        if src.get(key):
            out.append(f'<div class="banner"><b>{label}:</b> {e(src.get(key))}</div>')
    if report.get("perturbed"):
        tail = (" Headline timings come from the unprofiled run." if report.get("headline_source") == "unprofiled_run"
                else " Take headline timings from an unprofiled run (--unprofiled).")
        out.append(f'<div class="banner"><b>Perturbed:</b> {e(report.get("perturbed_reason"))}.{e(tail)}</div>')
    return "".join(out) + _cards(report) + "</header>"


def _cards(report: Report) -> str:
    stages = report.get("stages") or []
    gpu = report.get("gpu") or {}
    w = report.get("warmup") or {}
    cards = [(str(len(stages)), "stages"), (str(sum(s.get("steady", 0) for s in stages)), "steady instances"),
             (str(w.get("instances", 0) + w.get("cold_start_instances", 0) + w.get("inside_startup_instances", 0)),
              "warm-up + cold-start excluded")]
    if gpu:
        cards.append((f.ns(gpu.get("gpu_ns")), f"GPU time in {gpu.get('ops', 0):,} ops"))
        if gpu.get("attributed_share") is not None:
            cards.append((f.pct(gpu.get("attributed_share")), "of GPU time inside a stage"))
    if b := next(iter(report.get("bottlenecks") or []), None):
        cards.append((f.stage_name(b["stage"]), f"top bottleneck ({f.pct(b.get('share'))} of self {b.get('basis', '').replace('_ns', '')})"))
    facts = sum(1 for d in report.get("diagnosis") or [] if d.get("verdict") == "fact")
    cards.append((f"{facts} / {len(report.get('diagnosis') or []) - facts}", "facts / hypotheses"))
    return '<div class="cards">' + "".join(
        f'<div class="card"><div class="v">{e(v)}</div><div class="k">{e(k)}</div></div>' for v, k in cards) + "</div>"


def breakdown_svg(stages: Sequence[Stage]) -> str:
    """Per stage, one bar of its total time over steady instances, on one scale for all stages
    (so the bars compare stages): host time (grey), GPU span (light) and GPU busy inside it
    (dark). The numbers beside each bar are medians per instance."""
    rows = [s for s in stages if (s.get("host_ns") or {}).get("n") or f.gpu_stat(s)[1]]
    bar_x, bar_w, row_h = 240, 470, 26

    def total(stat: Statistic | None) -> float:
        return float((stat or {}).get("total") or 0.0) if (stat or {}).get("n") else 0.0

    common = max([max(total(s.get("headline_host_ns") or s.get("host_ns")), total(f.gpu_stat(s)[1])) for s in rows]
                 + [1.0])
    body = [_text(bar_x, 14, "total over steady instances, one scale for every stage", 11, fill="#5b6577"),
            _text(W - 8, 14, "median: host · GPU · busy · n", 11, "end", "#5b6577")]
    for i, s in enumerate(rows):
        y, head, (glabel, g) = 24 + i * row_h, s.get("headline_host_ns") or s.get("host_ns"), f.gpu_stat(s)
        host, gpu, busy = f.stat(head) or 0.0, f.stat(g) or 0.0, f.stat(s.get("gpu_busy_ns")) or 0.0
        frac = f.stat(s.get("gpu_busy_frac"))
        host_t, gpu_t, busy_t = total(head), total(g), total(s.get("gpu_busy_ns"))
        depth, label = f.stage_label(s["name"], int(s.get("depth", 0)))
        indent = 14 * depth
        body.append(_text(8 + indent, y + 16, f.short(label, 32 - indent // 7), 12))
        tip = (f"{s['name']}: host {f.ns(host)}, GPU {glabel or '-'} {f.ns(gpu) if gpu else '-'}, busy "
               f"{f.ns(busy) if busy else '-'} ({f.pct(frac) if frac is not None else '-'}) per instance (median), "
               f"{s.get('steady')} steady instances; totals host {f.ns(host_t)}, GPU {f.ns(gpu_t) if gpu_t else '-'}")
        body.append(_rect(bar_x, y + 4, bar_w, 16, "#f1f3f7", tip))
        for t, dy, h, color in ((host_t, 4, 16, C_HOST), (gpu_t, 7, 10, C_SPAN),
                                (min(busy_t, gpu_t or busy_t), 7, 10, C_BUSY)):
            if t:
                body.append(_rect(bar_x, y + dy, bar_w * t / common, h, color, tip))
        txt = f"{f.ns(host)} · {f.ns(gpu) if gpu else '-'} · {f.pct(frac) if frac is not None else '-'} · {s.get('steady')}"
        body.append(_text(W - 8, y + 16, txt, 12, "end"))
    legend = ('<div class="legend"><span><span class="sw" style="background:%s"></span>host time</span>'
              '<span><span class="sw" style="background:%s"></span>GPU span (events, else projected)</span>'
              '<span><span class="sw" style="background:%s"></span>GPU busy inside the span</span></div>' % (C_HOST, C_SPAN, C_BUSY))
    return legend + _svg(W, 30 + row_h * len(rows) + 8, body, "per-stage time breakdown", "breakdown")


def _breakdown_section(report: Report) -> str:
    if not (stages := report.get("stages") or []):
        return '<section id="stages"><h2>Where the time goes</h2><p class="note">No stages in this input.</p></section>'
    return ('<section id="stages"><h2>Where the time goes, stage by stage</h2>'
            '<p class="note">Steady state only: warm-up and cold-start instances are excluded (counted in the table). '
            'Busy = GPU busy time / the trace span of the stage\'s GPU work (first kernel start to last kernel end); '
            'a GPU median from events can be longer, since it also counts the stream\'s wait for the first launch. '
            'Low busy with a long span means the GPU waits for launches or the host.</p>'
            + breakdown_svg(stages) + _stage_table(stages)
            + (f'<p class="note">{e(raised[0].upper() + raised[1:])}.</p>' if (raised := f.raised_note(stages)) else "")
            + "</section>")


def _stage_table(stages: Sequence[Stage]) -> str:
    units = []
    for s in stages:  # two populations: each in its own row under the stage (its median is neither's)
        depth, label = f.stage_label(s["name"], int(s.get("depth", 0)))
        units.append((s, e(label), depth, f.excluded(s), s.get("share_of_top")))
        units += [(f.population_row(grp), "· " + e(grp["label"]), depth + 1, 0, None)
                  for grp in (s.get("populations") or {}).get("groups") or []]
    rows = []
    for s, name, depth, excluded, share in units:
        head = s.get("headline_host_ns") or s["host_ns"]
        label, g = f.gpu_stat(s)
        rows.append(["&nbsp;" * 3 * depth + name, s.get("steady", 0), excluded, e(f.ns(f.stat(head))),
                     e(f.ns(f.stat(head, "p90"))), e(f.ns(f.stat(g)) + (" (" + label + ")" if g else "")),
                     e(f.ns(f.stat(g, "p90"))), e(f.pct(f.stat(s.get("gpu_busy_frac")))),
                     e(f.pct(share) if share is not None else "-")])
    return _table(["stage", "steady n", "excluded", "host median", "host p90", "GPU median", "GPU p90", "GPU busy",
                   "share of top level"], rows, [""] + [NUM] * 8, ' class="stages"')


def _merge_spans(start: np.ndarray, end: np.ndarray, min_gap: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge spans closer than ``min_gap`` (one pixel): (start, end, instances merged)."""
    if len(start) == 0:
        return start, end, np.zeros(0, np.int64)
    order = np.argsort(start, kind="stable")
    s, en = start[order], end[order]
    reach = np.maximum.accumulate(en)
    new = np.r_[True, s[1:] > reach[:-1] + min_gap]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(en, idx), np.diff(np.r_[idx, len(s)])


def _bin_mean(t: np.ndarray, v: np.ndarray, t0: float, t1: float, bins: int) -> tuple[np.ndarray, np.ndarray]:
    ok = np.isfinite(v) & (t >= t0) & (t <= t1)
    t, v = t[ok], v[ok]
    if len(t) <= bins:
        return t, v
    b = np.minimum(((t - t0) / max(t1 - t0, 1) * bins).astype(np.int64), bins - 1)
    cnt = np.bincount(b, minlength=bins)
    sm = np.bincount(b, weights=v, minlength=bins)
    tm = np.bincount(b, weights=t, minlength=bins)
    has = cnt > 0
    return tm[has] / cnt[has], sm[has] / cnt[has]


def busy_before(start: np.ndarray, end: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Per edge E, the op time run before E: sum of clip(E - start, 0, end - start), exactly,
    from sorted starts and ends with prefix sums (ops on several streams add up)."""
    s = np.sort(np.asarray(start, np.float64))
    en = np.sort(np.asarray(end, np.float64))
    cs, ce = np.r_[0.0, np.cumsum(s)], np.r_[0.0, np.cumsum(en)]
    ns_, ne = np.searchsorted(s, edges), np.searchsorted(en, edges)
    return (ns_ * edges - cs[ns_]) - (ne * edges - ce[ne])


def timeline_section(report: Report, analysis: Analysis | None) -> str:
    """GPU metrics over time with the stages as bands (needs the analysis's columns)."""
    head = '<section id="timeline"><h2>GPU over time, with the stages</h2>'
    if analysis is None:
        return head + ('<p class="note">This view was rendered from a saved JSON report, which keeps statistics, not '
                       'the timeline. Render from the run directory (maxinstr report RUN --format html) to see it.'
                       '</p></section>')
    from maxinstr.analyze.timeline import timeline  # (traces, rundir, sample): only with an analysis

    tl = timeline(analysis)
    t0, t1 = float(tl.origin_ns), float(tl.end_ns)
    if t1 <= t0:
        return head + '<p class="note">Nothing timed in this input.</p></section>'
    inst = tl.inst
    window_note = ""
    if len(inst) and (~inst.is_mark).any():
        # the stages are what was asked about: frame them (5% margin), say what falls outside
        s0, s1 = float(inst.host_start_ns.min()), float(inst.host_end_ns.max())
        if tl.op_start_ns is not None and len(tl.op_start_ns) and (tl.op_stage >= 0).any():
            s1 = max(s1, float(tl.op_end_ns[tl.op_stage >= 0].max()))
        pad = 0.05 * max(s1 - s0, 1.0)
        w0, w1 = max(t0, s0 - pad), min(t1, s1 + pad)
        if (w0 - t0) + (t1 - w1) > 0.1 * (t1 - t0):
            left_out = [f"{f.ns(v)} {w}" for v, w in ((w0 - t0, "before"), (t1 - w1, "after")) if v > 0]
            window_note = f"Framed on the stages: {' and '.join(left_out)} them (set-up, model loading) not shown. "
            t0, t1 = w0, w1
    span = t1 - t0
    plot_x, plot_w = 150, W - 150 - 16
    px_ns = span / plot_w

    def X(t: np.ndarray | float) -> Any:
        return plot_x + (np.asarray(t, np.float64) - t0) / span * plot_w

    order_keys = [s["name"] for s in report.get("stages") or []]
    # object keys, never astype(str): that copy is instances x the longest name x 4 bytes (2.3 GB
    # for one 3 MB name)
    keys = np.asarray(inst.key, dtype=object) if len(inst) else np.empty(0, object)
    # the keys that have an instance that is not a mark: one pass over the instances (a mask per
    # stage key over every instance was quadratic: 30 s at 20,000 names, past 120 s at 50,000)
    with_stage = set(keys[~inst.is_mark].tolist()) if len(inst) else set()
    depth_of = {s["name"]: int(s.get("depth", 0)) for s in report.get("stages") or []}
    shown = [k for k in order_keys if k in with_stage and depth_of.get(k, 0) <= 2][:12]
    colors = {k: STAGE_COLORS[i % len(STAGE_COLORS)] for i, k in enumerate(shown)}

    def spans(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _merge_spans(np.maximum(start.astype(np.float64), t0), np.minimum(end.astype(np.float64), t1), px_ns)

    def bars(k: str, merged: tuple[np.ndarray, np.ndarray, np.ndarray], y: float, h: float, what: str,
             extra: str = "") -> list[str]:
        s_, e_, n_ = merged
        return [_rect(a, y, max(b - a, 0.6), h, colors[k], f"{what}: {c} instance{'s' if c > 1 else ''}, "
                      f"{f.ns((b - a) * px_ns)}", extra) for a, b, c in zip(X(s_).tolist(), X(e_).tolist(), n_.tolist())]

    # under each stage strip its GPU work: projected spans (trace), else GPU events
    y = 8
    strip_body: list[str] = []
    bands: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for k in shown:
        sel = (keys == k) & ~inst.is_mark & (inst.host_end_ns >= t0) & (inst.host_start_ns <= t1)
        host = spans(inst.host_start_ns[sel], inst.host_end_ns[sel])
        bands[k] = host[:2]
        strip_body.append(_text(plot_x - 6, y + 11, f.short(f.stage_name(k), 22), 11, "end"))
        strip_body += bars(k, host, y, 11, k)
        y += 14
        for gs, ge, what in ((tl.proj_start_ns, tl.proj_end_ns, "projected GPU span"),
                             (tl.event_start_ns, tl.event_end_ns, "GPU events")):
            gsel = (keys == k) & (gs >= 0) & (ge >= gs) & (ge >= t0) & (gs <= t1)
            if gsel.any():
                strip_body.append(_text(plot_x - 6, y + 6, "GPU", 9, "end", "#5b6577"))
                strip_body += bars(k, spans(gs[gsel], ge[gsel]), y - 1, 6, f"{k} {what}", ' fill-opacity="0.55" class="gpu"')
                y += 9
                break
    strip_h_total = y + 4

    # background bands for the charts: the most detailed stages shown, each in its colour
    deepest = max((depth_of.get(k, 0) for k in shown), default=0)
    band_keys = [k for k in shown if depth_of.get(k, 0) == deepest]
    Series = tuple[str, str, np.ndarray, np.ndarray, str]  # (label, colour, t, values, dash)
    util: list[Series] = []
    power: list[Series] = []
    mem: list[Series] = []
    limits_power: list[float] = []
    limits_mem: list[float] = []
    dashes = ("", "5,3", "2,2", "8,3,2,3")
    for _part, smp in tl.samples:
        names = set(smp.rows.dtype.names or ())
        for d in np.unique(np.asarray(smp.device)).tolist():
            info = smp.devices[d] if d < len(smp.devices) else {}
            rows = smp.for_device(d).rows
            t = rows["t_ns"].astype(np.float64)
            dash = dashes[(len(util) // 2) % len(dashes)]
            for col, label, color, target in (("gpu_util_pct", "util %", "#2166ac", util),
                                              ("sm_active_pct", "SM active %", "#e66101", util),
                                              ("tensor_active_pct", "tensor active %", "#5e3c99", util),
                                              ("power_w", "power W", "#b2182b", power),
                                              ("mem_used_bytes", "memory used GiB", "#1b7837", mem)):
                v = rows[col].astype(np.float64) * (1 / 2**30 if col == "mem_used_bytes" else 1.0) if col in names else None
                if v is not None and np.isfinite(v).any():
                    target.append((f"GPU {info.get('visible_index', d)} {label}", color, *_bin_mean(t, v, t0, t1, SERIES_POINTS), dash))
            if info.get("power_limit_w"):
                limits_power.append(float(info["power_limit_w"]))
            if info.get("mem_total_bytes"):
                limits_mem.append(float(info["mem_total_bytes"]) / 2**30)
    if tl.op_start_ns is not None and len(tl.op_start_ns):
        bins = min(SERIES_POINTS, max(50, plot_w))
        edges = t0 + np.arange(bins + 1) * (span / bins)
        pct = np.minimum(np.diff(busy_before(tl.op_start_ns, tl.op_end_ns, edges)) / (span / bins) * 100.0, 100.0)
        util.append(("kernels running (trace) %", "#9aa3b2", (edges[:-1] + edges[1:]) / 2, pct, "area"))
    charts = [(title, series, cap, unit) for title, series, cap, unit in (
        ("utilization / activity (%)", util, 100.0, "%"), ("power (W)", power, max(limits_power, default=None), "W"),
        ("memory used (GiB)", mem, max(limits_mem, default=None), "GiB")) if series]

    chart_h, gap = 120, 26
    total_h = strip_h_total + len(charts) * (chart_h + gap) + 30
    body: list[str] = list(strip_body)
    y0 = strip_h_total + 10
    for title, series, cap, unit in charts:
        top, bottom = y0 + 16, y0 + 16 + chart_h - 20
        title_at = len(body)
        for bk in band_keys:
            for a, b in zip(X(bands[bk][0]).tolist(), X(bands[bk][1]).tolist()):
                body.append(_rect(a, top, max(b - a, 0.6), bottom - top, colors[bk], extra=' fill-opacity="0.12"'))
        vmax = max([float(np.nanmax(v)) for _, _, _, v, _ in series if len(v)] + [1e-9])
        if cap and unit != "%" and vmax < 0.5 * cap:
            title += f" (limit {cap:.4g} {unit})"
            cap = None  # far above the data: say it instead of squashing the curve
        ymax = 100.0 if unit == "%" else max(vmax, cap or 0.0) * 1.1
        ymax = _nice_step(ymax, 4) * math.ceil(ymax / _nice_step(ymax, 4)) if ymax > 0 else 1.0
        for frac in (0.0, 0.5, 1.0):
            yy = bottom - frac * (bottom - top)
            body.append(f'<line x1="{plot_x}" y1="{yy:.1f}" x2="{plot_x + plot_w}" y2="{yy:.1f}" stroke="#e3e7ee"/>')
            body.append(_text(plot_x - 6, yy + 4, f"{ymax * frac:.4g}", 10, "end", "#5b6577"))
        if cap and unit != "%":
            yy = bottom - cap / ymax * (bottom - top)
            body.append(f'<line x1="{plot_x}" y1="{yy:.1f}" x2="{plot_x + plot_w}" y2="{yy:.1f}" stroke="#999" '
                        f'stroke-dasharray="4,3"><title>{e(f"limit {cap:.4g} {unit}")}</title></line>')
        for name, color, tt, vv, dash in series:
            if not len(tt):
                continue
            xs = X(tt)
            ys = bottom - np.clip(vv / ymax, 0, 1.05) * (bottom - top)
            pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(xs.tolist(), ys.tolist()))
            tip = f"<title>{e(name)}: mean {np.nanmean(vv):.3g}, max {np.nanmax(vv):.3g}</title>"
            if dash == "area":  # a derived share, drawn under the measured lines
                body.append(f'<polygon class="series" data-points="{len(tt)}" points="{xs[0]:.1f},{bottom:.1f} {pts} '
                            f'{xs[-1]:.1f},{bottom:.1f}" fill="{color}" fill-opacity="0.55" stroke="none">{tip}</polygon>')
                continue
            da = f' stroke-dasharray="{dash}"' if dash else ""
            body.append(f'<polyline class="series" data-points="{len(tt)}" points="{pts}" fill="none" stroke="{color}" '
                        f'stroke-width="1.4"{da}>{tip}</polyline>')
        body.insert(title_at, _text(plot_x, y0 + 10, title, 12, weight="bold"))
        y0 += chart_h + gap
    step = _nice_step(span / 1e9, 8)
    ax_y = total_h - 22
    body.append(f'<line x1="{plot_x}" y1="{ax_y}" x2="{plot_x + plot_w}" y2="{ax_y}" stroke="#5b6577"/>')
    tick = 0
    while tick * step <= span / 1e9 + 1e-12 and tick < 40:
        xx = float(X(t0 + tick * step * 1e9))
        body.append(f'<line x1="{xx:.1f}" y1="{ax_y}" x2="{xx:.1f}" y2="{ax_y + 4}" stroke="#5b6577"/>')
        body.append(_text(xx, ax_y + 15, _time_label(tick * step, step), 10, "middle", "#5b6577"))
        tick += 1
    legend_items = "".join(f'<span><span class="sw" style="background:{colors[k]}"></span>{e(k)}</span>' for k in shown)
    series_items = "".join(f'<span><span class="sw" style="background:{color}"></span>{e(name)}'
                           f'{" (dashed)" if dash and dash != "area" else ""}</span>'
                           for _, series, _, _ in charts for name, color, _, _, dash in series)
    note = (f"Time from the first event shown; axis: {e(tl.clock.axis)} clock. " + e(window_note)
            + (e(tl.clock.note) + ". " if tl.clock.note else "")
            + (f"Shaded: {e(', '.join(band_keys))} instances. " if band_keys else "")
            + ("Under each stage, its GPU work (GPU). " if 'class="gpu"' in "".join(strip_body) else ""))
    if not tl.samples:
        note += ("No sampler data in this input (the sampler runs inside maxinstr.session() on a GPU); "
                 "the grey line is the share of each time bin in which trace kernels ran. ")
    return (head + f'<p class="note">{note}</p><div class="legend">{legend_items}</div>'
            + _svg(W, total_h, body, "GPU metrics over time with stage bands", "timeline")
            + f'<div class="legend">{series_items}</div></section>')


def mix_svg(mix: Mix) -> str:
    """A 100% stacked bar of the stage's kernel families."""
    x = 0.0
    body = []
    for fam in mix.get("families") or []:
        w = float(fam.get("share") or 0) * W
        if w <= 0:
            continue
        tip = f"{fam['family']}: {f.pct(fam.get('share'), 1)} of GPU time, {f.ns(fam.get('gpu_ns'))}, {fam.get('count')} ops"
        body.append(_rect(x, 0, w, 22, _family_color(fam["family"]), tip, ' class="fam"'))
        if w > 70:
            body.append(_text(x + 4, 15, f"{fam['family']} {f.pct(fam.get('share'))}", 11, fill="#fff", weight="bold"))
        x += w
    return _svg(W, 22, body, "kernel family mix", "mix")


def _kernels_section(report: Report) -> str:
    stages = [s for s in report.get("stages") or [] if (s.get("mix") or {}).get("top_kernels")]
    gpu = report.get("gpu") or {}
    if not stages and not gpu.get("kernels"):
        return ('<section id="kernels"><h2>Top kernels per stage</h2><p class="note">No kernels: give a trace '
                '(--trace) to see which kernels run inside each stage.</p></section>')
    out = ['<section id="kernels"><h2>Top kernels per stage</h2>',
           '<p class="note">Inclusive (a stage counts its nested stages\' kernels), steady instances. '
           'Bars: share of the stage\'s GPU time, coloured by kernel family.</p>']
    fams_seen = sorted({fm["family"] for s in stages for fm in (s.get("mix") or {}).get("families") or []} |
                       {fm["family"] for fm in gpu.get("families") or []})
    out.append('<div class="legend">' + "".join(
        f'<span><span class="sw" style="background:{_family_color(fm)}"></span>{e(fm)}</span>' for fm in fams_seen) + "</div>")
    by_rank = {b["stage"]: b["rank"] for b in report.get("bottlenecks") or []}
    stages = sorted(stages, key=lambda s: (by_rank.get(s["name"], 1e9), -float((s.get("mix") or {}).get("gpu_ns") or 0)))
    for i, s in enumerate(stages):
        mix = s.get("mix") or {}
        out.append(f"<details{' open' if i < 3 else ''}><summary>{e(s['name'])} <span class=note>· "
                   f"{f.ns(mix.get('gpu_ns'))} GPU over {mix.get('instances')} instances ({e(mix.get('instances_used'))}), "
                   f"{mix.get('ops_per_instance')} ops per instance</span></summary>" + mix_svg(mix)
                   + _kernel_table(mix.get("top_kernels") or [], per_instance=True) + "</details>")
    fams, ks, scope, caption = f.gpu_tables(report)
    if ks:
        out.append(f"<details><summary>All kernels <span class=note>· top {min(20, len(ks))}, {e(scope)}: "
                   f"{e(caption)}</span></summary>" + mix_svg({"families": fams})
                   + _kernel_table(ks[:20], per_instance=False) + "</details>")
    return "".join(out) + "</section>"


def _inside_section(report: Report) -> str:
    rows, tied = f.inside_stages(report)
    if not rows and not tied:
        return ""
    out = [f'<section id="inside"><h2>{e(f.INSIDE_TITLE if rows else "How the stages got their GPU work")}</h2>']
    if tied:
        out.append(f'<p class="note">Ops tied to their stage: {e("; ".join(tied))}.</p>')
    if rows:
        out.append(_table(["stage", "range", "share", "ops / inst", "GPU / inst"],
                          ([e(f.stage_name(r["stage"])), f"<code>{e(r['range'])}</code>", f.pct(r["share"]),
                            f"{r['per_instance']:.4g}", f.ns(r["gpu_per_instance_ns"])] for r in rows), [""] * 5))
    return "".join(out) + "</section>"


def _kernel_table(kernels: Sequence[MixKernel | GpuKernel], per_instance: bool) -> str:
    top = max([float(k.get("share") or 0) for k in kernels] + [1e-9])
    rows = []
    for k in kernels:
        share, color = float(k.get("share") or 0), _family_color(k.get("family", ""))
        rows.append(
            f'<tr><td class="kname" title="{e(k.get("name"))}">{e(_kname(k.get("name", ""), 110))}</td>'
            f'<td class="fam"><span class="sw" style="background:{color}"></span>{e(k.get("family"))}</td>'
            f"<td class=num>{k.get('count')}</td>" + (f"<td class=num>{k.get('per_instance')}</td>" if per_instance else "")
            + f"<td class=num>{e(f.ns(k.get('median_ns')))}</td><td class=num>{e(f.ns(k.get('gpu_ns')))}</td>"
            f'<td class=num><span class="bar" style="width:{80 * share / top:.0f}px;background:{color}"></span> '
            f"{f.pct(share, 1)}</td></tr>")
    return ('<table class="kernels"><thead><tr><th>kernel</th><th>family</th><th class=num>count</th>'
            + ("<th class=num>per instance</th>" if per_instance else "")
            + '<th class=num>median</th><th class=num>total</th><th class=num>share</th></tr></thead><tbody>'
            + "".join(rows) + "</tbody></table>")


def steps_svg(stage: Stage) -> str | None:
    """Per-step median (GPU when measured, else host) of a stage with marked or derived steps."""
    per, steps = stage.get("per_step"), stage.get("steps")
    if not per or not per.get("step"):
        return None
    xs = np.asarray(per["step"], np.float64)
    ys = np.asarray(per.get("gpu_median_ns") or per.get("host_median_ns"), np.float64)
    basis = "GPU" if per.get("gpu_median_ns") else "host"
    ok = np.isfinite(ys) & (ys >= 0)
    xs, ys = xs[ok], ys[ok]
    if len(xs) < 2:
        return None
    h, px, pw = 120, 60, W - 76
    top, bottom = 10, h - 24
    x0, x1 = float(xs.min()), float(xs.max())
    ymax = float(ys.max()) * 1.1 or 1.0
    X = px + (xs - x0) / max(x1 - x0, 1) * pw
    Y = bottom - ys / ymax * (bottom - top)
    body = [f'<line x1="{px}" y1="{bottom}" x2="{px + pw}" y2="{bottom}" stroke="#5b6577"/>',
            _text(px - 6, top + 8, f.ns(ymax), 10, "end", "#5b6577"), _text(px - 6, bottom, "0", 10, "end", "#5b6577"),
            _text(px, h - 6, f"step {x0:.0f}", 10, fill="#5b6577"), _text(px + pw, h - 6, f"step {x1:.0f}", 10, "end", "#5b6577"),
            f'<polyline class="series" data-points="{len(xs)}" points="'
            + " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(X.tolist(), Y.tolist()))
            + f'" fill="none" stroke="#2166ac" stroke-width="1.5"><title>{e(stage["name"])}: {basis} median per step'
            + "</title></polyline>"]
    tr = (f" · Spearman {steps.get('spearman', 0):.2f}, last/first quarter {steps.get('last_over_first', 0):.2f}, "
          f"slope {f.ns(steps.get('slope_ns_per_step'))}/step") if steps else ""
    return (f'<h3>{e(stage["name"])} <span class="note">{basis} median per step{e(tr)}</span></h3>'
            + _svg(W, h, body, f"{stage['name']} per step", "steps"))


def _steps_section(report: Report) -> str:
    charts = [c for c in (steps_svg(s) for s in report.get("stages") or []
                          if (s.get("steps") or {}).get("n_steps", 0) >= STEPS_MIN) if c]
    if not charts:
        return ""
    return ('<section id="steps"><h2>Per-step trends</h2><p class="note">A time that grows with the step index '
            '(re-running the prompt each step, a growing cache) shows up here.</p>' + "".join(charts[:6]) + "</section>")


def _finding(d: Finding) -> str:
    cls = "fact" if d.get("verdict") == "fact" else "hypothesis"
    ev = f.evidence_text(d.get("evidence") or {}, d.get("id"), limit=8)
    return (f'<div class="finding {cls}" data-id="{e(d.get("id"))}"><div class="t"><span class="tag {cls}">'
            f'{e(d.get("verdict"))}</span>{e(d.get("title"))}</div>'
            + (f'<div class="ev">evidence: {e(ev)} <span class="note">[{e(d.get("id"))}]</span></div>' if ev else "")
            + (f"<div><b>Next step:</b> {e(d.get('next_step'))}</div>" if d.get("next_step") else "")
            + (f"<pre>{e(d.get('command'))}</pre>" if d.get("command") else "")
            + (f'<div class="note"><b>Validate:</b> <code>{e(d.get("validation"))}</code></div>' if d.get("validation") else "")
            + "</div>")


def _diagnosis_section(report: Report) -> str:
    groups = dict(f.finding_groups(report.get("diagnosis") or []))
    out = ['<section id="diagnosis"><h2>Diagnosis</h2><p class="note">Facts hold by the measured numbers; '
           'hypotheses are likely causes to confirm, each with how to validate a fix. Each group is sorted by the time at stake.</p>']
    for group, title, cls, none in (("Facts", "Facts (measured)", "facts", "none"),
                                    ("Hypotheses", "Hypotheses (to confirm)", "hypotheses", "none fired"),
                                    ("Also noted (nothing at stake)", "Also noted (nothing at stake)", "facts", "")):
        if (fs := groups.get(group, [])) or none:  # (the first two always, "none" when empty)
            out.append(f'<h3>{title} <span class="note">{len(fs)}</span></h3><div class="findings {cls}">'
                       + ("".join(_finding(d) for d in fs) or f'<p class="note">{none}</p>') + "</div>")
    if b := report.get("bottlenecks") or []:
        out.append("<h3>Ranked bottlenecks</h3>" + _table(
            ["#", "stage", "self time", "share", "top family", "top kernel", "findings"],
            ([r.get("rank"), e(f.stage_name(r.get("stage") or "")),
              f"{e(f.ns(r.get('self_ns')))} <span class=note>({e(str(r.get('basis', '')).replace('_ns', ''))})</span>",
              f'<span class=bar style="width:{60 * float(r.get("share") or 0):.0f}px"></span> {f.pct(r.get("share"))}',
              e(r.get("top_family") or "-"), e(_kname(r.get("top_kernel") or "-", 70)),
              e(", ".join(r.get("findings") or []))]
             for r in b[:12]), [NUM, "", NUM, NUM, "", " class=kname", ""]))
    return "".join(out) + "</section>"


def _env_section(report: Report) -> str:
    env = report.get("environment") or {}
    src = report.get("sources") or {}
    text_keys: tuple[Literal["host", "python", "driver", "cuda", "rocm", "maxinstr"], ...] = (
        "host", "python", "driver", "cuda", "rocm", "maxinstr")
    rows: list[tuple[str, Any]] = [(k, env[k]) for k in text_keys if env.get(k)]
    git = env.get("git") or {}
    rows += [("git", f"{git.get('commit', '?')}{' (dirty)' if git.get('dirty') else ''}")] if git else []
    other_keys: tuple[Literal["gpus", "frameworks", "user", "env", "profiler"], ...] = (
        "gpus", "frameworks", "user", "env", "profiler")
    for other in other_keys:
        v: Any = env.get(other)
        if isinstance(v, list) and v:
            rows.append((other, ", ".join(str(g.get("name", g)) if isinstance(g, dict) else str(g) for g in v)))
        elif isinstance(v, dict) and v:
            rows.append((other, ", ".join(f"{a}={b}" for a, b in v.items())))
        elif v:
            rows.append((other, v))
    rows += [("record join", f"{src.get('join')} ({src.get('records_joined')} records)")] if src.get("join") else []
    rules = src.get("attribution_rules")
    rows += [("attribution", ", ".join(f"{k}: {v}" for k, v in rules.items()))] if rules else []
    rows.append(("warm-up", f.warmup_line(report.get("warmup") or {})))
    notes = src.get("notes") or []
    return ('<section id="environment"><h2>Reproduce and environment</h2>'
            + "".join(f'<div class="note">{e(r.get("what"))}</div><pre>{e(r.get("command"))}</pre>'
                      for r in report.get("reproduce") or [])
            + "<table><tbody>" + "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows) + "</tbody></table>"
            + ("<h3>Notes</h3><ul>" + "".join(f'<li class="note">{e(n)}</li>' for n in notes) + "</ul>" if notes else "")
            + "</section>")


def _ranks_section(report: Report) -> str:
    if (sec := rk.section(report)) is None:
        return ""

    def table(header: list[str], rows: list[list[str]]) -> str:
        return _table(header, ([e(c) for c in r] for r in rows),
                      ["" if h in ("stage", "host", "pids", "top family") else NUM for h in header])

    lines = rk.straggler_lines(sec)
    return (f'<section id="ranks"><h2>Ranks</h2><p class="note">{e(rk.summary_line(sec))}. Clock: {e(sec.get("clock"))}.</p>'
            + table(*rk.rank_rows(sec))
            + '<h3>Per-rank stage statistics</h3><p class="note">steps: instances aligned across ranks; slowest / last in: '
            'share of steps where the rank took longest / started last; vs others: median excess over the other ranks; '
            'wait: time waiting for the last rank in a [sync] stage (one the ranks leave together).</p>'
            + table(*rk.stage_rows(sec))
            + ("<h3>Stragglers</h3><ul>" + "".join(f"<li>{e(x)}</li>" for x in lines) + "</ul>" if lines else "")
            + "</section>")


def render(report: Report, analysis: Analysis | None = None, *, width: int = 120, color: bool = False) -> str:
    """The whole report as one HTML document (no external resource)."""
    src = report.get("sources") or {}
    title = f"maxinstr report: {src.get('run') or src.get('trace') or ''}"
    body = [_header(report), _breakdown_section(report), timeline_section(report, analysis), _ranks_section(report),
            _diagnosis_section(report), _kernels_section(report), _inside_section(report), _steps_section(report),
            _env_section(report)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{e(title)}</title>"
            f"<style>{CSS}</style></head><body><main>" + "".join(body)
            + f'<footer>schema {e(report.get("schema"))} v{e(report.get("version"))} · self-contained: no script, no '
            "network</footer></main></body></html>\n")
