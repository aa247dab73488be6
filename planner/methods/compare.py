"""`hydraplan compare`: every method planned on the identical sampled batches, scored by one cost model.

Methods: the baselines of methods/baselines.py (megatron, hotspa, wlb-llm, flexsp; wlb-nodelay is wlb-llm
without its outlier queues, isolating what the delay buys), hydraplan (propose + dispatch + pack with
per-iteration strategy selection) and its Hydraulis Figure 16 ablations (methods/hydra.py), hydraplan-delay to
set against wlb-llm as hydraplan against wlb-nodelay, cad (core-attention disaggregation, solve/cad, DistCA-style)
and hydraplan-cad, which takes per iteration whichever of hydraplan's plan and the CAD plan scores lower.
Static choices ("best scheme") are tuned on the compared batches themselves, the most favourable tuning
a baseline can get, as Hydraulis does by enumerating the competitors' strategies.

Objective: every method is scored end to end with the same docs/formats.md formula on its own schemes and
pipelines (baselines.plan_iteration_s; HotSPa's switching cost stays on top), and with the default
end-to-end objective every static choice (megatron's, wlb-llm's, hotspa's schemes, flexsp's step count,
hetero-static's candidate) and hydraplan's proposal, dispatch and selection minimize that score; with
`objective="propagation"` they minimize the propagation estimate as the paper does. Both are reported.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from hydraplan.core.cluster import Cluster
from hydraplan.core.cost import model_flops
from hydraplan.core.errors import UserError
from hydraplan.core.schedules import simulate_1f1b
from hydraplan.core.schema import CompareResult, MethodResult, Profile, Scheme
from hydraplan.methods import baselines as bl
from hydraplan.methods import megatron_seams as seams
from hydraplan.methods.cad import choose, run_cad
from hydraplan.methods.compare_config import CompareConfig
from hydraplan.methods.hydra import MethodRun, run_hydra, run_hydra_delay
from hydraplan.methods.registry import BY_NAME, NAMES, OPT_IN, of_family
from hydraplan.solve.proposal import propose
from hydraplan.store.datasets import Dataset, load_dataset, sample_iterations
from hydraplan.store.profiles import load_profile

HYDRA_METHODS = of_family("hydra")
BASELINE_METHODS = of_family("baseline")
CAD_METHODS = of_family("cad")  # core-attention disaggregation (hydraplan.solve.cad) and the per-iteration chooser
ALL_METHODS = NAMES  # methods/registry.py: baselines, then hydraplan's, then CAD's
KNOWN_METHODS = ALL_METHODS + OPT_IN  # Megatron's schedulers and the plugin on its seams: run when named
HOTSPA_SHORTLIST = 3  # schemes per length range tried jointly with the switching cost


class CompareProgress(Protocol):
    def start(self, total: int) -> None: ...
    def advance(self, what: str) -> None: ...


@dataclass
class CompareOutcome:
    result: CompareResult
    runs: dict[str, MethodRun]
    batches: list[np.ndarray]
    dataset_lengths: np.ndarray
    cluster: Cluster = field(repr=False)


# -------------------------------------------------------------------------------------------- metrics
@dataclass(frozen=True)
class IterationMetrics:
    estimate_s: float  # propagation (HotSPa: with its switching)
    iteration_s: float  # end to end: plus exposed sync
    sim_s: float
    gap: float
    idle_gpu_s: float
    mfu: float
    tokens: int


def simulated_s(plan: bl.IterationPlan) -> float:
    """Schedule-exact latency: every pipeline's micro-batches through the 1F1B timeline simulator."""
    total = plan.overhead_s
    for ph in plan.phases:
        total += max((simulate_1f1b(p.mb_times, p.scheme.pp).latency_s for p in ph.pipelines if p.mb_times.size),
                     default=0.0)
    return total


def latency_gap(plan: bl.IterationPlan) -> float:
    """(slowest - fastest) / slowest pipeline of each phase, weighted by phase latency (Hydraulis Fig. 15b);
    a pipeline with no work counts as 0 s, so idle pipelines show as a gap of 1."""
    num = den = 0.0
    for ph in plan.phases:
        lat = np.array([p.latency_s for p in ph.pipelines])
        if lat.size and lat.max() > 0:
            num += lat.max() - lat.min()
            den += lat.max()
    return num / den if den > 0 else 0.0


