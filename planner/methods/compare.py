"""`hydraplan compare`: every method planned on the identical sampled batches, scored by one cost model.

Methods: the baselines of hydraplan.baselines (megatron, hotspa, wlb-llm, flexsp; wlb-nodelay is wlb-llm
without its outlier queues, isolating what the delay buys), hydraplan (propose + dispatch + pack with
per-iteration strategy selection) and its Hydraulis Figure 16 ablations:
(a) homo-maxlen: the static homogeneous scheme, Eq. 3 dispatch, max-length (FFD) packing;
(b) homo-pack:   the same with Eq. 1 packing;
(c) hetero-static: the best single heterogeneous proposal candidate that holds the context length;
(d) hydraplan:   full dynamic selection among the candidates (plus the homogeneous one, so (d) <= (b)).
hydraplan-delay is (d) on the batches after hydraplan's outlier delay (hydraplan.delay), to set against wlb-llm
as hydraplan against wlb-nodelay. cad is core-attention disaggregation (hydraplan.cad, DistCA-style) and
hydraplan-cad takes, per iteration, whichever of hydraplan's plan and the CAD plan is faster end to end.
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

from hydraplan.core.cluster import for_gpus
from hydraplan.core.cost import model_flops
from hydraplan.core.errors import UserError
from hydraplan.core.schedules import simulate_1f1b
from hydraplan.core.schema import Candidate, CompareResult, MethodResult, PipelineSpec, Profile, Scheme, Strategies
from hydraplan.core.sync import Objective, check_objective
from hydraplan.methods import baselines as bl
from hydraplan.store.profiles import load_profile

HYDRA_METHODS = ("homo-maxlen", "homo-pack", "hetero-static", "hydraplan", "hydraplan-delay")
BASELINE_METHODS = ("megatron", "hotspa", "wlb-llm", "wlb-nodelay", "flexsp")
CAD_METHODS = ("cad", "hydraplan-cad")  # core-attention disaggregation (hydraplan.cad) and the per-iteration chooser
ALL_METHODS = BASELINE_METHODS + HYDRA_METHODS + CAD_METHODS
DESCRIPTIONS = {
    "megatron": "static homogeneous scheme, FFD packing to the context length, micro-batches dealt round-robin",
    "hotspa": "one homogeneous scheme per length range (<4K, 4K-16K, 16K+), switched within the iteration",
    "wlb-llm": "static homogeneous scheme, var-len packing with 2-level outlier delay queues",
    "wlb-nodelay": "wlb-llm without the outlier queues: var-len packing of each iteration's own batch",
    "flexsp": "sorted sequences chunked into memory-balanced steps (Eq. 23-24), flexible pp=1 groups",
    "homo-maxlen": "ablation (a): static homogeneous scheme, Eq. 3 dispatch, max-length packing",
    "homo-pack": "ablation (b): static homogeneous scheme, Eq. 3 dispatch, Eq. 1 packing",
    "hetero-static": "ablation (c): best static heterogeneous candidate holding the context length",
    "hydraplan": "propose + dispatch + pack, strategy chosen per iteration",
    "hydraplan-delay": "hydraplan on batches whose long outliers are queued and released in one-iteration groups",
    "cad": "core-attention disaggregation (DistCA-style): homogeneous cp=1 replicas, token-balanced linear part, "
           "attention tasks balanced across replicas under a communication budget",
    "hydraplan-cad": "per iteration, the faster (in the objective) of hydraplan's plan and the CAD plan",
}
DELAYING = ("wlb-llm", "wlb-nodelay", "hydraplan-delay")
HOMO_NAME = "homo"
HOTSPA_SHORTLIST = 3  # schemes per length range tried jointly with the switching cost


@dataclass(frozen=True)
class CompareOptions:
    profile: str
    dataset: str
    gpus: int
    tokens_per_iter: int
    iterations: int
    seed: int = 0
    context_len: int | None = None
    methods: tuple[str, ...] = ALL_METHODS
    wlb_queues: int = 2
    switch_bandwidth_gbs: float = 50.0
    objective: Objective = "end-to-end"


class CompareProgress(Protocol):
    def start(self, total: int) -> None: ...
    def advance(self, what: str) -> None: ...


@dataclass
class MethodRun:
    name: str
    plans: list[bl.IterationPlan]
    static: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    note: str = ""


@dataclass
class CompareOutcome:
    result: CompareResult
    runs: dict[str, MethodRun]
    batches: list[np.ndarray]
    dataset_lengths: np.ndarray
    view: Profile = field(repr=False)


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


def iteration_metrics(plan: bl.IterationPlan, gpus: int, view: Profile, peak_flops: float,
                      objective: Objective = "propagation") -> IterationMetrics:
    """Idle GPU-seconds and MFU are over the iteration's time in the objective (exposed sync is idle time)."""
    est = plan.estimate_s
    e2e = bl.plan_iteration_s(plan, view, gpus)
    t = e2e if objective == "end-to-end" else est
    flops = float(model_flops(view.model, plan.lengths).sum())
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


