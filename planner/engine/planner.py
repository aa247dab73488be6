"""The per-iteration loop (Hydraulis §6): for every candidate strategy dispatch the batch to pipelines,
pack each pipeline into micro-batches, take the canonical estimate, and keep the fastest candidate.

`Planner` is the in-memory API a data loader uses to plan upcoming iterations while training runs
(the producer-consumer design of Hydraulis appendix F); `run_pack` is `hydraplan pack`: it samples in
the parent, solves in a process pool and writes plans in iteration order, so the output depends only on
the arguments and --seed, never on the worker count or on timing.

Objective: every plan carries its propagation estimate and the docs/formats.md end-to-end one (hydraplan.sync);
with `objective="end-to-end"` (the default) the candidates are ranked, dispatched and pruned on
iteration_s, with "propagation" on propagation_s alone (the paper's objective, plans as before).
A pipeline's end-to-end time is increasing in its propagation, so every propagation lower bound maps to an
end-to-end one through it and pruning stays exact.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from itertools import islice
from multiprocessing import get_context
from pathlib import Path
from time import perf_counter
from typing import Any, Literal, Protocol

import numpy as np

from hydraplan.app.validate import PLAN_FILE, check_ranks
from hydraplan.core.cluster import for_gpus
from hydraplan.core.cost import pipeline_time_from_mb, seq_cost
from hydraplan.core.errors import UserError
from hydraplan.core.schema import (
    BatchSeq,
    Candidate,
    CandidateSolve,
    Estimate,
    IterationSummary,
    MicroBatch,
    OutlierDelay,
    PackArgs,
    PipelineSpec,
    Plan,
    PlanPipeline,
    Profile,
    Scheme,
    Strategies,
    Summary,
)
from hydraplan.core.sync import Objective, check_objective, end_to_end_s, iteration_estimate, objective_transfer_s
from hydraplan.solve.delay import DelayRule, delayed_token_iters, hydraplan_rule, outlier_delay
from hydraplan.solve.placement import place_ranks
from hydraplan.store.fileio import atomic_write_text, load_model, model_json, write_model
from hydraplan.store.profiles import load_profile

DispatchMethod = Literal["greedy", "ilp"]
SAMPLE_CHUNK = 64  # iterations sampled at once: bounds parent memory on long runs
PRUNE_RTOL = 1e-9
# CP-SAT deterministic seconds for all packing of one iteration, shared equally by the candidates. Without it
# every (candidate, pipeline) pack call had its own 2 s: dozens of calls per iteration, minutes on 2 cores.
ITERATION_PACK_BUDGET_S = 2.0


# ---------------------------------------------------------------------------------------------- batch
@dataclass(frozen=True)
class SeqBatch:
    """One iteration's sampled sequences (the fields of datasets.Batch the planner needs)."""

    iteration: int
    ids: np.ndarray
    lengths: np.ndarray
    docs: np.ndarray | None = None
    sampled: np.ndarray | None = None  # iteration each sequence was sampled in (outlier delay), None: this one


def as_batch(batch: Any, iteration: int = 0) -> SeqBatch:
    """A datasets.Batch (or anything with .lengths/.ids/.docs) or a plain array of lengths."""
    if hasattr(batch, "lengths"):
        lengths = np.asarray(batch.lengths, dtype=np.int64)
        ids = getattr(batch, "ids", None)
        docs = getattr(batch, "docs", None)
        sampled = getattr(batch, "sampled", None)
        return SeqBatch(
            iteration=int(getattr(batch, "iteration", iteration)),
            ids=np.arange(lengths.size, dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64),
            lengths=lengths,
            docs=None if docs is None else np.asarray(docs, dtype=np.int64),
            sampled=None if sampled is None else np.asarray(sampled, dtype=np.int64),
        )
    lengths = np.asarray(batch, dtype=np.int64)
    if lengths.ndim != 1 or lengths.size == 0 or lengths.min() < 1:
        raise UserError(f"plan: lengths must be a non-empty 1-D list of positive integers (got shape {lengths.shape})")
    return SeqBatch(iteration=iteration, ids=np.arange(lengths.size, dtype=np.int64), lengths=lengths)


def synthesize_default(synthesize: bool | None, objective: str) -> bool:
    """Per-batch synthesis unless asked otherwise only with the propagation objective: there it wins most iterations
    (plan / any-strategy bound 1.12 -> 1.02 at 64 GPUs); end to end the candidates, proposed with their sync,
    held 8 of 9 iterations at 64 GPUs and every one at 1024, while synthesis cost 3.8x (5x at 1024 GPUs) the
    planning time (bench/bench_bound.py)."""
    return objective == "propagation" if synthesize is None else synthesize


def solver_seed(seed: int, iteration: int) -> int:
    """Per-iteration solver seed: independent of which worker solves the iteration, or in which order.
    31 bits, because CP-SAT's random_seed is a signed 32-bit integer."""
    return int(np.random.SeedSequence([seed, iteration]).generate_state(1)[0] >> 1)


