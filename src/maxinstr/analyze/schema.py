"""The report's schema, ``maxinstr-report`` version 1, as types: the source of truth for its keys
(docs/report.md says what they mean). A report is a plain ``dict`` that mypy checks against these
types (.ci/mypy_typeddict_get.py covers ``.get``), as tests/analyze/test_schema.py checks every fixture's.

Every class is ``total=False``: reports of earlier maxinstr versions of version 1 are read too.
``Always[X]`` marks a key every version-1 report carries (the oldest saved one included,
tests/data/reports/h200_kvcache_b16.report.json). ``X | None``: may be null (so is every NaN or
infinity). Durations are ns, shares 0..1; dict keys that are data are ``dict[str, ...]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Final, Literal, TypedDict, TypeVar

SCHEMA: Final = "maxinstr-report"
VERSION: Final = 1


def is_report_file(path: str) -> bool:
    """Whether ``path`` is a saved report (``--format json``): a ``.json`` file whose first 4 KiB
    name the schema. A sniff to tell inputs apart; :func:`maxinstr.render.json.load` checks."""
    p = Path(path)
    if not p.is_file() or p.suffix.lower() != ".json":
        return False
    with open(p, "rb") as fh:
        return SCHEMA.encode() in fh.read(4096)

_T = TypeVar("_T")
ALWAYS = "always"
Always = Annotated[_T, ALWAYS]
"""A key every version-1 report has (its value may still be null when ``X`` allows it)."""

# ----------------------------------------------------------------------------- building blocks
StatisticKey = Literal["host_ns", "gpu_event_ns", "gpu_proj_ns", "gpu_busy_ns", "gpu_busy_frac", "idle_gap_ns",
                       "kernels_per_instance"]
"""The statistics every stage row (and every population of one) carries."""
StatisticField = Literal["median", "p90", "p99", "min", "max", "mean", "mad", "q1", "q3", "total"]
"""The numbers of a :class:`Statistic` besides its count ``n``."""
TimeKey = Literal["host_ns", "gpu_event_ns", "gpu_proj_ns", "gpu_busy_ns"]
"""The time measures (``stages[].self_ns`` has one total per measure, ``bottlenecks[].basis`` is one)."""
StepBasis = Literal["host_ns", "gpu_event_ns", "gpu_proj_ns"]
"""What a step trend or a two-population split is judged on: the best GPU measure, else host time."""


class Statistic(TypedDict, total=False):
    """``{n}`` when empty, else count, median, percentiles (linear interpolation), extremes, mean,
    MAD, quartiles and the sum over the steady instances."""

    n: Always[int]
    """Instances the statistic rests on; the other keys are there only when ``n > 0``."""
    median: float
    p90: float
    p99: float
    min: float
    max: float
    mean: float
    mad: float
    q1: float
    q3: float
    total: float


class SelfTimes(TypedDict, total=False):
    """``stages[].self_ns``: per time measure that has values, the total over steady instances of
    each instance's value minus its direct child instances' (clipped at 0)."""

    host_ns: float
    gpu_event_ns: float
    gpu_proj_ns: float
    gpu_busy_ns: float


class StepTrend(TypedDict, total=False):
    """How a per-instance value changes with the step index: ``{n_steps}`` only under 4 steps."""

    n_steps: Always[int]
    n_instances: int
    first_step: int
    last_step: int
    slope_ns_per_step: float
    spearman: float
    first_quarter_median_ns: float
    last_quarter_median_ns: float
    last_over_first: float | None
    """Null when the first quarter's median is 0."""
    basis: StepBasis
    """``stages[].steps`` only (``step_work``'s trends are on op time, matmul time, op count)."""


class StepWork(TypedDict, total=False):
    """``stages[].step_work``: trends of what each step launched (``ops`` holds counts)."""

    gpu_op_ns: Always[StepTrend]
    matmul_ns: Always[StepTrend]
    ops: Always[StepTrend]


class PerStep(TypedDict, total=False):
    """``stages[].per_step``: per marked step (parallel lists, first 10,000 steps)."""

    step: Always[list[int]]
    n: Always[list[int]]
    host_median_ns: Always[list[float]]
    gpu_basis: StepBasis
    """With ``gpu_median_ns``, when the stage's step basis is a GPU measure."""
    gpu_median_ns: list[float | None]


# ----------------------------------------------------------------------------- kernel mix
class FamilyRow(TypedDict, total=False):
    """A kernel family's GPU time: ``gpu.families[]`` and ``stages[].mix.families[]``."""

    family: Always[str]
    gpu_ns: Always[float]
    share: Always[float]
    count: Always[int]


