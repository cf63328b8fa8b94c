"""Compare runs: per-stage median/p90 deltas with a noise bound from the runs' own spread,
GPU-time and kernel-mix changes, and the settings that differ.

Each side is an :class:`~maxinstr.analyze.report.Analysis` (from a run directory and/or
trace, so the raw per-instance values are at hand and the noise bound is a bootstrap
interval) or a saved report dict (summaries only: the bound then comes from the MADs). The
result is a JSON-serialisable dict, schema ``maxinstr-compare`` version 1 (docs/report.md).
"""

from __future__ import annotations

import re

from typing import Any

import numpy as np

from maxinstr.analyze.report import Analysis
from maxinstr.analyze.stats import bootstrap_median_diff_bound, mad_noise_bound

SCHEMA = "maxinstr-compare"
VERSION = 1

FAMILY_SHARE_CHANGE = 0.02
"""A family's share of GPU time must move by at least this much to be listed as changed."""

_IGNORED_SETTINGS = ("clock", "status", "trace_meta")


class Side:
    """One run in a comparison: its label, report, and (when available) its raw columns."""

    def __init__(self, label: str, source: Analysis | dict[str, Any]) -> None:
        self.label = label
        self._rows_cache: dict[int, dict[str, np.ndarray]] = {}
        if isinstance(source, Analysis):
            self.report = source.report
            self.analysis: Analysis | None = source
        else:
            self.report = source
            self.analysis = None

    def stage(self, name: str) -> dict | None:
        return next((s for s in self.report.get("stages", []) if s["name"] == name), None)

    def values(self, name: str, key: str) -> np.ndarray | None:
        """Steady per-instance values of a stage (headline source for host time), or None."""
        a = self.analysis
        if a is None:
            return None
        inst = a.headline_instances if (key == "host_ns" and a.headline_instances is not None) else a.instances
        rows = self._rows_of(inst).get(name)
        if rows is None:
            return np.empty(0, np.int64)
        col = {"host_ns": inst.host_ns, "gpu_event_ns": inst.gpu_event_ns, "gpu_proj_ns": inst.proj_ns}[key]
        v = col[rows]
        return v[v >= 0]

    def _rows_of(self, inst) -> dict[str, np.ndarray]:  # noqa: ANN001
        """Stage key -> its steady instances, built once per table (a mask per stage and
        side was quadratic in the number of stages)."""
        cache = self._rows_cache
        if id(inst) not in cache:
            keys, rows = inst.steady_by_key()
            cache[id(inst)] = dict(zip(keys.tolist(), rows))
        return cache[id(inst)]


def _stat_of(stage: dict, key: str) -> dict:
    if key == "host_ns":
        return stage.get("headline_host_ns") or stage.get("host_ns") or {"n": 0}
    if key == "gpu_event_ns":
        return stage.get("headline_gpu_event_ns") or stage.get("gpu_event_ns") or {"n": 0}
    return stage.get(key) or {"n": 0}


def _delta_row(a: Side, b: Side, name: str, key: str) -> dict[str, Any] | None:
    sa, sb = a.stage(name), b.stage(name)
    if sa is None or sb is None:
        present = a.label if sa is not None else b.label
        return {"stage": name, "basis": key, "verdict": f"only in {present}", "only_in": "a" if sa is not None else "b"}
    ta, tb = _stat_of(sa, key), _stat_of(sb, key)
    if not ta.get("n") or not tb.get("n"):
        return None
    va, vb = a.values(name, key), b.values(name, key)
    if va is not None and vb is not None and len(va) >= 2 and len(vb) >= 2:
        bound = bootstrap_median_diff_bound(va, vb, 50.0)
        bound90 = bootstrap_median_diff_bound(va, vb, 90.0)
        method = "bootstrap"
    else:
        bound = mad_noise_bound(ta, tb)
        bound90 = 1.5 * bound if np.isfinite(bound) else float("nan")
        method = "mad"
    d = tb["median"] - ta["median"]
    d90 = tb["p90"] - ta["p90"]
    if not np.isfinite(bound):
        verdict = "too few instances"
    elif abs(d) <= bound:
        verdict = "within noise"
    else:
        verdict = "slower" if d > 0 else "faster"
    return {
        "stage": name, "basis": key,
        "a": {"n": ta["n"], "median": ta["median"], "p90": ta["p90"]},
        "b": {"n": tb["n"], "median": tb["median"], "p90": tb["p90"]},
        "median_delta_ns": d, "median_delta_rel": d / ta["median"] if ta["median"] else None,
        "p90_delta_ns": d90, "p90_delta_rel": d90 / ta["p90"] if ta["p90"] else None,
        "noise_bound_ns": bound, "p90_noise_bound_ns": bound90, "noise_method": method,
        "verdict": verdict,
        "p90_verdict": ("within noise" if np.isfinite(bound90) and abs(d90) <= bound90 else
                        ("slower" if d90 > 0 else "faster") if np.isfinite(bound90) else "too few instances"),
    }