# ----------------------------------------------------------------------------------------- strategies
@dataclass(frozen=True)
class ResolvedCandidate:
    """A candidate ready to solve: ranks placed, one scheme per pipeline with MaxLen for this --gpus."""

    name: str
    specs: tuple[PipelineSpec, ...]
    schemes: tuple[Scheme, ...]
    transfer: tuple[float, ...] = ()  # per pipeline, what the objective charges for sync (empty: nothing)

    @property
    def max_len(self) -> int:
        return max(s.max_len for s in self.schemes)

    @functools.cached_property
    def transfer_s(self) -> np.ndarray | None:
        """`transfer` as an array (thousands of pipelines at 8192 GPUs), None when nothing is charged."""
        return np.asarray(self.transfer, dtype=np.float64) if any(self.transfer) else None

    @functools.cached_property
    def kinds(self) -> tuple[list[Scheme], np.ndarray, np.ndarray | None]:
        """The distinct (scheme, transfer) pairs, how many pipelines have each, and their transfers."""
        t = self.transfer if self.transfer_s is not None else (0.0,) * len(self.schemes)
        first: dict[tuple, Scheme] = {}
        counts: dict[tuple, int] = {}
        for s, tk in zip(self.schemes, t, strict=True):
            first.setdefault((s.key, tk), s)
            counts[(s.key, tk)] = counts.get((s.key, tk), 0) + 1
        return (list(first.values()), np.array(list(counts.values())),
                None if self.transfer_s is None else np.array([k[1] for k in first]))

    def objective(self, propagation: np.ndarray | float, pipelines: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Pipelines' propagation times (or lower bounds on them) in the objective: unchanged without a
        transfer, else their end-to-end times (increasing in propagation, so bounds stay bounds)."""
        if self.transfer_s is None:
            return np.asarray(propagation, dtype=np.float64)
        return np.asarray(end_to_end_s(self.transfer_s[pipelines], propagation), dtype=np.float64)


def resolve_strategies(
    strategies: Strategies, view: Profile, gpus: int, *, context_len: int | None = None, source: str = "strategies"
) -> Strategies:
    """Check a (possibly hand-written) strategies file against the profile and fill its derived fields:
    ranks (placed around any the file gives), max_len per candidate, profile, gpus and context_len."""
    names = [c.name for c in strategies.candidates]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise UserError(f"{source}: field candidates.{i}.name: duplicate candidate name (got {name!r})")
    gpus_per_node = view.gpu.gpus_per_node
    by_key = {s.key: s for s in view.schemes}  # thousands of pipelines at 8192 GPUs: no linear search each
    out: list[Candidate] = []
    for ci, cand in enumerate(strategies.candidates):
        where = f"{source}: field candidates.{ci}"
        schemes = []
        for pi, p in enumerate(cand.pipelines):
            scheme = by_key.get(p.key)
            if scheme is None:
                have = " ".join(s.label for s in view.schemes)
                raise UserError(
                    f"{where}.pipelines.{pi}: scheme <{p.tp},{p.pp},{p.cp}> is not in profile {view.name} "
                    f"for {gpus} GPUs (it has {have})"
                )
            schemes.append(scheme)
        if cand.gpus > gpus:
            raise UserError(f"{where}: candidate {cand.name} uses {cand.gpus} GPUs, --gpus is {gpus}")
        problems = check_ranks([p.ranks or [] for p in cand.pipelines], gpus)
        if problems:
            pi, problem = problems[0]
            raise UserError(f"{where}.pipelines.{pi}.ranks: {problem}")
        pipelines = list(cand.pipelines)
        if any(p.ranks is None for p in pipelines):  # placed around the ranks the file gives
            pipelines = place_ranks(pipelines, gpus, gpus_per_node)
        out.append(cand.model_copy(update={"pipelines": pipelines, "max_len": max(s.max_len for s in schemes)}))
    return strategies.model_copy(update={
        "profile": view.name, "gpus": gpus, "context_len": context_len or strategies.context_len, "candidates": out,
    })


class PlacementWarning(UserWarning):
    """Legal but likely slow: a TP/CP group across nodes, a candidate that cannot hold the context."""


def warn_placement(strategies: Strategies, profile: Profile, context_len: int, gpus_per_node: int) -> None:
    """The placement findings of `hydraplan validate`, as warnings before planning starts."""
    import warnings

    from hydraplan.app.validate import short_candidates, split_groups

    for cand in strategies.candidates:
        for pi, p in enumerate(cand.pipelines):
            for problem in split_groups(p.ranks or [], p.tp, p.pp, p.cp, gpus_per_node):
                warnings.warn(f"candidate {cand.name} pipeline {pi}: {problem}", PlacementWarning, stacklevel=2)
    short = short_candidates(strategies.model_copy(update={"context_len": context_len}), profile)
    if len(short) < len(strategies.candidates):  # none holds it: planning stops with an error naming the length
        for _, message in short:
            warnings.warn(message, PlacementWarning, stacklevel=2)


def strategies_digest(strategies: Strategies) -> str:
    return hashlib.sha256(model_json(strategies).encode()).hexdigest()


# ----------------------------------------------------------------------------------- one iteration
@dataclass(frozen=True)
class PipelineSolution:
    micro_batches: list[np.ndarray]  # indices into the batch
    estimate_s: float
    solver: str
    optimal: bool


@dataclass(frozen=True)
class CandidateSolution:
    solve: CandidateSolve
    pipelines: list[PipelineSolution] | None  # None: infeasible or pruned


@dataclass(frozen=True)
class IterationResult:
    plan: Plan
    summary: IterationSummary


def canonical_pipeline_estimate(scheme: Scheme, lengths: np.ndarray, micro_batches: list[np.ndarray]) -> float:
    """The canonical estimate (docs/formats.md), computed exactly as `hydraplan validate` recomputes it."""
    mb = [float(seq_cost(scheme, lengths[g]).sum()) + scheme.time.c for g in micro_batches]
    return pipeline_time_from_mb(mb, scheme.pp)


def candidate_bound(cand: ResolvedCandidate, lengths: np.ndarray, longest_first: np.ndarray | None = None) -> float:
    """A lower bound on every plan of the candidate for this batch, before any solving (inf if it cannot
    hold the batch): the longest sequence runs whole on a pipeline that can hold it, costing at least
    pp * (a l^2 + b l + c) there (no other sequence alone costs more: it is shorter and fits more schemes);
    the slowest pipeline is at least the mean of the cheapest work; the pipelines able to hold the long
    sequences hold several of them when there are more such sequences than pipelines
    (dispatch.pigeonhole_bound), and the longest few either share a pipeline or each take one
    (dispatch.top_sequences_bound). In the objective: through each scheme's end-to-end map, the mean
    through the smallest transfer's (the slowest pipeline pays at least that). `longest_first`: the
    lengths sorted descending, when the caller has them (one sort per batch for all candidates)."""
    from hydraplan.solve.dispatch import pigeonhole_bound, scheme_arrays, top_sequences_bound

    ls = np.sort(lengths)[::-1] if longest_first is None else longest_first
    uniq, counts, t_uniq = cand.kinds
    a, b, c, ppm1, ml = scheme_arrays(uniq)
    pp = ppm1 + 1
    top = float(ls[0])
    fits = top <= ml
    if not fits.any():
        return float("inf")
    alone_s = pp * ((a * top + b) * top + c)
    alone = float(np.where(fits, alone_s if t_uniq is None else end_to_end_s(t_uniq, alone_s), np.inf).min())
    l = lengths.astype(np.float64)[:, None]
    w = (a * l + b) * l
    mean_work = np.where(lengths[:, None] <= ml, w, np.inf).min(axis=1).sum() / len(cand.schemes)
    if t_uniq is not None:
        mean_work = end_to_end_s(float(t_uniq.min()), mean_work)
    crowded = max(pigeonhole_bound(ls, uniq, counts, t_uniq), top_sequences_bound(ls, uniq, counts, t_uniq))
    return float(max(alone, mean_work, crowded))


def solve_candidate(
    cand: ResolvedCandidate, lengths: np.ndarray, *, method: DispatchMethod, seed: int,
    dispatch_kwargs: dict[str, Any], pack_kwargs: dict[str, Any], loses: Callable[[float], bool] | None = None,
    pack_budget_s: float | None = None,
) -> CandidateSolution:
    """Dispatch, then pack every pipeline. With `loses` (true for a lower bound, in the objective, that rules
    the candidate out), stop as soon as the Eq. (2) bound of the dispatch or one packed pipeline proves it cannot win;
    the result is then `pruned` with no pipelines. `pack_budget_s` caps the CP-SAT deterministic time of all
    its pack calls together (each still at most its own time limit; greedy only once it is spent); the
    budget depends on nothing outside the candidate, so pruning never changes which plan wins."""
    from hydraplan.solve.dispatch import Infeasible, dispatch, lower_bound
    from hydraplan.solve.packing import DEFAULT_TIME_LIMIT_S, pack

    longest = int(lengths.max())
    if longest > cand.max_len:
        reason = f"a sequence of length {longest} exceeds its largest MaxLen {cand.max_len}"
        return CandidateSolution(CandidateSolve(name=cand.name, infeasible=reason), None)
    t0 = perf_counter()
    try:
        transfer = np.asarray(cand.transfer) if any(cand.transfer) else None
        d = dispatch(lengths, list(cand.schemes), method=method, seed=seed, transfer=transfer, **dispatch_kwargs)
    except Infeasible as e:
        return CandidateSolution(CandidateSolve(name=cand.name, infeasible=str(e)), None)
    t1 = perf_counter()
    assign = np.asarray(d.assign)
    eq2 = lower_bound(lengths, assign, list(cand.schemes))
    bounds = cand.objective(eq2)
    done: dict[int, PipelineSolution] = {}
    estimates = np.full(len(cand.schemes), np.nan)  # of the pipelines in `done`

    def record(pruned: bool) -> CandidateSolve:
        packed = np.flatnonzero(~np.isnan(estimates))
        proven = max(float(bounds.max(initial=0.0)), float(cand.objective(estimates[packed], packed).max(initial=0.0)))
        return CandidateSolve(
            name=cand.name, estimate_s=None if pruned else float(estimates.max()),
            dispatch_s=t1 - t0, pack_s=perf_counter() - t1, dispatch_solver=d.solver,
            pack_solvers=[] if pruned else [done[j].solver for j in range(len(cand.schemes))],
            optimal=not pruned and bool(d.optimal) and all(p.optimal for p in done.values()),
            dispatch_optimal=bool(d.optimal), bound_s=proven, pruned=pruned,
        )

    if loses is not None and loses(float(bounds.max(initial=0.0))):
        return CandidateSolution(record(pruned=True), None)
    one = _single_micro_batches(cand, lengths, assign)
    for j, g in one.items():  # their estimate is their Eq. (2) bound, already checked above
        done[j] = PipelineSolution([g] if g.size else [], float(eq2[j]), "greedy" if g.size else "empty", True)
        estimates[j] = eq2[j]
    for j in np.argsort(-bounds, kind="stable"):  # the slowest pipeline first: the likeliest to rule it out
        if j in done:
            continue
        scheme = cand.schemes[j]
        idx = np.flatnonzero(assign == j)
        kwargs = pack_kwargs
        if pack_budget_s is not None:
            cap = min(pack_kwargs.get("time_limit_s", DEFAULT_TIME_LIMIT_S), max(pack_budget_s, 0.0))
            kwargs = {**pack_kwargs, "time_limit_s": cap}
        r = pack(lengths[idx], scheme, seed=seed, **kwargs)
        if pack_budget_s is not None:
            pack_budget_s -= r.dtime_s
        groups = [idx[np.asarray(mb, dtype=np.int64)] for mb in r.micro_batches]
        done[j] = PipelineSolution(groups, canonical_pipeline_estimate(scheme, lengths, groups), r.solver, bool(r.optimal))
        estimates[j] = done[j].estimate_s
        if loses is not None and loses(float(cand.objective(done[j].estimate_s, j))):
            return CandidateSolution(record(pruned=True), None)
    return CandidateSolution(record(pruned=False), [done[j] for j in range(len(cand.schemes))])


def _single_micro_batches(cand: ResolvedCandidate, lengths: np.ndarray, assign: np.ndarray) -> dict[int, np.ndarray]:
    """The pipelines whose packing needs no search, with their one micro-batch (empty: no sequence): pp = 1
    and all their tokens within MaxLen, where one micro-batch is optimal (pp = 1 costs the sequences plus c per
    micro-batch) and costs exactly the Eq. (2) bound. The sequences in pack's order (longest first, then by
    position). Thousands of pipelines at 8192 GPUs, most of them so: found at once, not pipeline by pipeline."""
    D = len(cand.schemes)
    pp1 = np.array([s.pp == 1 for s in cand.schemes])
    ml = np.array([s.max_len for s in cand.schemes], dtype=np.int64)
    tokens = np.bincount(assign, weights=lengths, minlength=D)
    easy = (pp1 & (tokens <= ml)) | (tokens == 0)
    pick = easy[assign]
    members = np.flatnonzero(pick)
    members = members[np.lexsort((members, -lengths[members], assign[members]))]
    cuts = np.searchsorted(assign[members], np.arange(D + 1))
    return {int(j): members[cuts[j]:cuts[j + 1]] for j in np.flatnonzero(easy)}


def relaxation_bound(cand: ResolvedCandidate, lengths: np.ndarray, best: tuple[float, int] | None, k: int) -> float | None:
    """X, proven below every plan of candidate k, when that is enough to rule it out against the best (estimate,
    index) so far (loses_to's rule), else None: the LP relaxation of the candidate's dispatch and packing
    (hydraplan.bound.strategy_meets) is infeasible at X. One LP, asked only of candidates the cheap bounds
    left, before their dispatch: in iterations without a dominant long document (the loads balanced) the
    candidates' dispatches are what planning costs, and their relaxations are within a few percent of them."""
    from hydraplan.solve.bound import strategy_meets

    if best is None:
        return None
    est, idx = best
    X = est * (1 - PRUNE_RTOL if k > idx else 1 + PRUNE_RTOL)
    uniq, counts, t = cand.kinds
    return None if strategy_meets(lengths, uniq, counts, X, t) else X


def loses_to(best: tuple[float, int] | None, k: int) -> Callable[[float], bool]:
    """Whether a lower bound rules candidate k out against the best (estimate, index) so far. Ties go to
    the lower index; PRUNE_RTOL absorbs rounding between bound and estimate, so pruning changes the choice
    only between candidates within 1e-9 of each other."""
    def loses(bound: float) -> bool:
        if best is None:
            return False
        est, idx = best
        return bound > est * (1 + PRUNE_RTOL) or (k > idx and bound >= est * (1 - PRUNE_RTOL))

    return loses


def solver_path(solve: CandidateSolve) -> str:
    """e.g. 'greedy+cpsat' or 'greedy+cpsat/warm-start': the dispatch solver and the packing solvers used."""
    packs = sorted({s for s in solve.pack_solvers if s != "empty"}) or ["empty"]
    return f"{solve.dispatch_solver}+{'/'.join(packs)}"


def with_sync(plan: Plan, profile: Profile) -> Plan:
    """Fill the docs/formats.md end-to-end fields (per pipeline sync_s, estimate.sync_s and iteration_s) from the
    pipelines' canonical estimates, exactly as `hydraplan validate` recomputes them (0 sync without a model)."""
    est = iteration_estimate(profile, plan.gpus, [p.key for p in plan.pipelines], [p.estimate_s for p in plan.pipelines])
    for p, s in zip(plan.pipelines, est.exposed_s, strict=True):
        p.sync_s = s
    plan.estimate.sync_s = est.sync_s
    plan.estimate.iteration_s = est.iteration_s if plan.pipelines else plan.estimate.propagation_s
    return plan


def build_plan(
    batch: SeqBatch, cand: ResolvedCandidate, pipelines: list[PipelineSolution], profile_name: str, gpus: int,
) -> Plan:
    ids, lengths = batch.ids.tolist(), batch.lengths.tolist()  # plain ints: 25K sequences at 8192 GPUs
    docs = [None] * len(ids) if batch.docs is None else batch.docs.tolist()
    sampled = [None] * len(ids) if batch.sampled is None else [
        None if k == batch.iteration else k for k in batch.sampled.tolist()]
    seqs = [BatchSeq(id=i, length=l, doc=d, sampled_iteration=s) for i, l, d, s in zip(ids, lengths, docs, sampled, strict=True)]
    plan_pipes = [
        PlanPipeline(
            tp=spec.tp, pp=spec.pp, cp=spec.cp, ranks=list(spec.ranks or []),
            micro_batches=[MicroBatch(seqs=batch.ids[g].tolist()) for g in sol.micro_batches],
            estimate_s=sol.estimate_s,
        )
        for spec, sol in zip(cand.specs, pipelines, strict=True)
    ]
    return Plan(
        iteration=batch.iteration, profile=profile_name, gpus=gpus, batch=seqs, strategy=cand.name,
        pipelines=plan_pipes, estimate=Estimate(propagation_s=max((p.estimate_s for p in plan_pipes), default=0.0)),
    )


def infeasible_error(batch: SeqBatch, candidates: Iterable[ResolvedCandidate]) -> UserError:
    longest = int(batch.lengths.max())
    best = max(c.max_len for c in candidates)
    return UserError(
        f"iteration {batch.iteration}: no candidate can hold a sequence of length {longest} "
        f"(the largest MaxLen is {best}); lower --context-len or add a scheme with a larger max_len"
    )


# ---------------------------------------------------------------------------------------------- Planner
class Planner:
    """Plans iterations for a fixed set of candidate strategies.

    Cheap to pickle, so `plan_stream` (or your own process pool) can plan the next iterations while the
    current one trains. Output depends only on (profile, strategies, gpus, dispatch, seed, batch,
    iteration): solver seeds derive from (seed, iteration), never from call order.
    """

    def __init__(
        self,
        profile: Profile | str,
        strategies: Strategies | str | Path,
        gpus: int,
        *,
        dispatch: DispatchMethod = "greedy",
        seed: int = 0,
        context_len: int | None = None,
        dispatch_kwargs: dict[str, Any] | None = None,
        pack_kwargs: dict[str, Any] | None = None,
        pack_budget_s: float = ITERATION_PACK_BUDGET_S,
        prune: bool = True,
        seq1f1b: str | None = None,
        cp_shard: bool = False,
        objective: Objective = "end-to-end",
        synthesize: bool | None = None,
        cad: bool = False,
    ) -> None:
        if dispatch not in ("greedy", "ilp"):
            raise UserError(f"--dispatch must be greedy or ilp (got {dispatch!r})")
        check_objective(objective)
        self.objective = objective
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        self.view = for_gpus(self.profile, gpus)
        self.gpus = gpus
        self.dispatch = dispatch
        self.seed = seed
        self.prune = prune
        self.dispatch_kwargs = dict(dispatch_kwargs or {})
        self.pack_kwargs = dict(pack_kwargs or {})
        self.pack_budget_s = pack_budget_s
        source = "strategies"
        if not isinstance(strategies, Strategies):
            source = str(strategies)
            strategies = load_model(Strategies, strategies)
        self.strategies = resolve_strategies(strategies, self.view, gpus, context_len=context_len, source=source)
        by_key = {s.key: s for s in self.view.schemes}
        self.candidates = [
            ResolvedCandidate(c.name, tuple(c.pipelines), tuple(by_key[p.key] for p in c.pipelines),
                              tuple(objective_transfer_s(self.profile, np.array([p.tp for p in c.pipelines]),
                                                         np.array([p.pp for p in c.pipelines]), gpus, objective).tolist()))
            for c in self.strategies.candidates
        ]
        from hydraplan.solve.seqsplit import parse_seq1f1b, seq1f1b_scheme

        # Seq1F1B (hydraplan.seqsplit) raises the usable MaxLen of pp > 1 pipelines; plans then carry splits
        self.seq1f1b = None if seq1f1b is None else parse_seq1f1b(seq1f1b)
        self.cp_shard = cp_shard
        # Seq1F1B changes MaxLen, which the MILP does not see
        self.synthesize = synthesize_default(synthesize, objective) and self.seq1f1b is None
        self.cad = cad  # also plan core-attention disaggregation (hydraplan.cad) and keep it when faster
        if self.seq1f1b is not None:
            self.candidates = [ResolvedCandidate(c.name, c.specs, tuple(seq1f1b_scheme(s, self.seq1f1b) for s in c.schemes),
                                                 c.transfer) for c in self.candidates]

    def _solve_cad(self, b: SeqBatch) -> Plan | None:
        """The best CAD plan of the batch (hydraplan.cad), as a plan whose pipelines are the replicas."""
        from hydraplan.engine.cad_plan import cad_plan
        from hydraplan.solve.cad import best_cad

        r = best_cad(self.profile, self.view, self.gpus, b.lengths, ids=b.ids.tolist())
        return None if r is None else cad_plan(b, r, self.view, self.profile.name, self.gpus)

    @property
    def max_len(self) -> int:
        """Longest sequence some candidate can hold."""
        return max(c.max_len for c in self.candidates)

    def check_feasible(self, batch: SeqBatch) -> None:
        if int(batch.lengths.max()) > self.max_len:
            raise infeasible_error(batch, self.candidates)

    def prune_or_solve(self, cand: ResolvedCandidate, k: int, lengths: np.ndarray, bound: float,
                       best: tuple[float, int] | None, seed: int, share: float
                       ) -> tuple[CandidateSolution, tuple[float, int] | None]:
        """Candidate k (its cheap lower `bound` given) ruled out by that bound, then by its LP relaxation, or
        dispatched and packed (abandoned as soon as a partial bound loses); returns its solution and the new
        best (score, index)."""
        loses = loses_to(best, k) if self.prune else None
        if loses is not None and loses(bound) and np.isfinite(bound):
            return CandidateSolution(CandidateSolve(name=cand.name, bound_s=bound, pruned=True), None), best
        relaxed = relaxation_bound(cand, lengths, best, k) if loses is not None and np.isfinite(bound) else None
        if relaxed is not None:
            return CandidateSolution(CandidateSolve(name=cand.name, bound_s=max(bound, relaxed), pruned=True), None), best
        sol = solve_candidate(cand, lengths, method=self.dispatch, seed=seed, loses=loses,
                              dispatch_kwargs=self.dispatch_kwargs, pack_kwargs=self.pack_kwargs, pack_budget_s=share)
        est = self._score(cand, sol)
        if est is not None and (best is None or (est, k) < best):
            best = (est, k)
        return sol, best

    def solve(self, batch: Any, iteration: int = 0) -> IterationResult:
        """Plan one batch with every candidate; the lowest estimate in the objective wins (ties: earlier
        candidate): the end-to-end iteration_s, or with objective "propagation" the canonical propagation_s.

        Candidates are solved in order of a cheap lower bound; with `prune` one whose bound (before
        dispatch, after it, or after any packed pipeline) already exceeds the best estimate is abandoned.
        The chosen plan is the same as solving every candidate to the end. Packing's CP-SAT time is at
        most `pack_budget_s` (deterministic seconds) per iteration, `pack_budget_s / candidates` each.
        """
        b = as_batch(batch, iteration)
        self.check_feasible(b)
        t0 = perf_counter()
        seed = solver_seed(self.seed, b.iteration)
        ordered = np.sort(b.lengths)[::-1]
        bounds = [candidate_bound(c, b.lengths, ordered) for c in self.candidates]
        order = sorted(range(len(bounds)), key=lambda k: (float(f"{bounds[k]:.9g}"), k))
        sols: list[CandidateSolution] = [None] * len(bounds)  # type: ignore[list-item]
        best: tuple[float, int] | None = None
        share = self.pack_budget_s / len(self.candidates)
        for k in order:
            sols[k], best = self.prune_or_solve(self.candidates[k], k, b.lengths, bounds[k], best, seed, share)
        cad_plan = self._solve_cad(b) if self.cad else None
        if best is None and cad_plan is None:
            raise infeasible_error(b, self.candidates)
        cands = self.candidates
        if self.synthesize and best is not None:
            from hydraplan.engine.synthesized import solve_synthesized

            extra, extra_sols, best = solve_synthesized(self, b.lengths, ordered, seed, best, share)
            cands, sols = [*cands, *extra], [*sols, *extra_sols]
        cad_score = None
        if cad_plan is not None:
            e = cad_plan.estimate
            cad_score = e.iteration_s if self.objective == "end-to-end" and e.iteration_s is not None else e.propagation_s
        if cad_plan is not None and (best is None or cad_score < best[0]):
            cad_solve = CandidateSolve(name=CAD_CANDIDATE, estimate_s=cad_plan.estimate.propagation_s,
                                       iteration_s=cad_plan.estimate.iteration_s,
                                       dispatch_solver="cad", pack_solvers=[s.solver for s in cad_plan.cad.steps])
            summary = IterationSummary(
                iteration=b.iteration, strategy=CAD_CANDIDATE, estimate_s=cad_plan.estimate.propagation_s,
                iteration_s=cad_plan.estimate.iteration_s, sync_s=cad_plan.estimate.sync_s,
                solver_s=perf_counter() - t0, solver="cad+" + "/".join(sorted({s.solver for s in cad_plan.cad.steps})),
                candidates_s={**{s.solve.name: s.solve.estimate_s for s in sols}, CAD_CANDIDATE: cad_solve.estimate_s},
                candidates=[*(s.solve for s in sols), cad_solve],
            )
            return IterationResult(cad_plan, summary)
        assert best is not None
        won = sols[best[1]]
        plan = build_plan(b, cands[best[1]], won.pipelines, self.profile.name, self.gpus)
        if best[1] >= len(self.candidates):
            plan.synthesized = True
        if self.seq1f1b is not None or self.cp_shard:
            from hydraplan.solve.seqsplit import refine_plan

            refine_plan(plan, [self.view.scheme(*p.key) for p in plan.pipelines],  # 1F1B MaxLen: splits cap from it
                        [p.micro_batches for p in won.pipelines], b.lengths, self.seq1f1b, self.cp_shard)
        with_sync(plan, self.profile)
        summary = IterationSummary(
            iteration=b.iteration,
            strategy=plan.strategy,
            estimate_s=plan.estimate.propagation_s,
            iteration_s=plan.estimate.iteration_s,
            sync_s=plan.estimate.sync_s,
            solver_s=perf_counter() - t0,
            solver=solver_path(won.solve),
            candidates_s={s.solve.name: s.solve.estimate_s for s in sols},
            candidates=[s.solve for s in sols],
        )
        if cad_plan is not None:
            summary.candidates_s[CAD_CANDIDATE] = cad_plan.estimate.propagation_s
            summary.candidates.append(CandidateSolve(name=CAD_CANDIDATE, estimate_s=cad_plan.estimate.propagation_s,
                                                     iteration_s=cad_plan.estimate.iteration_s, dispatch_solver="cad"))
        if b.sampled is not None:
            summary.tokens = int(b.lengths.sum())
            summary.delayed_token_iters = delayed_token_iters(b.lengths, b.sampled, b.iteration)
        return IterationResult(plan, summary)

    def _score(self, cand: ResolvedCandidate, sol: CandidateSolution) -> float | None:
        """The candidate's plan in the objective (None: infeasible or pruned); records its iteration_s."""
        if sol.pipelines is None:
            return None
        est = iteration_estimate(self.profile, self.gpus, [s.key for s in cand.specs],
                                 [p.estimate_s for p in sol.pipelines])
        sol.solve.iteration_s = est.iteration_s
        return est.iteration_s if self.objective == "end-to-end" else sol.solve.estimate_s

    def plan(self, batch: Any, iteration: int = 0) -> Plan:
        """The plan for one batch: a datasets.Batch or a plain list of sequence lengths."""
        return self.solve(batch, iteration).plan

    def plan_stream(self, batches: Iterable[Any], *, workers: int = 1, lookahead: int | None = None,
                    start: int = 0) -> Iterator[IterationResult]:
        """Plan batches in order, `workers` processes solving up to `lookahead` batches ahead.

        `batches` is consumed lazily (a data loader can keep feeding it); plain length arrays are numbered
        from `start`. Results come back in input order whatever the worker count.
        """
        items = (as_batch(b, start + k) for k, b in enumerate(batches))
        if workers <= 1:
            for b in items:
                yield self.solve(b)
            return
        window = lookahead or 2 * workers
        # spawn, not forkserver: workers are our own children (so they can die with us) and no forkserver
        # socket folder is left in /tmp when we are killed
        pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"),
                                   initializer=_init_worker, initargs=(self, os.getpid()))
        pending: deque[Future[IterationResult]] = deque()
        try:
            for b in items:
                self.check_feasible(b)
                pending.append(pool.submit(_solve_in_worker, b))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except BaseException:  # interrupted or failed: running solves are not needed, stop them now
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.kill()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