class KernelRow(FamilyRow, total=False):
    """What a row of ``gpu.kernels[]`` and of ``stages[].mix.top_kernels[]`` share: one kernel name."""

    name: Always[str]
    median_ns: Always[float]


class MixKernel(KernelRow, total=False):
    """``stages[].mix.top_kernels[]``."""

    per_instance: Always[float]


class GpuKernel(KernelRow, total=False):
    """``gpu.kernels[]``: one distinct kernel (or copy) name, top 300 by time."""

    max_ns: Always[float]


class MixRange(TypedDict, total=False):
    """``stages[].mix.ranges[]``: a range of another domain the stage's ops ran under."""

    name: Always[str]
    ops: Always[int]
    kernels: Always[int]
    gpu_ns: Always[float]
    share: Always[float]
    per_instance: Always[float]


class Mix(TypedDict, total=False):
    """``stages[].mix``: the stage's kernels (inclusive of nested stages') over steady instances."""

    instances: Always[int]
    instances_used: Always[Literal["steady", "all"]]
    gpu_ns: Always[float]
    ops: Always[int]
    ops_per_instance: Always[float]
    families: Always[list[FamilyRow]]
    top_kernels: Always[list[MixKernel]]
    other_share: Always[float]
    rules: dict[str, int]
    """How the stage's ops were tied to it: attribution rule name -> ops."""
    ranges: list[MixRange]


# ----------------------------------------------------------------------------- populations, samples
class StageStatistics(TypedDict, total=False):
    """The statistics (:data:`StatisticKey`) over steady instances that a stage row and each of
    its populations carry."""

    host_ns: Always[Statistic]
    gpu_event_ns: Always[Statistic]
    gpu_proj_ns: Always[Statistic]
    gpu_busy_ns: Always[Statistic]
    gpu_busy_frac: Always[Statistic]
    idle_gap_ns: Always[Statistic]
    kernels_per_instance: Always[Statistic]


class PopulationGroup(StageStatistics, total=False):
    """One of a stage's two populations, with its own statistics."""

    label: Always[str]
    instances: Always[int]
    share: Always[float]
    cuda_graph_share: Always[float | None]


class Populations(TypedDict, total=False):
    """``stages[].populations``: the stage's steady instances form two groups."""

    basis: Always[StepBasis]
    by: Always[str | None]
    """The feature that tells them apart; null when none does."""
    explained: Always[bool]
    separation: Always[float]
    threshold_ns: Always[float]
    median_in_gap: Always[bool]
    groups: Always[list[PopulationGroup]]


class DeviceSamples(TypedDict, total=False):
    """``stages[].samples.devices[]``: the sampler's numbers for the stage on one device."""

    part: str
    device: int
    instances: int
    samples: int
    hw_throttle_samples: int
    power_cap_samples: int
    throttle_reasons_seen: list[str]
    mean_instance_ns: float
    sm_clock_max_mhz: int | None
    power_limit_w: float | None
    gpu_util_mean_pct: float | None
    gpu_util_peak_pct: float | None
    mem_util_mean_pct: float | None
    sm_active_mean_pct: float | None
    sm_clock_mean_mhz: float | None
    sm_occupancy_mean_pct: float | None
    tensor_active_mean_pct: float | None
    dram_bw_util_mean_pct: float | None
    mem_used_peak_bytes: float | None
    power_mean_w: float | None
    power_peak_w: float | None
    temp_peak_c: float | None
    energy_per_instance_j: float | None
    energy_total_j: float | None
    gpu_util_window_share: float | None
    sm_active_window_share: float | None
    energy_power_w: float | None
    energy_window_share: float | None


class SamplerMeans(TypedDict, total=False):
    """What ``samples`` and ``stages[].samples`` share: sample counts and each metric's mean."""

    samples: int
    throttled_samples: int
    gpu_util_pct_mean: float | None
    sm_active_pct_mean: float | None
    sm_clock_mhz_mean: float | None
    power_w_mean: float | None
    mem_util_pct_mean: float | None
    temp_c_mean: float | None
    tensor_active_pct_mean: float | None
    dram_bw_util_pct_mean: float | None