def run_megatron(batches: list[np.ndarray], view: Profile, gpus: int, context_len: int, score: Score | None = None
                 ) -> tuple[Scheme, list[bl.IterationPlan]]:
    return bl.best_static(bl.holding(view.schemes, context_len, gpus),
                          lambda s: [bl.megatron(b, s, gpus, context_len) for b in batches], "megatron", score)


def run_hotspa(batches: list[np.ndarray], view: Profile, gpus: int, context_len: int, switch: bl.SwitchModel,
               score: Score | None = None) -> list[bl.IterationPlan]:
    """One homogeneous scheme per length range, chosen jointly with the switching cost: per range the
    HOTSPA_SHORTLIST fastest schemes on its sequences, plus those of the longest range and the fastest on
    all ranges together (these hold every range, so one scheme for all, i.e. no switching, is always an
    option); the combination with the lowest total time over the batches wins (with `score`: the lowest
    total score of its plans, e.g. end to end). Ranges chosen one by one would switch even when switching
    costs more than it saves."""
    ranges = bl.hotspa_ranges(context_len)
    masks = [[(b > lo) & (b <= hi) for b in batches] for lo, hi in ranges]
    times: list[dict[tuple[int, int, int], float]] = []  # per range: scheme key -> total phase time
    phases: list[dict[tuple[int, int, int], list[bl.Phase]]] = []  # per range: scheme key -> phase per batch
    by_key = {s.key: s for s in view.schemes}
    for (lo, hi), mask in zip(ranges, masks, strict=True):
        cands = bl.holding(view.schemes, hi, gpus)
        if not cands:
            raise UserError(f"hotspa: no scheme holds the range ({lo},{hi}]; lower --context-len")
        phases.append({s.key: [bl.megatron_phase(b, s, gpus, np.flatnonzero(m), capacity=hi)
                               for b, m in zip(batches, mask, strict=True)] for s in cands})
        times.append({k: sum(ph.latency_s for ph in v) for k, v in phases[-1].items()})
    top = [sorted(t, key=lambda k: (t[k], by_key[k].gpus))[:HOTSPA_SHORTLIST] for t in times]
    # ranges[0] is the longest: its schemes hold every range; the fastest of them over all ranges together
    overall = sorted(times[0], key=lambda k: (sum(t[k] for t in times), by_key[k].gpus))[:HOTSPA_SHORTLIST]
    shortlists = [list(dict.fromkeys(top[r] + top[0] + overall)) for r in range(len(ranges))]
    present = [[bool(masks[r][i].any()) for r in range(len(ranges))] for i in range(len(batches))]

    def total(combo: tuple[tuple[int, int, int], ...]) -> float:
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