_WORKER_PLANNER: Planner | None = None
PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """Make this worker die with `parent` whatever kills it (SIGKILL included): the kernel's parent-death
    signal on Linux, elsewhere a thread that polls the parent. Without it a killed `pack` left its
    workers (and through them the resource tracker) running for minutes."""
    import signal
    import sys
    import threading

    if sys.platform == "linux":
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)
            return

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="hydraplan-parent-watch", daemon=True).start()


def _init_worker(worker_planner: Planner, parent: int) -> None:
    """Die with the parent; leave Ctrl-C to it (it stops the pool and prints one line, so workers print no
    KeyboardInterrupt tracebacks); keep the planner, and import the solvers now so the first iteration's
    solver_s is not import time."""
    import signal

    global _WORKER_PLANNER
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    importlib.import_module("hydraplan.solve.dispatch")
    importlib.import_module("hydraplan.solve.packing")
    _WORKER_PLANNER = worker_planner


def _solve_in_worker(batch: SeqBatch) -> IterationResult:
    assert _WORKER_PLANNER is not None
    return _WORKER_PLANNER.solve(batch)


# ---------------------------------------------------------------------------------------- run_pack
@dataclass(frozen=True)
class PackOptions:
    """The arguments of `hydraplan pack`."""

    profile: str
    dataset: str
    gpus: int
    tokens_per_iter: int
    iterations: int
    out: Path
    strategies: Path | None = None
    context_len: int | None = None
    seed: int = 0
    workers: int | None = None
    dispatch: DispatchMethod = "greedy"
    resume: bool = False
    seq1f1b: str | None = None
    cp_shard: bool = False
    outlier_delay: bool = False
    objective: Objective = "end-to-end"
    static: bool = True  # False (--no-static): the static baseline's layout does not join the candidates
    synthesize: bool | None = None  # None: synthesize_default; False (--candidates-only): no strategy made for the batch
    cad: bool = False


