"""Compare runs: per-stage median/p90 deltas with a noise bound from the runs' own spread (a
bootstrap over an Analysis' raw values, the MADs of a saved report's summaries), GPU-time and
kernel-mix changes, the settings that differ: a :class:`CompareResult` (``maxinstr-compare`` v1)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal, TypedDict, cast

import numpy as np

from maxinstr.analyze.families import NAIVE_MATMUL
from maxinstr.analyze.instances import StageInstances
from maxinstr.analyze.report import Analysis
from maxinstr.analyze.rules.mix import ROUTING_FAMILIES, moe_permutation
from maxinstr.analyze.schema import GpuKernel, Populations, Report, Stage, Statistic, StepBasis
from maxinstr.analyze.stats import bootstrap_median_diff_bound, mad_noise_bound, summarize

SCHEMA = "maxinstr-compare"
VERSION = 1

FAMILY_SHARE_CHANGE = 0.02
"""A family's share of GPU time must move by at least this much to be listed as changed."""

_IGNORED_SETTINGS = ("clock", "status", "trace_meta")
_RUN_OWN = ("env.MAXINSTR_RUN_DIR",)
"""Keys every run has its own value of (where ``maxinstr run`` put it)."""


# The result's types (docs/report.md says what each key means; a value that cannot be computed is
# None, never NaN), in the functional form: a type a line or two, where ruff's UP013 wants a key a line.
# ruff: noqa: UP013
SideStat = TypedDict("SideStat", {"n": int, "median": float, "p90": float, "runs": int, "run_medians": list[float]})
Delta = TypedDict("Delta", {
    "a": SideStat, "b": SideStat, "median_delta_ns": float, "median_delta_rel": "float | None", "p90_delta_ns": float,
    "p90_delta_rel": "float | None", "noise_bound_ns": "float | None", "p90_noise_bound_ns": "float | None",
    "noise_method": str, "within_run_bound_ns": "float | None", "run_to_run_bound_ns": "float | None", "verdict": str,
    "p90_verdict": str}, total=False)
PopulationSide = TypedDict("PopulationSide", {"by": "str | None", "groups": list[str], "median_in_gap": bool, "runs": int,
                                              "of_runs": int})



class DeltaRow(Delta, total=False):
    """A stage's row (one only on a side has ``stage``, ``basis``, ``verdict`` and ``only_in``
    alone), or a population's under it (``population`` and the delta)."""

    stage: str
    basis: StepBasis
    only_in: Literal["a", "b"]
    populations: PopulationDeltas
    population: str


PopulationDeltas = TypedDict("PopulationDeltas", {"a": "PopulationSide | None", "b": "PopulationSide | None",
                                                  "rows": list[DeltaRow], "not_split": "str | None"})


AB = TypedDict("AB", {"a": Any, "b": Any})  # a value on each side
Findings = TypedDict("Findings", {"a": list[str], "b": list[str], "gone": list[str], "new": list[str]})
Check = TypedDict("Check", {"stage": str, "gpu_busy_frac": AB, "kernels_per_instance": AB, "matmul_growth": AB,
                            "shares": dict[str, AB], "findings": Findings})
FamilyChange = TypedDict("FamilyChange", {"family": str, "a_share": float, "b_share": float, "delta_share": float,
                                          "a_gpu_ns": float, "b_gpu_ns": float, "changed": bool})
KernelChange = TypedDict("KernelChange", {"name": str, "family": str, "gpu_ns": float, "share": float})
Comparison = TypedDict("Comparison", {
    "a": str, "b": str, "stages": list[DeltaRow], "gpu_stages": list[DeltaRow], "gpu_total": "dict[str, Any] | None",
    "families": list[FamilyChange], "kernels_appeared": list[KernelChange], "kernels_disappeared": list[KernelChange],
    "kernels_changed_family": list[dict[str, str]], "runs": AB, "checks": list[Check], "settings": list[dict[str, Any]],
    "perturbed": AB, "notes": list[str]})
