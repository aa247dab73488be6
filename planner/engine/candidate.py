"""One candidate strategy on one batch: its lower bounds before any solving, and its dispatch and packing,
abandoned as soon as a bound proves it cannot win (Hydraulis §6: Eq. 3 dispatch, Eq. 1 packing)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter

import numpy as np

from hydraplan.core.cluster import Cluster
from hydraplan.core.cost import pipeline_estimate
from hydraplan.core.schema import Candidate, CandidateSolve, PipelineSpec, Scheme
from hydraplan.core.sync import end_to_end_s
from hydraplan.engine.settings import PlanSettings
from hydraplan.solve.dispatch_methods import BY_NAME as DISPATCH_METHODS

PRUNE_RTOL = 1e-9


@dataclass(frozen=True)
class ResolvedCandidate:
    """A candidate ready to solve: ranks placed, one scheme per pipeline with MaxLen for this --gpus."""

    name: str
    specs: tuple[PipelineSpec, ...]
    schemes: tuple[Scheme, ...]
    transfer: tuple[float, ...]  # per pipeline, what the objective charges for sync (Cluster.charged_for; 0: nothing)
    synthesized: bool = False  # made for the batch (engine.synthesized), not one of the run's candidates

    @classmethod
    def of(cls, cand: Candidate, cluster: Cluster) -> ResolvedCandidate:
        """A resolved strategies.json candidate (ranks placed, schemes in the cluster): each pipeline charged
        what the cluster's objective charges for its sync."""
        specs = tuple(cand.pipelines)
        schemes = tuple(cluster.scheme(p.key) for p in specs)
        return cls(cand.name, specs, schemes, tuple(cluster.charged_for(specs).tolist()))  # type: ignore[arg-type]  # resolved: no None scheme

    def with_schemes(self, schemes: tuple[Scheme, ...]) -> ResolvedCandidate:
        return dataclasses.replace(self, schemes=schemes)

    @functools.cached_property
    def max_len(self) -> int:
        return max(s.max_len for s in self.schemes)

    @functools.cached_property
    def transfer_s(self) -> np.ndarray:
        """`transfer` as an array (thousands of pipelines at 8192 GPUs)."""
        return np.asarray(self.transfer, dtype=np.float64)

    @functools.cached_property
    def kinds(self) -> tuple[list[Scheme], np.ndarray, np.ndarray]:
        """The distinct (scheme, transfer) pairs, how many pipelines have each, and their transfers."""
        first: dict[tuple, Scheme] = {}
        counts: dict[tuple, int] = {}
        for s, tk in zip(self.schemes, self.transfer, strict=True):
            first.setdefault((s.key, tk), s)
            counts[(s.key, tk)] = counts.get((s.key, tk), 0) + 1
        return list(first.values()), np.array(list(counts.values())), np.array([k[1] for k in first], dtype=np.float64)

    def objective(self, propagation: np.ndarray | float, pipelines: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Pipelines' propagation times (or lower bounds on them) in the objective: their end-to-end times
        (increasing in propagation, so bounds stay bounds; with nothing charged exactly the propagation)."""
        return np.asarray(end_to_end_s(self.transfer_s[pipelines], propagation), dtype=np.float64)


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
    alone = float(np.where(fits, end_to_end_s(t_uniq, alone_s), np.inf).min())
    last = np.flatnonzero(np.r_[ls[1:] != ls[:-1], True])  # each distinct length once, with its count (25K
    u, count = ls[last], np.diff(last, prepend=-1)  # sequences hold ~4K lengths at 8192 GPUs)
    l = u.astype(np.float64)[:, None]
    w = (a * l + b) * l
    mean_work = (np.where(u[:, None] <= ml, w, np.inf).min(axis=1) * count).sum() / len(cand.schemes)
    mean_work = end_to_end_s(float(t_uniq.min()), mean_work)
    crowded = max(pigeonhole_bound(ls, uniq, counts, t_uniq), top_sequences_bound(ls, uniq, counts, t_uniq))
    return float(max(alone, mean_work, crowded))


def solve_candidate(
    cand: ResolvedCandidate, lengths: np.ndarray, settings: PlanSettings, *, seed: int,
    loses: Callable[[float], bool] | None = None, pack_budget_s: float | None = None,
) -> CandidateSolution:
    """Dispatch, then pack every pipeline. With `loses` (true for a lower bound, in the objective, that rules
    the candidate out), stop as soon as the Eq. (2) bound of the dispatch or one packed pipeline proves it cannot win;
    the result is then `pruned` with no pipelines. `pack_budget_s` caps the CP-SAT deterministic time of all
    its pack calls together (each still at most its own time limit; greedy only once it is spent); the
    budget depends on nothing outside the candidate, so pruning never changes which plan wins."""
    from hydraplan.solve.dispatch import Infeasible, dispatch, lower_bound
    from hydraplan.solve.packing import pack

    longest = int(lengths.max())
    if longest > cand.max_len:
        reason = f"a sequence of length {longest} exceeds its largest MaxLen {cand.max_len}"
        return CandidateSolution(CandidateSolve(name=cand.name, infeasible=reason), None)
    t0 = perf_counter()
    try:
        d = dispatch(lengths, list(cand.schemes), method=DISPATCH_METHODS[settings.dispatch],
                     trials=settings.dispatch_trials, seed=seed, time_limit_s=settings.dispatch_time_limit_s,
                     transfer=cand.transfer_s)
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
        limit = settings.pack_time_limit_s
        if pack_budget_s is not None:
            limit = min(limit, max(pack_budget_s, 0.0))
        r = pack(lengths[idx], scheme, seed=seed, time_limit_s=limit, rel_gap=settings.pack_rel_gap)
        if pack_budget_s is not None:
            pack_budget_s -= r.dtime_s
        groups = [idx[np.asarray(mb, dtype=np.int64)] for mb in r.micro_batches]
        done[j] = PipelineSolution(groups, pipeline_estimate(scheme, lengths, groups), r.solver, bool(r.optimal))
        estimates[j] = done[j].estimate_s
        if loses is not None and loses(float(cand.objective(done[j].estimate_s, j))):
            return CandidateSolution(record(pruned=True), None)
    return CandidateSolution(record(pruned=False), [done[j] for j in range(len(cand.schemes))])


REFINE_MARGIN = 0.05  # a plan up to this far above the best so far is still refined: the local search may win it


def refine_solution(cand: ResolvedCandidate, lengths: np.ndarray, sol: CandidateSolution, settings: PlanSettings,
                    seed: int, bound: float) -> CandidateSolution:
    """The candidate's packed dispatch after the local search of solve.refine (moves and swaps off its critical
    pipeline, touched pipelines re-packed), in the objective's terms; unchanged when no move lowers it. `bound`
    (a lower bound on every plan of the candidate) replaces the bound of its first dispatch."""
    from hydraplan.solve.refine import refine

    assert sol.pipelines is not None
    t0 = perf_counter()
    r = refine(lengths, list(cand.schemes), [p.micro_batches for p in sol.pipelines], transfer=cand.transfer_s,
               max_steps=settings.refine_steps, seed=seed)
    if not r.moves:
        return sol
    pipelines = [PipelineSolution(r.micro_batches[j], float(r.estimates[j]), "greedy+refine", False)
                 if j in r.touched else p for j, p in enumerate(sol.pipelines)]
    solve = sol.solve.model_copy(update={
        "estimate_s": float(r.estimates.max(initial=0.0)), "pack_solvers": [p.solver for p in pipelines],
        "optimal": False, "refine_moves": r.moves, "refine_s": perf_counter() - t0, "bound_s": bound})
    return CandidateSolution(solve, pipelines)


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
    (hydraplan.solve.bound.strategy_meets) is infeasible at X. One LP, asked only of candidates the cheap bounds
    left, before their dispatch: in iterations without a dominant long document (the loads balanced) the
    candidates' dispatches are what planning costs, and their relaxations are within a few percent of them."""
    from hydraplan.solve.bound import strategy_meets

    if best is None:
        return None
    est, idx = best
    X = est * (1 - PRUNE_RTOL if k > idx else 1 + PRUNE_RTOL)
    uniq, counts, t = cand.kinds
    return None if strategy_meets(lengths, uniq, counts, X, t) else X


def loses_to(best: tuple[float, int] | None, k: int, slack: float = 0.0) -> Callable[[float], bool]:
    """Whether a lower bound rules candidate k out against the best (estimate, index) so far. Ties go to
    the lower index; PRUNE_RTOL absorbs rounding between bound and estimate, so pruning changes the choice
    only between candidates within 1e-9 of each other. With `slack` the bound must exceed the best by that
    fraction more (a bound of one dispatch, which the local search after it may beat by that much)."""
    def loses(bound: float) -> bool:
        if best is None:
            return False
        est, idx = best
        bound /= 1 + slack
        return bound > est * (1 + PRUNE_RTOL) or (k > idx and bound >= est * (1 - PRUNE_RTOL))

    return loses


def solver_path(solve: CandidateSolve) -> str:
    """e.g. 'greedy+cpsat' or 'greedy+cpsat/warm-start': the dispatch solver and the packing solvers used."""
    packs = sorted({s for s in solve.pack_solvers if s != "empty"}) or ["empty"]
    return f"{solve.dispatch_solver}+{'/'.join(packs)}"