class PackProgress(Protocol):
    def start(self, done: int, total: int) -> None: ...
    def advance(self, it: IterationSummary) -> None: ...


def plan_path(out: Path, iteration: int) -> Path:
    return out / f"iter_{iteration:06d}.json"


def _remove_plans_from(out: Path, first: int) -> None:
    """Drop plan files a new or resumed run will (re)write, so the folder never mixes two runs."""
    for p in out.glob("iter_*.json"):
        m = PLAN_FILE.match(p.name)
        if m and int(m.group(1)) >= first:
            p.unlink()


def _pack_args(opts: PackOptions, profile: Profile) -> PackArgs:
    return PackArgs(
        profile=opts.profile, profile_sha256=hashlib.sha256(model_json(profile).encode()).hexdigest(),
        dataset=opts.dataset, gpus=opts.gpus, tokens_per_iter=opts.tokens_per_iter, context_len=opts.context_len,
        seed=opts.seed, dispatch=opts.dispatch,
        strategies=None if opts.strategies is None else str(opts.strategies.resolve()),
        seq1f1b=opts.seq1f1b, cp_shard=opts.cp_shard, outlier_delay=opts.outlier_delay, objective=opts.objective,
        static=opts.static, synthesize=synthesize_default(opts.synthesize, opts.objective),
        cad=opts.cad,
    )