def busy_gpu_s(plan: bl.IterationPlan) -> float:
    return float(sum(p.scheme.gpus * p.mb_times.sum() for ph in plan.phases for p in ph.pipelines))


def iteration_metrics(plan: bl.IterationPlan, cluster: Cluster, peak_flops: float) -> IterationMetrics:
    """Idle GPU-seconds and MFU are over the iteration's time in the objective (exposed sync is idle time)."""
    est = plan.estimate_s
    e2e = bl.plan_iteration_s(plan, cluster)
    t = cluster.score(est, e2e)
    gpus = cluster.gpus
    flops = float(model_flops(cluster.profile.model, plan.lengths).sum())
    return IterationMetrics(
        estimate_s=est,
        iteration_s=e2e,
        sim_s=simulated_s(plan),
        gap=latency_gap(plan),
        idle_gpu_s=gpus * t - busy_gpu_s(plan),
        mfu=flops / (gpus * peak_flops * t) if t > 0 else 0.0,
        tokens=int(plan.lengths.sum()),
    )


# -------------------------------------------------------------------------------------------- methods
Score = Callable[[bl.IterationPlan], float]


def run_megatron(batches: list[np.ndarray], cluster: Cluster, context_len: int, score: Score | None = None
                 ) -> tuple[Scheme, list[bl.IterationPlan]]:
    gpus = cluster.gpus
    return bl.best_static(bl.holding(cluster.schemes, context_len, gpus),
                          lambda s: [bl.megatron(b, s, gpus, context_len) for b in batches], "megatron", score)


def run_hotspa(batches: list[np.ndarray], cluster: Cluster, context_len: int, switch: bl.SwitchModel,
               score: Score | None = None) -> list[bl.IterationPlan]:
    """One homogeneous scheme per length range, chosen jointly with the switching cost: per range the
    HOTSPA_SHORTLIST fastest schemes on its sequences, plus those of the longest range and the fastest on
    all ranges together (these hold every range, so one scheme for all, i.e. no switching, is always an
    option); the combination with the lowest total time over the batches wins (with `score`: the lowest
    total score of its plans, e.g. end to end). Ranges chosen one by one would switch even when switching
    costs more than it saves."""
    ranges = bl.hotspa_ranges(context_len)
    masks = [[(b > lo) & (b <= hi) for b in batches] for lo, hi in ranges]
    times: list[dict[tuple[int, int, int, str], float]] = []  # per range: scheme key -> total phase time
    phases: list[dict[tuple[int, int, int, str], list[bl.Phase]]] = []  # per range: scheme key -> phase per batch
    gpus = cluster.gpus
    by_key = {s.key: s for s in cluster.schemes}
    for (lo, hi), mask in zip(ranges, masks, strict=True):
        cands = bl.holding(cluster.schemes, hi, gpus)
        if not cands:
            raise UserError(f"context_len too long for hotspa: no scheme holds the range ({lo},{hi}]", "context_len")
        phases.append({s.key: [bl.megatron_phase(b, s, gpus, np.flatnonzero(m), capacity=hi)
                               for b, m in zip(batches, mask, strict=True)] for s in cands})
        times.append({k: sum(ph.latency_s for ph in v) for k, v in phases[-1].items()})
    top = [sorted(t, key=lambda k: (t[k], by_key[k].gpus))[:HOTSPA_SHORTLIST] for t in times]
    # ranges[0] is the longest: its schemes hold every range; the fastest of them over all ranges together
    overall = sorted(times[0], key=lambda k: (sum(t[k] for t in times), by_key[k].gpus))[:HOTSPA_SHORTLIST]
    shortlists = [list(dict.fromkeys(top[r] + top[0] + overall)) for r in range(len(ranges))]
    present = [[bool(masks[r][i].any()) for r in range(len(ranges))] for i in range(len(batches))]

    def total(combo: tuple[tuple[int, int, int, str], ...]) -> float:
        if score is not None:  # the plans hotspa() makes for this combination, from the cached phases
            return sum(score(bl.IterationPlan("hotspa", "", b, tuple(phases[r][k][i] for r, k in enumerate(combo) if here[r]),
                                              overhead_s=bl.switch_overhead([by_key[k] for k, p in zip(combo, here) if p],
                                                                            switch)))
                       for i, (b, here) in enumerate(zip(batches, present, strict=True)))
        switching = sum(bl.switch_overhead([by_key[k] for k, p in zip(combo, here, strict=True) if p], switch)
                        for here in present)
        return sum(t[k] for t, k in zip(times, combo, strict=True)) + switching

    best = min(itertools.product(*shortlists), key=lambda c: (total(c), sum(by_key[k].gpus for k in c)))
    choice = [(r, by_key[k]) for r, k in zip(ranges, best, strict=True)]
    return [bl.hotspa(b, choice, gpus, switch) for b in batches]