def run_wlb(batches: list[np.ndarray], view: Profile, gpus: int, context_len: int, tokens_per_iter: int,
            queues: int, score: Score | None = None) -> list[bl.IterationPlan]:
    """Micro-batches per iteration as a fixed-length loader would make them (tokens / context length,
    rounded up to a multiple of the pipelines); outlier thresholds from wlb_thresholds."""
    def run(s: Scheme) -> list[bl.IterationPlan]:
        d = gpus // s.gpus
        per_pipe = max(1, -(-tokens_per_iter // (d * context_len)))
        thresholds = bl.wlb_thresholds(tokens_per_iter, d * per_pipe, queues)
        return bl.wlb_llm(batches, s, gpus, per_pipe, thresholds)

    return bl.best_static(bl.holding(view.schemes, context_len, gpus), run, "wlb-llm", score)[1]


def homo_candidate(scheme: Scheme, gpus: int) -> Candidate:
    spec = PipelineSpec(tp=scheme.tp, pp=scheme.pp, cp=scheme.cp)
    return Candidate(name=HOMO_NAME, pipelines=[spec] * (gpus // scheme.gpus))


def _from_solution(name: str, schemes: Sequence[Scheme], lengths: np.ndarray, groups: Sequence[Sequence[np.ndarray]],
                   gpus: int) -> bl.IterationPlan:
    pipes = tuple(bl.run_pipeline(s, lengths, mbs) for s, mbs in zip(schemes, groups, strict=True))
    used = sum(s.gpus for s in schemes)
    return bl.IterationPlan(name, "", lengths, (bl.Phase(name, pipes, gpus - used),))


def run_hydra(batches: list[np.ndarray], profile: Profile, dataset: object, gpus: int, context_len: int,
              tokens_per_iter: int, seed: int, homo: Scheme, methods: Sequence[str], advance: Callable[[str], None],
              objective: Objective = "end-to-end") -> dict[str, MethodRun]:
    """Solve every candidate on every batch exactly as Planner.solve does (same per-iteration seed), then
    read the ablations off the same solutions so they are comparable iteration by iteration. homo-maxlen
    re-packs the homogeneous candidate's own dispatch with FFD, so (a) and (b) differ only in packing."""
    from hydraplan.engine.planner import Planner, solve_candidate, solver_seed
    from hydraplan.solve.proposal import propose, strategy_label

    proposed = propose(profile, dataset, gpus, context_len, tokens_per_iter=tokens_per_iter, objective=objective)
    strategies = Strategies(candidates=[*proposed.candidates, homo_candidate(homo, gpus)], context_len=context_len)
    planner = Planner(profile, strategies, gpus, seed=seed, context_len=context_len, objective=objective)
    score = bl.objective_score(profile, gpus, objective)
    cands = planner.candidates
    labels = {c.name: strategy_label(c) for c in planner.strategies.candidates}
    per_cand: dict[str, list[bl.IterationPlan | None]] = {c.name: [] for c in cands}
    homo_maxlen: list[bl.IterationPlan] = []
    for it, lengths in enumerate(batches):
        s = solver_seed(seed, it)
        for c in cands:
            sol = solve_candidate(c, lengths, method=planner.dispatch, seed=s,
                                  dispatch_kwargs=planner.dispatch_kwargs, pack_kwargs=planner.pack_kwargs,
                                  pack_budget_s=planner.pack_budget_s / len(cands))
            if sol.pipelines is None:
                per_cand[c.name].append(None)
                continue
            per_cand[c.name].append(_from_solution(c.name, c.schemes, lengths, [p.micro_batches for p in sol.pipelines], gpus))
            if c.name == HOMO_NAME:
                owned = [np.concatenate(p.micro_batches) if p.micro_batches else np.zeros(0, np.int64) for p in sol.pipelines]
                groups = [[idx[b] for b in bl.ffd(lengths[idx], sch.max_len)] for idx, sch in zip(owned, c.schemes)]
                homo_maxlen.append(_from_solution("homo-maxlen", c.schemes, lengths, groups, gpus))
        advance("hydraplan")
    complete = {name: [p for p in plans if p is not None] for name, plans in per_cand.items()
                if all(p is not None for p in plans)}

    def named(plans: list[bl.IterationPlan], method: str, strategy: str | None = None) -> list[bl.IterationPlan]:
        return [bl.IterationPlan(method, strategy or p.method, p.lengths, p.phases) for p in plans]

    homo_label = f"{homo.label}x{gpus // homo.gpus}"
    runs = {
        "homo-maxlen": MethodRun("homo-maxlen", named(homo_maxlen, "homo-maxlen", homo_label), homo_label),
        "homo-pack": MethodRun("homo-pack", named(complete[HOMO_NAME], "homo-pack", homo_label), homo_label),
    }
    static = [c for c in cands if c.name != HOMO_NAME and c.name in complete and c.max_len >= context_len]
    hetero = [c for c in static if len({s.key for s in c.schemes}) > 1] or static
    if hetero:
        best = min(hetero, key=lambda c: np.mean([score(p) for p in complete[c.name]]))
        runs["hetero-static"] = MethodRun("hetero-static", named(complete[best.name], "hetero-static"), best.name)
    dynamic = []
    for it in range(len(batches)):
        feasible = [(score(p), k, p) for k, c in enumerate(cands) if (p := per_cand[c.name][it]) is not None]
        dynamic.append(min(feasible, key=lambda x: (x[0], x[1]))[2])
    runs["hydraplan"] = MethodRun("hydraplan", named(dynamic, "hydraplan"), "dynamic")
    for run in runs.values():
        run.labels = {s: labels[s] for s in {p.strategy for p in run.plans} | {run.static} if s in labels}
    return {k: v for k, v in runs.items() if k in methods}


def run_hydra_delay(batches: list[np.ndarray], profile: Profile, dataset: object, gpus: int, context_len: int,
                    tokens_per_iter: int, seed: int, homo: Scheme, advance: Callable[[str], None],
                    objective: Objective = "end-to-end") -> MethodRun:
    """hydraplan, planned exactly as run_hydra does, on the batches after hydraplan's outlier delay (drained
    by the last iteration, so it trains exactly the sampled sequences)."""
    from hydraplan.solve.delay import hydraplan_rule, outlier_delay, stream_batches

    rule = hydraplan_rule(np.asarray(dataset.lengths), tokens_per_iter)  # type: ignore[attr-defined]
    delayed = list(outlier_delay(stream_batches(batches), rule, len(batches)))
    run = run_hydra([d.lengths for d in delayed], profile, dataset, gpus, context_len, tokens_per_iter, seed, homo,
                    ("hydraplan",), advance, objective)["hydraplan"]
    plans = [bl.IterationPlan("hydraplan-delay", p.strategy, p.lengths, p.phases, delayed_token_iters=d.delayed_token_iters)
             for p, d in zip(run.plans, delayed, strict=True)]
    note = (f"outliers: sequences longer than {rule.thresholds[0]} tokens (under one per iteration in the dataset); "
            f"released together once they hold {rule.tokens} tokens, or after {rule.max_wait} iterations")
    return MethodRun("hydraplan-delay", plans, run.static, run.labels, note)


# -------------------------------------------------------------------------------------------- driver
def summarize(run: MethodRun, gpus: int, view: Profile, peak_flops: float,
              objective: Objective = "propagation") -> MethodResult:
    ms = [iteration_metrics(p, gpus, view, peak_flops, objective) for p in run.plans]
    est = [m.estimate_s for m in ms]
    e2e = [m.iteration_s for m in ms]
    sync = [max(0.0, e - p) for e, p in zip(e2e, est, strict=True)]
    timed = e2e if objective == "end-to-end" else est
    out = MethodResult(
        description=DESCRIPTIONS[run.name],
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
    if run.name in DELAYING:
        trained = sum(m.tokens for m in ms)
        out.avg_delay_iters_per_token = float(sum(p.delayed_token_iters for p in run.plans) / trained) if trained else 0.0
    return out


def peak_flops_of(view: Profile) -> float:
    if view.gpu.peak_tflops is None:
        raise UserError(f"profile {view.name}: field gpu.peak_tflops: missing, needed to compute MFU")
    return view.gpu.peak_tflops * 1e12


def run_compare(opts: CompareOptions, progress: CompareProgress | None = None) -> CompareOutcome:
    from hydraplan.store.datasets import load_dataset, sample_iterations

    unknown = [m for m in opts.methods if m not in ALL_METHODS]
    if unknown:
        raise UserError(f"--methods: unknown method {unknown[0]!r} (choose from {', '.join(ALL_METHODS)})")
    if opts.iterations < 1 or opts.tokens_per_iter < 1:
        raise UserError(f"--iterations and --tokens-per-iter must be positive (got {opts.iterations}, {opts.tokens_per_iter})")
    check_objective(opts.objective)
    profile = load_profile(opts.profile)
    view = for_gpus(profile, opts.gpus)
    dataset = load_dataset(opts.dataset, opts.context_len)
    context_len = opts.context_len or int(dataset.lengths.max())
    longest = max(s.max_len for s in view.schemes)
    if context_len > longest:
        raise UserError(f"--context-len {context_len}: no scheme of profile {profile.name} within {opts.gpus} GPUs "
                        f"holds it (the longest MaxLen is {longest}); pass a smaller --context-len")
    batches = [np.asarray(b.lengths, dtype=np.int64)
               for b in sample_iterations(dataset, opts.tokens_per_iter, opts.iterations, opts.seed)]
    peak = peak_flops_of(view)
    methods = [m for m in ALL_METHODS if m in opts.methods]
    hydra = [m for m in methods if m in HYDRA_METHODS]
    if "hydraplan-cad" in methods and "hydraplan" not in hydra:  # the chooser needs hydraplan's plans
        hydra.append("hydraplan")
    solved = int(bool(set(hydra) - {"hydraplan-delay"})) + int("hydraplan-delay" in hydra)  # passes over the batches
    total = len([m for m in methods if m not in HYDRA_METHODS]) + solved * opts.iterations + len(methods)
    if progress is not None:
        progress.start(total)
    tick = progress.advance if progress is not None else (lambda what: None)

    score = bl.objective_score(profile, opts.gpus, opts.objective)
    homo, mega = run_megatron(batches, view, opts.gpus, context_len, score)
    runs: dict[str, MethodRun] = {}
    homo_label = f"{homo.label}x{opts.gpus // homo.gpus}"
    for m in methods:
        if m == "megatron":
            runs[m] = MethodRun(m, mega, homo_label)
        elif m == "hotspa":
            switch = bl.SwitchModel(bl.model_param_bytes(view.model),
                                    opts.switch_bandwidth_gbs * 1e9)
            runs[m] = MethodRun(m, run_hotspa(batches, view, opts.gpus, context_len, switch, score))
        elif m in ("wlb-llm", "wlb-nodelay"):
            queues = opts.wlb_queues if m == "wlb-llm" else 0
            runs[m] = MethodRun(m, run_wlb(batches, view, opts.gpus, context_len, opts.tokens_per_iter, queues, score))
        elif m == "flexsp":
            try:
                runs[m] = MethodRun(m, [bl.flexsp(b, view.schemes, opts.gpus, score=score) for b in batches])
            except ValueError as e:
                raise UserError(f"--methods flexsp: {e}") from None
        else:
            continue
        if m != "flexsp":  # the others keep one strategy for every iteration
            runs[m].static = runs[m].static or runs[m].plans[0].strategy
        tick(m)
    if set(hydra) - {"hydraplan-delay"}:
        runs.update(run_hydra(batches, profile, dataset, opts.gpus, context_len, opts.tokens_per_iter, opts.seed, homo,
                              hydra, tick, opts.objective))
    if set(methods) & set(CAD_METHODS):
        from hydraplan.methods.cad import choose, run_cad

        cad_plans = run_cad(batches, profile, view, opts.gpus)
        if "cad" in methods:
            runs["cad"] = MethodRun("cad", cad_plans, "cad")
            tick("cad")
        if "hydraplan-cad" in methods:
            runs["hydraplan-cad"] = MethodRun("hydraplan-cad", choose(score, runs["hydraplan"].plans, cad_plans),
                                              "dynamic", runs["hydraplan"].labels)
            tick("hydraplan-cad")
    if "hydraplan-delay" in hydra:
        runs["hydraplan-delay"] = run_hydra_delay(batches, profile, dataset, opts.gpus, context_len, opts.tokens_per_iter,
                                                  opts.seed, homo, tick, opts.objective)
    results: dict[str, MethodResult] = {}
    for m in methods:
        if m in runs:
            results[m] = summarize(runs[m], opts.gpus, view, peak, opts.objective)
        tick(f"metrics {m}")
    if "megatron" in results:
        base, base_e2e = results["megatron"].mean_estimate_s, results["megatron"].mean_iteration_s
        for r in results.values():
            r.propagation_speedup_vs_megatron = base / r.mean_estimate_s if r.mean_estimate_s > 0 else None
            r.end_to_end_speedup_vs_megatron = base_e2e / r.mean_iteration_s if r.mean_iteration_s else None
            r.speedup_vs_megatron = (r.end_to_end_speedup_vs_megatron if opts.objective == "end-to-end"
                                     else r.propagation_speedup_vs_megatron)
    result = CompareResult(
        profile=profile.name, dataset=dataset.name, gpus=opts.gpus, context_len=context_len,
        tokens_per_iter=opts.tokens_per_iter, iterations=opts.iterations, seed=opts.seed, methods=results,
        notes=_notes(runs, results, opts, context_len), objective=opts.objective,
    )
    return CompareOutcome(result, runs, batches, np.asarray(dataset.lengths), view)


def most_common(items: Sequence[str]) -> str:
    return Counter(items).most_common(1)[0][0] if items else ""


def _notes(runs: dict[str, MethodRun], results: dict[str, MethodResult], opts: CompareOptions,
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
        f"{opts.objective}: static choices and hydraplan minimize "
        + ("the end-to-end estimate" if opts.objective == "end-to-end" else "the propagation estimate")
        + "; end to end = propagation + exposed LNK pull/push of the docs/formats.md formula, each method on its own "
        "schemes (phases in sequence pull once before the first and push once after the last; HotSPa's switching "
        "on top); speedup_vs_megatron is in the objective")
    if "hotspa" in runs:
        notes["hotspa"] += (f"; switch cost per switch = (param_bytes/pp_old + param_bytes/pp_new) / "
                           f"{opts.switch_bandwidth_gbs:g} GB/s, bf16 weights and gradients; ranges "
                           + ", ".join(f"({lo},{hi}]" for lo, hi in bl.hotspa_ranges(context_len)))
    return notes