def _resume_state(opts: PackOptions, args: PackArgs) -> Summary | None:
    """The interrupted run's summary, checked against this run's arguments and its plan files."""
    path = opts.out / "summary.json"
    if not opts.resume or not path.exists():
        return None
    summary = load_model(Summary, path)
    if summary.args is None:
        raise UserError(f"{path}: field args: missing, so this run cannot be resumed safely")
    old, new = summary.args.model_dump(), args.model_dump()
    diff = [k for k in new if old.get(k) != new[k]]
    if diff:
        k = diff[0]
        raise UserError(f"{path}: field args.{k}: the run was started with {old.get(k)!r}, now {new[k]!r}; "
                        "--resume needs the same arguments")
    if opts.outlier_delay and summary.iterations_requested != opts.iterations:
        raise UserError(f"{path}: field iterations_requested: the run was started with {summary.iterations_requested}, "
                        f"now {opts.iterations}; --outlier-delay drains its queue at the last iteration, so --resume "
                        "needs the same --iterations")
    for i, it in enumerate(summary.iterations):
        if it.iteration != i:
            raise UserError(f"{path}: field iterations.{i}.iteration: expected {i} (got {it.iteration})")
        if not plan_path(opts.out, i).exists():
            raise UserError(f"{path}: iteration {i} is recorded but {plan_path(opts.out, i)} is missing")
    return summary