def _gpu_key(a: dict, b: dict) -> str | None:
    for key in ("gpu_event_ns", "gpu_proj_ns"):
        if (a.get(key) or {}).get("n") and (b.get(key) or {}).get("n"):
            return key
    return None


def _families(a: dict, b: dict) -> list[dict[str, Any]]:
    fa = {f["family"]: f for f in (a.get("gpu") or {}).get("families", [])}
    fb = {f["family"]: f for f in (b.get("gpu") or {}).get("families", [])}
    rows = []
    for fam in sorted(set(fa) | set(fb)):
        x, y = fa.get(fam, {}), fb.get(fam, {})
        sa, sb = x.get("share", 0.0), y.get("share", 0.0)
        rows.append({"family": fam, "a_share": sa, "b_share": sb, "delta_share": sb - sa,
                     "a_gpu_ns": x.get("gpu_ns", 0.0), "b_gpu_ns": y.get("gpu_ns", 0.0),
                     "changed": abs(sb - sa) >= FAMILY_SHARE_CHANGE or (fam in fa) != (fam in fb)})
    rows.sort(key=lambda r: -abs(r["delta_share"]))
    return rows


_CAST = re.compile(r"\((?:unsigned |signed )?(?:int|long|long long|short|char|bool|unsigned)\)(?=-?\d)")
_COPY_DIR = (("dtoh", ("device-to-host", "devicetohost", "dtoh")), ("htod", ("host-to-device", "hosttodevice", "htod")),
             ("dtod", ("device-to-device", "devicetodevice", "dtod")), ("peer", ("peer-to-peer", "ptop", "peer")))


def kernel_key(name: str) -> str:
    """A kernel's name with the spelling that differs between tools taken out, so one kernel
    read from nsys and from Kineto (or two demanglers) compares equal: the parameter list
    (nsys ``(T3)``, Kineto the concrete types), casts in template arguments (``(int)512`` vs
    ``512``, ``(bool)1`` vs ``true``), ``(anonymous namespace)`` vs ``<unnamed>``, spacing;
    copies become ``memcpy DIRECTION`` / ``memset``."""
    low = name.lower()
    if "memcpy" in low or "memset" in low or low.startswith(("copy", "fill")):
        kind = "memset" if "memset" in low or low.startswith("fill") else "memcpy"
        for label, words in _COPY_DIR:
            if any(w in low for w in words):
                return f"{kind} {label}"
        return kind
    text = _strip_params(name.strip())
    text = text.replace("(bool)1", "true").replace("(bool)0", "false")
    text = _CAST.sub("", text).replace("(anonymous namespace)", "<unnamed>")
    return " ".join(text.split()).replace("> >", ">>").replace("> >", ">>")