class StageSamples(SamplerMeans, total=False):
    """``stages[].samples``: sampler numbers over the stage's steady instances (docs/sampler.md).
    From plain sample columns (``build_report(samples=...)``) ``device``, ``devices`` and the power
    split are absent. ``window_limited``, ``power_limited``, ``sampler_window_min_ns``: the verdict."""

    device: int
    instances_with_samples: int | None
    util_window_share: float | None
    power_source: Literal["energy", "reading"] | None
    power_reading_w_mean: float | None
    power_reading_lags: bool
    energy_per_instance_j: float | None
    sm_clock_max_mhz: int | None
    power_limit_w: float | None
    throttled_share: float | None
    throttle_lagged_samples: int
    throttle_reasons: list[str]
    throttle_reason_samples: dict[str, int]
    devices: list[DeviceSamples]
    window_limited: bool
    """Utilization describes mostly the time around the stage (NVML windows elsewhere, or none over it)."""
    power_limited: bool
    """The same verdict for power (on the energy counter's readings, else on NVML's windows)."""
    energy_window_share: float | None
    sampler_window_min_ns: int


class SamplesSummary(SamplerMeans, total=False):
    """``samples``: the run-wide sampler summary; ``{error}`` when the samples could not be read."""

    devices: int
    span_ns: int
    throttle_reasons: dict[str, int]
    """Throttle reason -> samples that carry it."""
    error: str
    gpu_util_pct_max: float | None
    sm_active_pct_max: float | None
    sm_clock_mhz_max: float | None
    power_w_max: float | None
    mem_util_pct_max: float | None
    temp_c_max: float | None
    tensor_active_pct_max: float | None
    dram_bw_util_pct_max: float | None


# ----------------------------------------------------------------------------- stages
class Stage(StageStatistics, total=False):
    """``stages[]``: one row per stage key, in pipeline order (parents before their children)."""

    name: Always[str]
    """The stage key: the name, or ``parent/name`` where one name runs under different parents."""
    parent: Always[str | None]
    depth: Always[int]
    leaf: Always[str]
    instances: Always[int]
    steady: Always[int]
    warmup: Always[int]
    cold_start: Always[int]
    exceptions: Always[int]
    share_of_top: Always[float | None]
    self_ns: Always[SelfTimes]
    steps_marked: Always[bool]
    steps: Always[StepTrend | None]
    mix: Always[Mix | None]
    samples: Always[StageSamples | None]
    step_work: Always[StepWork | None]
    headline_from: Always[Literal["unprofiled_run", "run"]]
    headline_host_ns: Always[Statistic]
    headline_gpu_event_ns: Always[Statistic]
    inside_startup: int
    populations: Populations | None
    cuda_graph_share: float | None
    gpu_event_over_host: Statistic
    """Per steady instance timed on the GPU: its GPU event time over its own host time (not the
    ratio of the medians, which are over different instances when only some carry GPU times)."""
    per_step: PerStep
    """Only on a stage whose steps the user marked (``steps_marked``)."""


class StartupRow(TypedDict, total=False):
    """``startup[]``: an instance kept out as warm-up or cold start (first 50 by start), with the
    top-level instance it ran in and how many instances it holds."""

    stage: Always[str]
    occurrence: Always[int]
    reason: Always[Literal["warmup", "cold_start"]]
    host_ns: Always[int]
    gpu_event_ns: Always[int | None]
    gpu_proj_ns: Always[int | None]
    robust_z: Always[float | None]
    top_stage: str
    top_occurrence: int
    nested: int


# ----------------------------------------------------------------------------- report sections
class Generated(TypedDict, total=False):
    maxinstr: Always[str]
    utc: Always[str]


class Sources(TypedDict, total=False):
    run: Always[str | None]
    trace: Always[str | None]
    trace_format: Always[str | None]
    trace_clock: Always[str | None]
    unprofiled_run: Always[str | None]
    join: Always[str | None]
    """``payload``, ``thread_name_order``, ``clock``, ``none`` (the attribution's join method), or null."""
    records_joined: Always[int | None]
    attribution_rules: Always[dict[str, int] | None]
    notes: Always[list[str]]
    join_problem: str | None
    """Why no stage record joined the trace, and what to do (null when they joined)."""
    capture_problem: str | None
    """A steady-state capture that holds none of the program's GPU work (or could not start), with the fix."""