def _load_strategies(opts: PackOptions, profile: Profile, dataset: Any, resumed: Summary | None) -> Strategies:
    view = for_gpus(profile, opts.gpus)
    if opts.strategies is not None:
        raw = load_model(Strategies, opts.strategies)
        return resolve_strategies(raw, view, opts.gpus, context_len=opts.context_len, source=str(opts.strategies))
    if resumed is not None:
        path = opts.out / "strategies.json"
        return resolve_strategies(load_model(Strategies, path), view, opts.gpus,
                                  context_len=opts.context_len, source=str(path))
    from hydraplan.solve.proposal import propose

    context_len = opts.context_len or int(dataset.lengths.max())
    longest = max(s.max_len for s in view.schemes)
    if opts.context_len is None and context_len > longest:
        raise UserError(f"dataset {opts.dataset}: its longest sequence ({context_len} tokens) exceeds the largest "
                        f"MaxLen of profile {profile.name} at {opts.gpus} GPUs ({longest}); pass --context-len")
    return propose(profile, dataset, opts.gpus, context_len, tokens_per_iter=opts.tokens_per_iter,
                   objective=opts.objective)


def _sampled(dataset: Any, opts: PackOptions, start: int) -> Iterator[Any]:
    from hydraplan.store.datasets import sample_iterations

    for first in range(start, opts.iterations, SAMPLE_CHUNK):
        n = min(SAMPLE_CHUNK, opts.iterations - first)
        yield from sample_iterations(dataset, opts.tokens_per_iter, n, opts.seed, start=first)