def run_wlb(batches: list[np.ndarray], cluster: Cluster, context_len: int, tokens_per_iter: int,
            queues: int, score: Score | None = None) -> list[bl.IterationPlan]:
    """Micro-batches per iteration as a fixed-length loader would make them (tokens / context length,
    rounded up to a multiple of the pipelines); outlier thresholds from wlb_thresholds."""
    gpus = cluster.gpus

    def run(s: Scheme) -> list[bl.IterationPlan]:
        d = gpus // s.gpus
        per_pipe = max(1, -(-tokens_per_iter // (d * context_len)))
        thresholds = bl.wlb_thresholds(tokens_per_iter, d * per_pipe, queues)
        return bl.wlb_llm(batches, s, gpus, per_pipe, thresholds)

    return bl.best_static(bl.holding(cluster.schemes, context_len, gpus), run, "wlb-llm", score)[1]


# -------------------------------------------------------------------------------------------- driver
def summarize(run: MethodRun, cluster: Cluster, peak_flops: float) -> MethodResult:
    ms = [iteration_metrics(p, cluster, peak_flops) for p in run.plans]
    est = [m.estimate_s for m in ms]
    e2e = [m.iteration_s for m in ms]
    sync = [max(0.0, e - p) for e, p in zip(e2e, est, strict=True)]
    timed = [cluster.score(p, e) for p, e in zip(est, e2e, strict=True)]
    out = MethodResult(
        description=BY_NAME[run.name].description,
        mean_estimate_s=float(np.mean(est)),
        iterations_s=est,
        mean_iteration_s=float(np.mean(e2e)),
        iteration_s=e2e,
        mean_sync_s=float(np.mean(sync)),
        sync_s=sync,
        mean_sim_s=float(np.mean([m.sim_s for m in ms])),
        sim_iterations_s=[m.sim_s for m in ms],
        strategies=[p.strategy for p in run.plans],
        strategy_labels=run.labels,
        gap=[m.gap for m in ms],
        idle_gpu_s=[m.idle_gpu_s for m in ms],
        mfu=[m.mfu for m in ms],
        tokens=[m.tokens for m in ms],
        overhead_s=[p.overhead_s for p in run.plans],
        tokens_per_s=float(sum(m.tokens for m in ms) / sum(timed)) if sum(timed) > 0 else None,
    )
    if run.name in ("wlb-llm", "wlb-nodelay"):
        out.imbalance = [float(p.imbalance) for p in run.plans if p.imbalance is not None]
    if BY_NAME[run.name].reports_delay:
        trained = sum(m.tokens for m in ms)
        out.avg_delay_iters_per_token = float(sum(p.delayed_token_iters for p in run.plans) / trained) if trained else 0.0
    return out


def peak_flops_of(profile: Profile) -> float:
    if profile.gpu.peak_tflops is None:
        raise UserError(f"profile {profile.name}: field gpu.peak_tflops: missing, needed to compute MFU")
    return profile.gpu.peak_tflops * 1e12


@dataclass(frozen=True)
class _Setup:
    """What every method of one compare run shares: the cluster view, the batches, the static choices' score."""

    config: CompareConfig
    cluster: Cluster
    dataset: Dataset
    context_len: int
    batches: list[np.ndarray]
    score: Score


def _setup(config: CompareConfig) -> _Setup:
    methods = config.methods or ALL_METHODS
    unknown = [m for m in methods if m not in KNOWN_METHODS]
    if unknown:
        raise UserError(f"methods: unknown method {unknown[0]!r} (choose from {', '.join(KNOWN_METHODS)})", "methods")
    cluster = Cluster.of(load_profile(config.profile), config.gpus, config.objective)
    dataset = load_dataset(config.dataset, config.context_len)
    context_len = config.context_len or int(dataset.lengths.max())
    longest = max(s.max_len for s in cluster.schemes)
    if context_len > longest:
        raise UserError(f"context_len {context_len}: no scheme of profile {cluster.name} within {config.gpus} GPUs "
                        f"holds it (the longest MaxLen is {longest})", "context_len")
    batches = [np.asarray(b.lengths, dtype=np.int64)
               for b in sample_iterations(dataset, config.tokens_per_iter, config.iterations, config.seed)]
    return _Setup(config, cluster, dataset, context_len, batches, bl.objective_score(cluster))


def _static(run: MethodRun) -> MethodRun:
    """A baseline that keeps one strategy for every iteration: the first plan's."""
    run.static = run.static or run.plans[0].strategy
    return run


def _megatron(m: str, su: _Setup, homo_label: str, mega: list[bl.IterationPlan]) -> MethodRun:
    return MethodRun(m, mega, homo_label)


def _hotspa(m: str, su: _Setup, homo_label: str, mega: list[bl.IterationPlan]) -> MethodRun:
    switch = bl.SwitchModel(bl.model_param_bytes(su.cluster.profile.model), su.config.switch_bandwidth_gbs * 1e9)
    return _static(MethodRun(m, run_hotspa(su.batches, su.cluster, su.context_len, switch, su.score)))


def _wlb(m: str, su: _Setup, homo_label: str, mega: list[bl.IterationPlan]) -> MethodRun:
    queues = su.config.wlb_queues if m == "wlb-llm" else 0
    return _static(MethodRun(m, run_wlb(su.batches, su.cluster, su.context_len, su.config.tokens_per_iter, queues,
                                        su.score)))


def _flexsp(m: str, su: _Setup, homo_label: str, mega: list[bl.IterationPlan]) -> MethodRun:
    """A strategy per iteration (no static one)."""
    try:
        return MethodRun(m, [bl.flexsp(b, su.cluster.schemes, su.cluster.gpus, score=su.score) for b in su.batches])
    except ValueError as e:
        raise UserError(f"methods flexsp: {e}", "methods") from None


# how each baseline of methods/registry.py plans the batches (megatron's plans are made once, for the others too)
BASELINE_RUNS: dict[str, Callable[[str, _Setup, str, list[bl.IterationPlan]], MethodRun]] = {
    "megatron": _megatron, "hotspa": _hotspa, "wlb-llm": _wlb, "wlb-nodelay": _wlb, "flexsp": _flexsp}




def run_compare(config: CompareConfig, progress: CompareProgress | None = None) -> CompareOutcome:
    """Every chosen method on the same sampled batches, scored by one cost model (module docstring)."""
    su = _setup(config)
    methods = [m for m in KNOWN_METHODS if m in (config.methods or ALL_METHODS)]
    hydra = [m for m in methods if m in HYDRA_METHODS]
    if "hydraplan-cad" in methods and "hydraplan" not in hydra:  # the chooser needs hydraplan's plans
        hydra.append("hydraplan")
    solved = int(bool(set(hydra) - {"hydraplan-delay"})) + int("hydraplan-delay" in hydra)  # passes over the batches
    total = len([m for m in methods if m not in HYDRA_METHODS]) + solved * config.iterations + len(methods)
    if progress is not None:
        progress.start(total)
    tick = progress.advance if progress is not None else (lambda what: None)

    homo, mega = run_megatron(su.batches, su.cluster, su.context_len, su.score)
    homo_label = f"{homo.label}x{config.gpus // homo.gpus}"
    runs: dict[str, MethodRun] = {}
    for m in (m for m in methods if m in BASELINE_METHODS):
        runs[m] = BASELINE_RUNS[m](m, su, homo_label, mega)
        tick(m)
    runs.update(_hydra_runs(su, homo, hydra, methods, runs, tick))
    chosen = [m for m in methods if m in seams.SEAM_METHODS]
    for m, (choice, plans) in seams.seam_runs(chosen, su.batches, su.cluster, su.context_len, su.score).items():
        runs[m] = MethodRun(m, plans, choice)
        tick(m)
    results = {}
    for m in methods:
        if m in runs:
            results[m] = summarize(runs[m], su.cluster, peak_flops_of(su.cluster.profile))
        tick(f"metrics {m}")
    _speedups(results, su.cluster)
    result = CompareResult(
        profile=su.cluster.name, dataset=su.dataset.name, gpus=config.gpus, context_len=su.context_len,
        tokens_per_iter=config.tokens_per_iter, iterations=config.iterations, seed=config.seed, methods=results,
        notes=_notes(runs, results, config, su.cluster, su.context_len), objective=su.cluster.objective,
    )
    return CompareOutcome(result, runs, su.batches, np.asarray(su.dataset.lengths), su.cluster)


def _hydra_runs(su: _Setup, homo: Scheme, hydra: list[str], methods: list[str], runs: dict[str, MethodRun],
                tick: Callable[[str], None]) -> dict[str, MethodRun]:
    """hydraplan, its ablations, hydraplan-delay (one proposal for both) and the CAD methods."""
    out: dict[str, MethodRun] = {}
    proposed = (propose(su.cluster, su.dataset,
                        su.context_len, tokens_per_iter=su.config.tokens_per_iter) if hydra else None)
    if proposed is not None and set(hydra) - {"hydraplan-delay"}:
        out.update(run_hydra(su.batches, su.cluster, proposed, su.context_len, su.config.seed, homo, hydra, tick))
    if set(methods) & set(CAD_METHODS):
        cad_plans = run_cad(su.batches, su.cluster)
        if "cad" in methods:
            out["cad"] = MethodRun("cad", cad_plans, "cad")
            tick("cad")
        if "hydraplan-cad" in methods:
            out["hydraplan-cad"] = MethodRun("hydraplan-cad", choose(su.score, out["hydraplan"].plans, cad_plans),
                                             "dynamic", out["hydraplan"].labels)
            tick("hydraplan-cad")
    if proposed is not None and "hydraplan-delay" in hydra:
        out["hydraplan-delay"] = run_hydra_delay(su.batches, su.cluster, proposed, np.asarray(su.dataset.lengths),
                                                 su.context_len, su.config.tokens_per_iter, su.config.seed, homo, tick)
    return out


def _speedups(results: dict[str, MethodResult], cluster: Cluster) -> None:
    if "megatron" not in results:
        return
    base, base_e2e = results["megatron"].mean_estimate_s, results["megatron"].mean_iteration_s
    for r in results.values():
        r.propagation_speedup_vs_megatron = base / r.mean_estimate_s if r.mean_estimate_s > 0 else None
        r.end_to_end_speedup_vs_megatron = base_e2e / r.mean_iteration_s if base_e2e is not None and r.mean_iteration_s else None
        r.speedup_vs_megatron = cluster.ranked(r.propagation_speedup_vs_megatron, r.end_to_end_speedup_vs_megatron)


def most_common(items: Sequence[str]) -> str:
    return Counter(items).most_common(1)[0][0] if items else ""


def _notes(runs: dict[str, MethodRun], results: dict[str, MethodResult], config: CompareConfig, cluster: Cluster,
           context_len: int) -> dict[str, str]:
    notes = {m: f"static strategy {r.static}" + (f" = {r.labels[r.static]}" if r.static in r.labels else "")
             for m, r in runs.items() if r.static and r.static != "dynamic"}
    notes.update({m: r.note for m, r in runs.items() if r.note})
    diffs = {m: float(np.mean(np.array(r.sim_iterations_s) / np.array(r.iterations_s)) - 1.0)
             for m, r in results.items() if r.sim_iterations_s}
    notes["simulator"] = (
        "closed form = sum_v T(m_v) + (pp-1) max_v T(m_v); the 1F1B simulator (F = T/3, B = 2T/3) equals it "
        "for uniform micro-batches and pp = 1, and differs when micro-batch times vary under pp > 1; mean "
        "sim/closed - 1 per method: " + ", ".join(f"{m} {d:+.2%}" for m, d in diffs.items()))
    notes["objective"] = (
        f"{cluster.objective}: static choices and hydraplan minimize the {cluster.objective} estimate; end to end = "
        "propagation + exposed LNK pull/push of the docs/formats.md formula, each method on its own "
        "schemes (phases in sequence pull once before the first and push once after the last; HotSPa's switching "
        "on top); speedup_vs_megatron is in the objective")
    if "hotspa" in runs:
        notes["hotspa"] += (f"; switch cost per switch = (param_bytes/pp_old + param_bytes/pp_new) / "
                           f"{config.switch_bandwidth_gbs:g} GB/s, bf16 weights and gradients; ranges "
                           + ", ".join(f"({lo},{hi}]" for lo, hi in bl.hotspa_ranges(context_len)))
    return notes