CompareResult = TypedDict("CompareResult", {"schema": str, "version": int, "baseline": str, "runs": list[str],
                                            "comparisons": list[Comparison]})


class Side:
    """A side: one or more runs of one program (``maxinstr run --repeat N``), each an Analysis or a
    saved report; ``notes``: what was found for it besides its paths (a trace its meta.json names)."""

    def __init__(self, label: str, source: Analysis | Report | Sequence[Analysis | Report],
                 notes: list[str] | None = None) -> None:
        self.label = label
        self.notes = list(notes or [])
        sources: list[Analysis | Report] = (list(cast("Sequence[Analysis | Report]", source))
                                            if isinstance(source, (list, tuple)) else [cast("Analysis | Report", source)])
        if not sources:
            raise ValueError(f"{label}: no run")
        self.analyses = [x for x in sources if isinstance(x, Analysis)]
        self.reports: list[Report] = [x.report if isinstance(x, Analysis) else x for x in sources]
        self.report = self.reports[0]
        self.runs = len(self.reports)
        # stage name -> its (first) row, and stage key -> its steady instances, built once (a scan
        # or a mask per stage and side was quadratic in the number of stages)
        self._stages: list[dict[str, Stage]] = [{} for _ in self.reports]
        for index, rep in zip(self._stages, self.reports):
            for s in rep.get("stages", []):
                index.setdefault(s["name"], s)
        self._rows: dict[int, dict[str, np.ndarray]] = {}

    def stage(self, name: str) -> Stage | None:
        return self._stages[0].get(name)

    def stages_of_runs(self, name: str) -> list[Stage]:
        """The stage's row in every run that has it."""
        return [index[name] for index in self._stages if name in index]

    def values(self, name: str, key: StepBasis) -> np.ndarray | None:
        """All runs' steady values of a stage, pooled (None when a run has only summaries)."""
        if len(self.analyses) != len(self.reports):
            return None
        out = [np.empty(0, np.int64)]
        for a in self.analyses:
            inst = a.headline_instances if (key == "host_ns" and a.headline_instances is not None) else a.instances
            if (rows := self._rows_of(inst).get(name)) is not None:
                v = {"host_ns": inst.host_ns, "gpu_event_ns": inst.gpu_event_ns, "gpu_proj_ns": inst.proj_ns}[key][rows]
                out.append(v[v >= 0])
        return np.concatenate(out)

    def _rows_of(self, inst: StageInstances) -> dict[str, np.ndarray]:
        if id(inst) not in self._rows:
            keys, rows = inst.steady_by_key()
            self._rows[id(inst)] = dict(zip(keys.tolist(), rows))
        return self._rows[id(inst)]


_HEADLINE: dict[str, Literal["headline_host_ns", "headline_gpu_event_ns"]] = {
    "host_ns": "headline_host_ns", "gpu_event_ns": "headline_gpu_event_ns"}


def _stat_of(stage: Stage, key: StepBasis) -> Statistic:
    return (stage.get(_HEADLINE[key]) if key in _HEADLINE else None) or stage.get(key) or {"n": 0}


T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 12: 2.18,
       15: 2.13, 20: 2.09, 30: 2.04}
"""Two-sided 95% critical values of Student's t by degrees of freedom (2.0 beyond 30)."""


def run_to_run_bound(a: list[float], b: list[float]) -> float:
    """Half-width of a 95% interval of the difference of the sides' mean run medians (Student's t,
    ka + kb - 2 degrees of freedom); NaN under two runs a side: one run cannot show a fresh process's move."""
    if len(a) < 2 or len(b) < 2:
        return float("nan")
    t95 = next((v for k, v in sorted(T95.items()) if len(a) + len(b) - 2 <= k), 2.0)
    return float(t95 * np.sqrt(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b)))