def _batches(dataset: Any, opts: PackOptions, start: int, rule: DelayRule | None) -> Iterator[Any]:
    """The batches of iterations [start, iterations). Under an outlier delay rule the queue is a function of
    the whole stream, so it is replayed from iteration 0 (sampling is cheap): a resumed run plans exactly
    what an uninterrupted one would."""
    if rule is None:
        return _sampled(dataset, opts, start)
    return islice(outlier_delay(_sampled(dataset, opts, 0), rule, opts.iterations), start, None)


@dataclass(frozen=True)
class StaticBaseline:
    """What the user runs today, scored next to every planned iteration: Megatron-style, one homogeneous
    scheme replicated, FFD packing to the context length, micro-batches dealt round-robin."""

    scheme: Scheme
    gpus: int
    context_len: int
    profile: Profile | None = None  # whose sync model the end-to-end estimate uses (None: propagation only)

    @property
    def label(self) -> str:
        return f"megatron {self.scheme.label}x{self.gpus // self.scheme.gpus}"

    def estimates_s(self, lengths: np.ndarray) -> tuple[float, float]:
        """(propagation, end-to-end) of the baseline's plan for this batch, sync paid with the same formula."""
        from hydraplan.methods.baselines import megatron, plan_iteration_s

        plan = megatron(lengths, self.scheme, self.gpus, self.context_len)
        if self.profile is None:
            return plan.estimate_s, plan.estimate_s
        return plan.estimate_s, plan_iteration_s(plan, self.profile, self.gpus)


BASELINE_PROBE_ITERATIONS = 8
BASELINE_PROBE_SEQUENCES = 4000  # ... but no more batches than needed to see this many sequences


def static_baseline(dataset: Any, opts: PackOptions, profile: Profile) -> StaticBaseline | None:
    """The homogeneous scheme with the lowest mean Megatron estimate in the run's objective on the run's first
    batches (up to BASELINE_PROBE_ITERATIONS, stopping once BASELINE_PROBE_SEQUENCES sequences are seen; the
    same choice `compare` makes on all of its batches); None when no single scheme holds the context length."""
    from hydraplan.methods.baselines import best_static, holding, megatron, objective_score
    from hydraplan.store.datasets import sample_iterations

    view = for_gpus(profile, opts.gpus)
    context_len = opts.context_len or int(dataset.lengths.max())
    schemes = holding(view.schemes, context_len, opts.gpus)
    if not schemes:
        return None
    probe = []
    for b in sample_iterations(dataset, opts.tokens_per_iter, min(opts.iterations, BASELINE_PROBE_ITERATIONS), opts.seed):
        if sum(p.size for p in probe) >= BASELINE_PROBE_SEQUENCES:
            break  # at 8192 GPUs one batch holds 25K sequences: eight cost 26 s of FFD for the same choice
        probe.append(np.asarray(b.lengths, dtype=np.int64))
    scheme, _ = best_static(schemes, lambda s: [megatron(b, s, opts.gpus, context_len) for b in probe], "baseline",
                            objective_score(profile, opts.gpus, opts.objective))
    return StaticBaseline(scheme, opts.gpus, context_len, profile)


STATIC_CANDIDATE = "static"
CAD_CANDIDATE = "cad"


def with_static_candidate(strategies: Strategies, baseline: StaticBaseline, view: Profile,
                          context_len: int | None) -> Strategies:
    """The candidates plus the static baseline's layout (named STATIC_CANDIDATE) unless one of them is that
    layout already: then every plan is at least as fast as the best static layout packed by our solvers
    (the proposal's homogeneous fallback is chosen by the DP's expectation, which can prefer another
    scheme). Idempotent, so a resumed run's strategies.json gets nothing added twice."""
    d = baseline.gpus // baseline.scheme.gpus
    layout = [baseline.scheme.key] * d
    if any(sorted(p.key for p in c.pipelines) == layout for c in strategies.candidates):
        return strategies
    name = STATIC_CANDIDATE
    while name in {c.name for c in strategies.candidates}:
        name += "'"
    spec = PipelineSpec(tp=baseline.scheme.tp, pp=baseline.scheme.pp, cp=baseline.scheme.cp)
    static = Candidate(name=name, pipelines=[spec] * d, kind="homogeneous", sources=["static-baseline"])
    added = strategies.model_copy(update={"candidates": [*strategies.candidates, static]})
    return resolve_strategies(added, view, baseline.gpus, context_len=context_len, source="strategies")