class Environment(TypedDict, total=False):
    """The run's meta.json subset (keys with a value only), with the trace's scalar metadata
    (``trace_meta``) and the ``maxinstr run --sweep`` value (``sweep``)."""

    command: list[str] | str
    maxinstr_command: list[str]
    """The ``maxinstr run`` command line that makes the run again, where ``maxinstr run`` made it."""
    cwd: str
    git: dict[str, Any]
    host: str
    python: str
    maxinstr: str
    gpus: list[dict[str, Any]]
    driver: str
    cuda: str
    rocm: str
    frameworks: dict[str, Any]
    env: dict[str, Any]
    user: dict[str, Any]
    profiler: dict[str, Any] | str
    warmup: int
    clock: dict[str, Any]
    trace_meta: dict[str, str | int | float | bool]
    sweep: dict[str, str]


class WarmupSummary(TypedDict, total=False):
    n: Always[int]
    """Warm-up instances per stage name, as declared (``warmup=N`` or ``--warmup``)."""
    instances: Always[int]
    cold_start_instances: Always[int]
    inside_startup_instances: int
    pipeline_head: str | None
    """The top-level stage that begins each pipeline iteration when top-level siblings repeat at
    different rates (``prefill``, then many ``decode``); None: each name counts its own instances."""


class Coverage(TypedDict, total=False):
    """How much of the run's wall time the top-level stages cover."""

    wall_ns: Always[int]
    in_stages_ns: Always[int]
    gpu_event_ns: Always[int | None]
    gpu_event_instances: Always[int]


class OwnOps(TypedDict, total=False):
    """maxinstr's own GPU-floor calibration kernels, left out of the rest of ``gpu``."""

    count: Always[int]
    gpu_ns: Always[float]


class GpuTables(TypedDict, total=False):
    """What ``gpu`` and ``gpu.steady`` share."""

    ops: Always[int]
    gpu_ns: Always[float]
    families: Always[list[FamilyRow]]
    kernels: Always[list[GpuKernel]]


class SteadyGpu(GpuTables, total=False):
    """``gpu.steady``: the GPU tables without the warm-up's ops (what the views show first)."""

    startup_ops: Always[int]
    """Ops left out: held by a warm-up or cold-start instance, or one nested in it."""
    startup_gpu_ns: Always[float]


class GpuSection(GpuTables, total=False):
    """``gpu``: every GPU op of the trace (null without one)."""

    span_ns: Always[int]
    attributed_share: Always[float | None]
    other_share: Always[float]
    distinct_kernels: Always[int]
    kernels_truncated: Always[bool]
    own_ops: OwnOps
    steady: SteadyGpu | None
    """The same tables without the ops of startup instances; absent when no such instance holds an op."""


class Finding(TypedDict, total=False):
    """``diagnosis[]``: what a rule saw (docs/report.md, "Diagnosis rules")."""

    id: Always[str]
    title: Always[str]
    verdict: Always[Literal["fact", "hypothesis"]]
    stage: Always[str | None]
    evidence: Always[dict[str, Any]]
    """The numbers that fired it, units in the key names: per rule, see analyze/diagnosis.py."""
    next_step: Always[str]
    command: Always[str | None]
    validation: Always[str | None]
    score: Always[float]


class Bottleneck(TypedDict, total=False):
    """``bottlenecks[]``: stages ranked by self time on one basis."""

    rank: Always[int]
    stage: Always[str]
    basis: Always[TimeKey]
    self_ns: Always[float]
    total_ns: Always[float]
    median_ns: Always[float]
    instances: Always[int]
    has_children: Always[bool]
    share: Always[float]
    top_family: Always[str | None]
    top_family_share: Always[float | None]
    top_kernel: Always[str | None]
    top_kernel_share: Always[float | None]
    findings: Always[list[str]]


class ReproduceStep(TypedDict, total=False):
    what: Always[str]
    command: Always[str]


# ----------------------------------------------------------------------------- ranks
class RankInfo(TypedDict, total=False):
    """``ranks.ranks[]``: one rank's identity and parts."""

    rank: Always[int]
    local_rank: Always[int | None]
    world_size: Always[int | None]
    host: Always[str | None]
    pids: Always[list[int | None]]
    parts: Always[list[str | None]]
    records: Always[int]
    unclosed: bool
    """Only when one of its parts was still running (not closed) when read."""


class RankStageRow(TypedDict, total=False):
    """``ranks.stages[].per_rank[]``: the GPU statistic is under the stage's ``gpu_basis``; the
    step numbers only when the stage has aligned steps, the wait numbers in synchronising stages."""

    rank: Always[int]
    host_ns: Always[Statistic]
    gpu_event_ns: Statistic
    gpu_proj_ns: Statistic
    slowest_share: float
    last_arrival_share: float
    excess_median_ns: float
    arrival_median_ns: float
    least_wait_share: float
    wait_median_ns: float
    wait_total_ns: float