def _strip_params(name: str) -> str:
    """The name without its trailing parameter list (nsys prints ``(T3)`` where Kineto prints
    the concrete types)."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        ch = name[i]
        if ch in ")>":
            depth += 1
        elif ch in "(<":
            depth -= 1
            if depth == 0:
                return name[:i] if ch == "(" and i > 0 else name
    return name


def _kernels(a: dict, b: dict) -> tuple[list, list, list]:
    def by_key(side: dict) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for k in (side.get("gpu") or {}).get("kernels", []):
            key = kernel_key(k["name"])
            if key in out:  # two names that are one kernel (or one copy kind): add them up
                merged = dict(out[key])
                merged["gpu_ns"] = merged["gpu_ns"] + k["gpu_ns"]
                merged["share"] = (merged.get("share") or 0) + (k.get("share") or 0)
                out[key] = merged
            else:
                out[key] = k
        return out

    ka, kb = by_key(a), by_key(b)
    appeared = sorted(({"name": kb[n]["name"], "family": kb[n]["family"], "gpu_ns": kb[n]["gpu_ns"],
                        "share": kb[n]["share"]} for n in kb.keys() - ka.keys()), key=lambda r: -r["gpu_ns"])
    gone = sorted(({"name": ka[n]["name"], "family": ka[n]["family"], "gpu_ns": ka[n]["gpu_ns"],
                    "share": ka[n]["share"]} for n in ka.keys() - kb.keys()), key=lambda r: -r["gpu_ns"])
    refamilied = [{"name": ka[n]["name"], "a_family": ka[n]["family"], "b_family": kb[n]["family"]}
                  for n in ka.keys() & kb.keys() if ka[n]["family"] != kb[n]["family"]]
    return appeared, gone, refamilied


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(d, list) and d and all(isinstance(x, dict) for x in d):
        for i, v in enumerate(d):
            out.update(_flatten(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = d
    return out


def settings_diff(a: dict, b: dict) -> list[dict[str, Any]]:
    """Flattened environment keys whose values differ (clock readings and status ignored)."""
    fa = {k: v for k, v in _flatten(a.get("environment", {})).items() if not k.startswith(_IGNORED_SETTINGS)}
    fb = {k: v for k, v in _flatten(b.get("environment", {})).items() if not k.startswith(_IGNORED_SETTINGS)}
    rows = []
    for k in sorted(set(fa) | set(fb)):
        if fa.get(k) != fb.get(k):
            rows.append({"key": k, "a": fa.get(k), "b": fb.get(k)})
    w_a, w_b = a.get("warmup", {}).get("n"), b.get("warmup", {}).get("n")
    if w_a != w_b and not any(r["key"] == "warmup" for r in rows):
        rows.append({"key": "warmup", "a": w_a, "b": w_b})
    return rows


def compare_pair(a: Side, b: Side) -> dict[str, Any]:
    """Everything that changed from ``a`` to ``b``."""
    names = [s["name"] for s in a.report.get("stages", [])]
    names += [s["name"] for s in b.report.get("stages", []) if s["name"] not in names]
    host = [r for r in (_delta_row(a, b, n, "host_ns") for n in names) if r is not None]
    gpu = []
    for n in names:
        sa, sb = a.stage(n), b.stage(n)
        if sa is None or sb is None:
            continue
        key = _gpu_key(sa, sb)
        if key:
            row = _delta_row(a, b, n, key)
            if row is not None:
                gpu.append(row)
    appeared, gone, refamilied = _kernels(a.report, b.report)
    ga, gb = a.report.get("gpu") or {}, b.report.get("gpu") or {}
    return {
        "a": a.label,
        "b": b.label,
        "stages": host,
        "gpu_stages": gpu,
        "gpu_total": {"a_gpu_ns": ga.get("gpu_ns"), "b_gpu_ns": gb.get("gpu_ns"),
                      "a_ops": ga.get("ops"), "b_ops": gb.get("ops")} if (ga or gb) else None,
        "families": _families(a.report, b.report),
        "kernels_appeared": appeared[:50],
        "kernels_disappeared": gone[:50],
        "kernels_changed_family": refamilied,
        "settings": settings_diff(a.report, b.report),
        "perturbed": {"a": bool(a.report.get("perturbed")), "b": bool(b.report.get("perturbed"))},
    }


def compare(sides: list[Side]) -> dict[str, Any]:
    """Each side against the first (the baseline)."""
    if len(sides) < 2:
        raise ValueError("compare needs at least two runs")
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "baseline": sides[0].label,
        "runs": [s.label for s in sides],
        "comparisons": [compare_pair(sides[0], s) for s in sides[1:]],
    }