def _pooled_summary(stats: list[Statistic]) -> Statistic:
    """One side's summary from its runs' summaries alone: several runs' instances added up, their
    median, p90 and MAD the median over the runs (a pooled percentile needs the values)."""
    if len(stats) == 1:
        return stats[0]
    return {"n": sum(int(x["n"]) for x in stats), "median": float(np.median([x["median"] for x in stats])),
            "p90": float(np.median([x["p90"] for x in stats])), "mad": float(np.median([x.get("mad", 0.0) for x in stats]))}


def _delta(runs_a: list[Statistic], runs_b: list[Statistic], va: np.ndarray | None, vb: np.ndarray | None) -> Delta:
    """Deltas, noise bounds and verdicts of one time measure from each run's statistic, and the
    pooled steady values when at hand (a bootstrap bound; else one from the MADs)."""
    if va is not None and vb is not None and len(va) >= 2 and len(vb) >= 2:
        ta, tb = summarize(va), summarize(vb)
        within, within90 = bootstrap_median_diff_bound(va, vb, 50.0), bootstrap_median_diff_bound(va, vb, 90.0)
        method = "bootstrap"
    else:
        ta, tb = _pooled_summary(runs_a), _pooled_summary(runs_b)
        within = mad_noise_bound(ta, tb)
        within90 = 1.5 * within if np.isfinite(within) else float("nan")
        method = "mad"
    med_a, med_b = [x["median"] for x in runs_a], [x["median"] for x in runs_b]
    between = run_to_run_bound(med_a, med_b)
    pooled = np.isfinite(between)
    d, d90 = tb["median"] - ta["median"], tb["p90"] - ta["p90"]
    bound = max(within, between) if pooled else within

    def verdict(delta: float, within: float, bound: float) -> str:
        if not np.isfinite(within):
            return "too few instances"
        if abs(delta) <= bound:
            return "within noise"
        # beyond one run's own spread, fresh processes of one program differ by more than that
        return ("slower" if delta > 0 else "faster") if pooled else "cannot tell"

    return {
        "a": {"n": ta["n"], "median": ta["median"], "p90": ta["p90"], "runs": len(runs_a), "run_medians": med_a},
        "b": {"n": tb["n"], "median": tb["median"], "p90": tb["p90"], "runs": len(runs_b), "run_medians": med_b},
        "median_delta_ns": d, "median_delta_rel": d / ta["median"] if ta["median"] else None,
        "p90_delta_ns": d90, "p90_delta_rel": d90 / ta["p90"] if ta["p90"] else None,
        "noise_bound_ns": bound, "p90_noise_bound_ns": within90, "noise_method": f"runs+{method}" if pooled else method,
        "within_run_bound_ns": within, "run_to_run_bound_ns": between if pooled else None,
        "verdict": verdict(d, within, bound),
        "p90_verdict": verdict(d90, within90, max(within90, 1.5 * between if pooled else 0.0)),
    }


def _delta_row(a: Side, b: Side, name: str, key: StepBasis) -> DeltaRow | None:
    sa, sb = a.stage(name), b.stage(name)
    if sa is None or sb is None:
        return {"stage": name, "basis": key, "verdict": f"only in {a.label if sa is not None else b.label}",
                "only_in": "a" if sa is not None else "b"}
    runs_a, runs_b = ([st for st in (_stat_of(x, key) for x in side.stages_of_runs(name)) if st.get("n")]
                      for side in (a, b))
    if not runs_a or not runs_b:
        return None
    row: DeltaRow = {"stage": name, "basis": key, **_delta(runs_a, runs_b, a.values(name, key), b.values(name, key))}
    if (pops := _populations(a, b, name, key)) is not None:
        row["populations"] = pops
    return row


_MODES = ("lower mode", "upper mode")
"""How an unexplained split's two groups are named in compare (the report's labels carry the
run's own threshold, which differs between runs)."""


def _population_labels(p: Populations) -> tuple[str | None, list[str]]:
    """(what tells a stage's populations apart, its groups' labels in the report's order)."""
    groups = p.get("groups") or []
    if p.get("by"):
        return p.get("by"), [str(g.get("label")) for g in groups]
    return None, list(_MODES[:len(groups)])