class RankStage(TypedDict, total=False):
    """``ranks.stages[]`` (top 200 by host time); the spreads only with aligned steps."""

    stage: Always[str]
    parent: Always[str | None]
    groups: Always[int]
    per_rank: Always[list[RankStageRow]]
    gpu_basis: Always[Literal["gpu_event_ns", "gpu_proj_ns"] | None]
    judged: Always[bool]
    sync: bool
    start_spread_median_ns: float
    end_spread_median_ns: float


class StragglerAt(TypedDict, total=False):
    """A stage where a rank straggles: its aligned steps and the time it cost in all."""

    stage: Always[str]
    groups: Always[int]
    excess_total_ns: Always[float]


class StragglerSlow(StragglerAt, total=False):
    """``ranks.stragglers[].slowest_in[]``."""

    slowest_share: Always[float]
    excess_median_ns: Always[float]
    median_ns: Always[float | None]
    others_median_ns: Always[float]


class StragglerWait(StragglerAt, total=False):
    """``ranks.stragglers[].others_wait_in[]``."""

    least_wait_share: Always[float]
    last_arrival_share: Always[float]
    arrival_median_ns: Always[float]
    wait_median_ns: Always[dict[str, float | None]]
    """Rank -> its median wait per step."""


class Straggler(TypedDict, total=False):
    rank: Always[int]
    slowest_in: Always[list[StragglerSlow]]
    others_wait_in: Always[list[StragglerWait]]
    others_wait_total_ns: Always[float]
    excess_total_ns: Always[float]


class RankGpu(TypedDict, total=False):
    """``ranks.gpu[]``: one rank's GPU time from its trace."""

    rank: Always[int]
    ops: Always[int]
    gpu_ns: Always[float]
    collective_ns: Always[float]
    collective_share: Always[float | None]
    top_family: Always[str | None]


class RankThresholds(TypedDict, total=False):
    slowest_share: Always[float]
    excess_rel: Always[float]
    excess_min_ns: Always[int]
    min_groups: Always[int]
    sync_end_over_start: Always[float]


class RanksSection(TypedDict, total=False):
    """``ranks``: a multi-rank run (null with fewer than 2 ranks); docs/report.md "Multi-rank runs"."""

    ranks: Always[list[RankInfo]]
    world_size: Always[int]
    clock: Always[str]
    stages: Always[list[RankStage]]
    stragglers: Always[list[Straggler]]
    gpu: Always[list[RankGpu] | None]
    thresholds: Always[RankThresholds]


# ----------------------------------------------------------------------------- the report
class FootprintSources(TypedDict, total=False):
    """``footprint.overall_ns_by_source``: the estimate's ns over the steady top-level instances."""

    stages: float
    gpu_events: float
    kernels: float


class Footprint(TypedDict, total=False):
    """``footprint``: what watching cost, estimated (analyze/footprint.py, docs/report.md)."""

    stage_ns: Always[float]
    stage_felt: Always[float]
    event_ns: Always[float]
    gpu_timed_instances: Always[int]
    op_ns: Always[float | None]
    share_by_stage: Always[dict[str, float]]
    overall_share: Always[float | None]
    overall_ns_by_source: Always[FootprintSources | None]


class Report(TypedDict, total=False):
    """The report: what :func:`~maxinstr.analyze.report.build_report` returns and
    ``--format json`` writes (keys in this order, ``coverage`` between ``gpu`` and ``samples``)."""

    schema: Always[Literal["maxinstr-report"]]
    version: Always[Literal[1]]
    generated: Always[Generated]
    sources: Always[Sources]
    environment: Always[Environment]
    perturbed: Always[bool]
    perturbed_reason: Always[str | None]
    headline_source: Always[Literal["unprofiled_run", "run", "trace"]]
    warmup: Always[WarmupSummary]
    stages: Always[list[Stage]]
    ranks: Always[RanksSection | None]
    marks: Always[dict[str, int]]
    """Stage key -> instant marks (``maxinstr.mark``) counted, kept out of ``stages``."""
    startup: Always[list[StartupRow]]
    gpu: Always[GpuSection | None]
    samples: Always[SamplesSummary | None]
    reproduce: Always[list[ReproduceStep]]
    diagnosis: Always[list[Finding]]
    bottlenecks: Always[list[Bottleneck]]
    coverage: Coverage | None
    footprint: Footprint | None
    """What watching cost (estimated): None without a run directory that measured it."""