def run_pack(opts: PackOptions, progress: PackProgress | None = None) -> Summary:
    """`hydraplan pack`: plan `iterations` sampled batches into opts.out, resumable at any point. The folder
    is locked for the run (hydraplan.runlock): a second run on it fails at once instead of mixing plans."""
    from hydraplan.store.runlock import locked_folder

    with locked_folder(opts.out):
        return _run_pack_locked(opts, progress)


def _run_pack_locked(opts: PackOptions, progress: PackProgress | None) -> Summary:
    from hydraplan.store.datasets import load_dataset

    if opts.iterations < 1:
        raise UserError(f"--iterations must be positive (got {opts.iterations})")
    if opts.tokens_per_iter < 1:
        raise UserError(f"--tokens-per-iter must be positive (got {opts.tokens_per_iter})")
    if opts.dispatch not in ("greedy", "ilp"):
        raise UserError(f"--dispatch must be greedy or ilp (got {opts.dispatch!r})")
    check_objective(opts.objective)
    if opts.context_len is not None and opts.context_len < 1:
        raise UserError(f"--context-len must be a positive number of tokens (got {opts.context_len})")
    if opts.workers is not None and opts.workers < 1:
        raise UserError(f"--workers must be a positive integer (got {opts.workers})")
    profile = load_profile(opts.profile)
    for_gpus(profile, opts.gpus)
    args = _pack_args(opts, profile)
    resumed = _resume_state(opts, args)
    dataset = load_dataset(opts.dataset, opts.context_len)
    strategies = _load_strategies(opts, profile, dataset, resumed)  # a bad --strategies fails before the baseline runs
    warn_placement(strategies, profile, opts.context_len or int(dataset.lengths.max()), profile.gpu.gpus_per_node)
    baseline = static_baseline(dataset, opts, profile)
    if baseline is not None and opts.static:
        strategies = with_static_candidate(strategies, baseline, for_gpus(profile, opts.gpus), opts.context_len)
    digest = strategies_digest(strategies)
    if resumed is not None and resumed.strategies_sha256 != digest:
        raise UserError(f"{opts.out / 'strategies.json'}: the candidates changed since the run started; "
                        "--resume needs the same strategies")
    planner = Planner(profile, strategies, opts.gpus, dispatch=opts.dispatch, seed=opts.seed,
                      context_len=opts.context_len, seq1f1b=opts.seq1f1b, cp_shard=opts.cp_shard,
                      objective=opts.objective, synthesize=opts.synthesize, cad=opts.cad)

    done = resumed.iterations if resumed is not None else []
    summary = Summary(
        profile=profile.name, gpus=opts.gpus, dataset=dataset.name, tokens_per_iter=opts.tokens_per_iter,
        seed=opts.seed, iterations=list(done), args=args, strategies_sha256=digest,
        iterations_requested=opts.iterations, context_len=opts.context_len, objective=opts.objective,
        empty_documents=dataset.empty,
    )
    rule = None
    if opts.outlier_delay:
        rule = hydraplan_rule(dataset.lengths, opts.tokens_per_iter)
        summary.outlier_delay = OutlierDelay(threshold=rule.thresholds[0], release_tokens=rule.tokens,
                                             max_wait=rule.max_wait)
    summary.baseline = baseline.label if baseline is not None else None
    _remove_plans_from(opts.out, len(done))
    write_model(opts.out / "strategies.json", planner.strategies)
    if progress is not None:
        progress.start(len(done), opts.iterations)
    workers = opts.workers or os.cpu_count() or 1
    writer = _SummaryWriter(opts.out, summary)
    from hydraplan.solve.synthesis import GroupLedger

    groups = GroupLedger(planner.strategies, opts.gpus, planner.view.gpu.gpus_per_node)
    for it in done:  # a resumed run: the groups and placements its plans already use
        summary.synthesized_iterations += groups.record(load_model(Plan, plan_path(opts.out, it.iteration)), place=False)
    summary.new_process_groups = groups.created
    try:
        with closing(planner.plan_stream(_batches(dataset, opts, len(done), rule), workers=workers)) as stream:
            for result in stream:
                summary.synthesized_iterations += groups.record(result.plan)  # reuses ranks already in use
                summary.new_process_groups = groups.created
                if baseline is not None:
                    lengths = np.array([s.length for s in result.plan.batch], dtype=np.int64)
                    prop, e2e = baseline.estimates_s(lengths)
                    result.summary.baselines_s["megatron"] = prop
                    result.summary.baselines_iteration_s["megatron"] = e2e
                atomic_write_text(plan_path(opts.out, result.plan.iteration), model_json(result.plan) + "\n")
                summary.iterations.append(result.summary)
                writer.maybe_write()
                if progress is not None:
                    progress.advance(result.summary)
    finally:  # interrupted or not, record every plan written so far
        writer.write()
    return summary


class _SummaryWriter:
    """Rewrites summary.json after a plan is written, at most every SUMMARY_EVERY_S seconds (or 5x the
    last write's duration on long runs) so a 10,000-iteration run does not spend its time rewriting it.
    A plan newer than the summary is simply redone by --resume."""

    SUMMARY_EVERY_S = 0.5

    def __init__(self, out: Path, summary: Summary) -> None:
        self.out, self.summary = out, summary
        self.next_at = 0.0
        self.write()

    def maybe_write(self) -> None:
        if perf_counter() >= self.next_at:
            self.write()

    def write(self) -> None:
        t0 = perf_counter()
        its = self.summary.iterations
        self.summary.mean_estimate_s = float(np.mean([i.estimate_s for i in its])) if its else None
        if self.summary.outlier_delay is not None and its:
            delayed = sum(i.delayed_token_iters or 0 for i in its) / max(sum(i.tokens or 0 for i in its), 1)
            self.summary.outlier_delay.avg_delay_iters_per_token = delayed
        base = [i.baselines_s["megatron"] for i in its if "megatron" in i.baselines_s]
        self.summary.mean_baseline_s = float(np.mean(base)) if base and len(base) == len(its) else None
        e2e = [i.iteration_s for i in its if i.iteration_s is not None]
        self.summary.mean_iteration_s = float(np.mean(e2e)) if its and len(e2e) == len(its) else None
        base = [i.baselines_iteration_s["megatron"] for i in its if "megatron" in i.baselines_iteration_s]
        self.summary.mean_baseline_iteration_s = float(np.mean(base)) if base and len(base) == len(its) else None
        write_model(self.out / "summary.json", self.summary)
        t1 = perf_counter()
        self.next_at = t1 + max(self.SUMMARY_EVERY_S, 5 * (t1 - t0))