def _populations(a: Side, b: Side, name: str, key: StepBasis) -> PopulationDeltas | None:
    """A stage with two populations of steady instances on either side: what each side has, and when
    every run of both has the same two, a delta row per population (a pooled median of two populations
    lies between them, a time no instance took, and moves with their mix). None when neither has two."""
    pa = [st.get("populations") for st in a.stages_of_runs(name)]
    pb = [st.get("populations") for st in b.stages_of_runs(name)]
    if not any(pa) and not any(pb):
        return None

    def side(ps: list[Populations | None]) -> PopulationSide | None:
        if not (have := [p for p in ps if p]):
            return None
        by, labels = _population_labels(have[0])
        return {"by": by, "groups": labels, "median_in_gap": any(bool(p.get("median_in_gap")) for p in have),
                "runs": len(have), "of_runs": len(ps)}

    out: PopulationDeltas = {"a": side(pa), "b": side(pb), "rows": [], "not_split": None}
    keys = {(by, frozenset(labels)) if by else (None, tuple(labels))
            for by, labels in (_population_labels(p) for p in pa + pb if p)}
    if not any(pa) or not any(pb):
        out["not_split"] = f"side {'A' if not any(pa) else 'B'} has one"
    elif not all(pa) or not all(pb):
        out["not_split"] = f"not two in every run of side {'A' if not all(pa) else 'B'}"
    elif len(keys) != 1:
        out["not_split"] = "the runs' populations differ (told apart by another feature, or other groups)"
    else:
        for label in _population_labels(cast(Populations, pa[0]))[1]:
            ra, rb = _group_stats(pa, label, key), _group_stats(pb, label, key)
            if ra and rb:
                out["rows"].append({"population": label, **_delta(ra, rb, None, None)})
        if not out["rows"]:
            out["not_split"] = f"its populations have no {key} values on both sides"
    return out


def _group_stats(ps: list[Populations | None], label: str, key: StepBasis) -> list[Statistic]:
    """The statistic ``key`` of the population ``label`` in each run (those with values)."""
    stats = [(p.get("groups") or [])[_population_labels(p)[1].index(label)].get(key) for p in ps if p]
    return [st for st in stats if st and st.get("n")]


def _families(a: Report, b: Report) -> list[FamilyChange]:
    fa = {f["family"]: f for f in (a.get("gpu") or {}).get("families", [])}
    fb = {f["family"]: f for f in (b.get("gpu") or {}).get("families", [])}
    rows: list[FamilyChange] = []
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
        return next((f"{kind} {label}" for label, words in _COPY_DIR if any(w in low for w in words)), kind)
    text = _strip_params(name.strip()).replace("(bool)1", "true").replace("(bool)0", "false")
    text = _CAST.sub("", text).replace("(anonymous namespace)", "<unnamed>")
    return " ".join(text.split()).replace("> >", ">>").replace("> >", ">>")


def _strip_params(name: str) -> str:
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        if name[i] in ")>":
            depth += 1
        elif name[i] in "(<":
            depth -= 1
            if depth == 0:
                return name[:i] if name[i] == "(" and i > 0 else name
    return name


def _kernels(a: Report, b: Report) -> tuple[list[KernelChange], list[KernelChange], list[dict[str, str]]]:
    def by_key(side: Report) -> dict[str, GpuKernel]:
        out: dict[str, GpuKernel] = {}
        for k in (side.get("gpu") or {}).get("kernels", []):
            key = kernel_key(k["name"])
            if key in out:  # two names that are one kernel (or one copy kind): add them up
                k = {**out[key], "gpu_ns": out[key]["gpu_ns"] + k["gpu_ns"],
                     "share": (out[key].get("share") or 0) + (k.get("share") or 0)}
            out[key] = k
        return out

    def listed(side: dict[str, GpuKernel], keys: set[str]) -> list[KernelChange]:
        rows: list[KernelChange] = [{"name": side[n]["name"], "family": side[n]["family"], "gpu_ns": side[n]["gpu_ns"],
                                     "share": side[n]["share"]} for n in keys]
        return sorted(rows, key=lambda r: (-r["gpu_ns"], r["name"]))  # (names break ties: not the hash seed)

    ka, kb = by_key(a), by_key(b)
    refamilied = [{"name": ka[n]["name"], "a_family": ka[n]["family"], "b_family": kb[n]["family"]}
                  for n in sorted(ka.keys() & kb.keys()) if ka[n]["family"] != kb[n]["family"]]
    return listed(kb, kb.keys() - ka.keys()), listed(ka, ka.keys() - kb.keys()), refamilied


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


def settings_diff(a: Report, b: Report, more_a: list[Report] | None = None, more_b: list[Report] | None = None
                  ) -> list[dict[str, Any]]:
    """Flattened environment keys whose values differ (clock readings, status and each run's own
    directory ignored; a key that differs between the runs of one side is that side's noise,
    not a setting). A ``--sweep`` value (``environment.sweep``) is a setting like any other."""
    def flat(rep: Report) -> dict[str, Any]:
        return {k: v for k, v in _flatten(rep.get("environment", {})).items()
                if not k.startswith(_IGNORED_SETTINGS) and k not in _RUN_OWN}

    fa, fb = flat(a), flat(b)
    own = {k for other in (more_a or []) for k, v in flat(other).items() if fa.get(k) != v}
    own |= {k for other in (more_b or []) for k, v in flat(other).items() if fb.get(k) != v}
    rows = [{"key": k, "a": fa.get(k), "b": fb.get(k)} for k in sorted(set(fa) | set(fb))
            if fa.get(k) != fb.get(k) and k not in own]
    w_a, w_b = a.get("warmup", {}).get("n"), b.get("warmup", {}).get("n")
    if w_a != w_b and not any(r["key"] == "warmup" for r in rows):
        rows.append({"key": "warmup", "a": w_a, "b": w_b})
    return rows


def _median_of_runs(side: Side, name: str, get: Callable[[Stage], float | None]) -> float | None:
    """The median over a side's runs of a stage's value; None where no run has one (a value a
    run could not compute is NaN in memory and null in JSON: both are missing)."""
    vals = [float(v) for v in (get(st) for st in side.stages_of_runs(name)) if v is not None and np.isfinite(v)]
    return float(np.median(vals)) if vals else None


SHARE_CHECKS = {"attention_dominated_decode": "attention", "moe_routing_overhead": "routing",
                "low_bit_quant_overhead": "quantization", "naive_matmul": "naive matmul"}
"""Findings whose validation line names a share of the stage's GPU time: what it names."""


def _share(stage: Stage, what: str) -> float | None:
    """A stage's share of GPU time in what a finding's validation names (``SHARE_CHECKS``); None without kernels."""
    if not (mix := stage.get("mix")):
        return None
    if what == "naive matmul":
        return float(sum(k["share"] for k in mix.get("top_kernels", []) if NAIVE_MATMUL.search(k["name"])))
    counted = ROUTING_FAMILIES if what == "routing" else (what,)
    share = float(sum(f["share"] for f in mix.get("families", []) if f["family"] in counted))
    # the routing finding counts top-k and the generic sort/scatter kernels of the token permutation too
    return share + moe_permutation(stage)[0] if what == "routing" else share


def _median(stat: Statistic | None) -> float | None:
    return (stat or {}).get("median") if (stat or {}).get("n") else None


def _stage_checks(a: Side, b: Side, names: list[str]) -> list[Check]:
    """Per stage, what the diagnosis' validation lines ask to check (a side's median over its runs), its findings."""
    def findings(side: Side, name: str) -> list[str]:
        return sorted({f["id"] for f in side.report.get("diagnosis") or [] if f.get("stage") == name})

    def ab(n: str, get: Callable[[Stage], float | None]) -> AB:
        return {"a": _median_of_runs(a, n, get), "b": _median_of_runs(b, n, get)}

    rows: list[Check] = []
    for n in names:
        if a.stage(n) is None or b.stage(n) is None:
            continue
        fa, fb = findings(a, n), findings(b, n)
        named = sorted({SHARE_CHECKS[x] for x in fa + fb if x in SHARE_CHECKS})
        row: Check = {"stage": n, "gpu_busy_frac": ab(n, lambda st: _median(st.get("gpu_busy_frac"))),
                      "kernels_per_instance": ab(n, lambda st: _median(st.get("kernels_per_instance"))),
                      "matmul_growth": ab(n, lambda st: ((st.get("step_work") or {}).get("matmul_ns") or {}).get(
                          "last_over_first")),
                      "shares": {w: ab(n, partial(_share, what=w)) for w in named},
                      "findings": {"a": fa, "b": fb, "gone": [x for x in fa if x not in fb],
                                   "new": [x for x in fb if x not in fa]}}
        measured = (row["gpu_busy_frac"], row["kernels_per_instance"], row["matmul_growth"])
        if any(v["a"] is not None or v["b"] is not None for v in measured) or fa or fb:
            rows.append(row)
    return rows


def compare_pair(a: Side, b: Side) -> Comparison:
    """Everything that changed from ``a`` to ``b``."""
    names = [s["name"] for s in a.report.get("stages", [])]
    names += [s["name"] for s in b.report.get("stages", []) if s["name"] not in names]
    gpu_keys = [(n, _gpu_key(a.stage(n), b.stage(n))) for n in names]
    appeared, gone, refamilied = _kernels(a.report, b.report)
    ga, gb = a.report.get("gpu") or {}, b.report.get("gpu") or {}
    return {
        "a": a.label,
        "b": b.label,
        "stages": [r for r in (_delta_row(a, b, n, "host_ns") for n in names) if r is not None],
        "gpu_stages": [r for n, key in gpu_keys if key and (r := _delta_row(a, b, n, key)) is not None],
        "gpu_total": {"a_gpu_ns": ga.get("gpu_ns"), "b_gpu_ns": gb.get("gpu_ns"),
                      "a_ops": ga.get("ops"), "b_ops": gb.get("ops")} if (ga or gb) else None,
        "families": _families(a.report, b.report),
        "kernels_appeared": appeared[:50],
        "kernels_disappeared": gone[:50],
        "kernels_changed_family": refamilied,
        "runs": {"a": a.runs, "b": b.runs},
        "checks": _stage_checks(a, b, names),
        "settings": settings_diff(a.report, b.report, a.reports[1:], b.reports[1:]),
        "perturbed": {"a": bool(a.report.get("perturbed")), "b": bool(b.report.get("perturbed"))},
        "notes": [f"A: {n}" for n in a.notes] + [f"B: {n}" for n in b.notes],
    }


def _gpu_key(a: Stage | None, b: Stage | None) -> StepBasis | None:
    keys: tuple[StepBasis, ...] = ("gpu_event_ns", "gpu_proj_ns")
    return next((key for key in keys if a and b and (a.get(key) or {}).get("n") and (b.get(key) or {}).get("n")), None)


def compare(sides: list[Side]) -> CompareResult:
    """Each side against the first (the baseline)."""
    if len(sides) < 2:
        raise ValueError("compare needs at least two runs")
    return cast(CompareResult, finite({"schema": SCHEMA, "version": VERSION, "baseline": sides[0].label,
                                       "runs": [s.label for s in sides],
                                       "comparisons": [compare_pair(sides[0], s) for s in sides[1:]]}))


def finite(obj: Any) -> Any:
    """``obj`` with NaN and infinities None and numpy scalars plain numbers: a value that could
    not be computed is missing in every view (null, '-'), never 'nan'."""
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    return obj
