"""The per-iteration loop (Hydraulis §6): every contender for the batch (the candidate strategies, strategies
made for the batch, core-attention disaggregation) is bounded, dispatched and packed, and the lowest estimate
in the cluster's objective wins.

`Planner` is the in-memory API a data loader uses to plan upcoming iterations while training runs (the
producer-consumer design of Hydraulis appendix F); `hydraplan pack` (app/pack.py) drives it over a run.

Objective (core.cluster.Cluster): every plan carries its propagation estimate and the docs/formats.md
end-to-end one; end to end (the default) the contenders are ranked, dispatched and pruned on iteration_s,
with "propagation" on propagation_s alone. A pipeline's end-to-end time is increasing in its propagation,
so every propagation lower bound maps to an end-to-end one through it and pruning stays exact.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

from hydraplan.core.batch import Batch, as_batch
from hydraplan.core.cluster import Cluster
from hydraplan.core.schema import CandidateSolve, IterationSummary, Plan, Profile, Strategies
from hydraplan.engine import synthesized
from hydraplan.engine.assemble import IterationResult, build_plan, infeasible_error, solver_seed, with_sync
from hydraplan.engine.cad_plan import CAD_CANDIDATE, cad_plan
from hydraplan.engine.candidate import (
    REFINE_MARGIN,
    CandidateSolution,
    ResolvedCandidate,
    candidate_bound,
    loses_to,
    refine_solution,
    relaxation_bound,
    solve_candidate,
    solver_path,
)
from hydraplan.engine.pool import WorkerPool, solve_in_order
from hydraplan.engine.settings import PlanSettings
from hydraplan.engine.strategies import resolve_strategies
from hydraplan.solve.cad import best_cad
from hydraplan.solve.dispatch_methods import GREEDY as GREEDY_DISPATCH
from hydraplan.solve.seqsplit import refine_plan, seq1f1b_scheme
from hydraplan.store.fileio import load_model
from hydraplan.store.profiles import load_profile

Best = tuple[float, int]  # (score in the objective, contender index): the lower wins, ties to the lower index


@dataclass(frozen=True)
class Round:
    """One batch being planned: what every contender needs."""

    batch: Batch
    seed: int
    longest_first: np.ndarray
    pack_budget_s: float  # each candidate's share of the iteration's CP-SAT budget


@dataclass
class Outcome:
    """What one contender gave: its summary record, its score in the objective (None: infeasible or pruned)
    and, should it win, how its plan is made."""

    solve: CandidateSolve
    score: float | None
    make_plan: Callable[[], Plan] | None = None


@dataclass
class Selection:
    """Every contender's outcome in contender order (candidates, then strategies made for the batch, then
    CAD), and the winner's index."""

    outcomes: list[Outcome]
    winner: int | None
    solutions: dict[int, CandidateSolution]  # of the candidates and made strategies, by index
    contenders: list[ResolvedCandidate]


class Planner:
    """Plans iterations for a fixed set of candidate strategies.

    Cheap to pickle, so `plan_stream` (or your own process pool) can plan the next iterations while the
    current one trains. A plan depends only on the cluster, the strategies, the settings and the batch:
    solver seeds derive from (seed, iteration), never from call order. Keyword options are the fields of
    `PlanSettings` (dispatch, seed, seq1f1b, cp_shard, synthesize, cad, prune, ...).
    """

    def __init__(self, profile: Profile | str, strategies: Strategies | str | Path, gpus: int, *,
                 context_len: int | None = None, objective: str = "end-to-end", **options: Any) -> None:
        profile = load_profile(profile) if isinstance(profile, str) else profile
        self._setup(Cluster.of(profile, gpus, objective), strategies, PlanSettings.of(options), context_len)

    @classmethod
    def for_cluster(cls, cluster: Cluster, strategies: Strategies | str | Path, settings: PlanSettings,
                    context_len: int | None = None, *, resolved: bool = False) -> Planner:
        """The planner of a run that built its cluster view and settings once (pack, compare); `resolved`:
        the strategies came from engine.strategies.resolve_strategies on this cluster already."""
        planner = cls.__new__(cls)
        planner._setup(cluster, strategies, settings, context_len, resolved)
        return planner

    def _setup(self, cluster: Cluster, strategies: Strategies | str | Path, settings: PlanSettings,
               context_len: int | None, resolved: bool = False) -> None:
        self.cluster, self.settings = cluster, settings
        source = "strategies"
        if not isinstance(strategies, Strategies):
            source = str(strategies)
            strategies = load_model(Strategies, strategies)
        if resolved and context_len is not None:
            strategies = strategies.model_copy(update={"context_len": context_len})
        self.strategies = strategies if resolved else resolve_strategies(strategies, cluster, context_len=context_len,
                                                                         source=source)
        self.candidates = [ResolvedCandidate.of(c, cluster) for c in self.strategies.candidates]
        # Seq1F1B (solve.seqsplit) raises the usable MaxLen of pp > 1 pipelines; plans then carry splits
        self.seq1f1b = settings.seq1f1b
        if self.seq1f1b is not None:
            self.candidates = [c.with_schemes(tuple(seq1f1b_scheme(s, self.seq1f1b) for s in c.schemes))
                               for c in self.candidates]
        self.candidate_keys = frozenset(s.key for c in self.candidates for s in c.schemes)
        self.synthesize = settings.synthesize and self.seq1f1b is None  # Seq1F1B changes MaxLen, which the MILP does not see

    @property
    def scheme_keys(self) -> set[tuple[int, int, int, str]]:
        """The schemes its plans can use: the candidates', and the cluster's when strategies are made per batch
        (or its cp = 1 schemes, CAD's)."""
        keys = {p.key for c in self.strategies.candidates for p in c.pipelines}
        if self.synthesize:
            keys |= {s.key for s in self.cluster.schemes}
        if self.settings.cad:
            keys |= {s.key for s in self.cluster.schemes if s.cp == 1}
        return keys

    @property
    def max_len(self) -> int:
        """Longest sequence some candidate can hold."""
        return max(c.max_len for c in self.candidates)

    def check_feasible(self, batch: Batch) -> Batch:
        if int(batch.lengths.max()) > self.max_len:
            raise infeasible_error(batch, self.candidates)
        return batch

    # ---------------------------------------------------------------------------------- selection
    def select(self, batch: Batch | Sequence[int] | np.ndarray, iteration: int = 0) -> Selection:
        """Every contender on the batch, the winner the lowest score (ties: the earlier contender).

        Candidates are solved in order of a cheap lower bound; with `prune` one whose bound (before dispatch,
        after it, or after any packed pipeline) already exceeds the best score is abandoned: the winner is
        the same as solving every contender to the end. Packing's CP-SAT time is at most `pack_budget_s`
        (deterministic seconds) per iteration, an equal share per candidate.
        """
        b = self.check_feasible(as_batch(batch, iteration))
        rnd = Round(b, solver_seed(self.settings.seed, b.iteration), np.sort(b.lengths)[::-1],
                    self.settings.pack_budget_s / len(self.candidates))
        outcomes: dict[int, Outcome] = {}
        solutions: dict[int, CandidateSolution] = {}
        contenders = list(self.candidates)
        best: Best | None = None
        for k, solve in self._contenders(rnd, contenders, lambda: best):
            out, sol = solve(best)
            outcomes[k] = out
            if sol is not None:
                solutions[k] = sol
            if out.score is not None and (best is None or (out.score, k) < best):
                best = (out.score, k)
        if best is None:
            raise infeasible_error(b, self.candidates)
        return Selection([outcomes[k] for k in sorted(outcomes)], best[1], solutions, contenders)

    def _contenders(self, rnd: Round, contenders: list[ResolvedCandidate], best: Callable[[], Best | None]
                    ) -> Iterator[tuple[int, Callable[[Best | None], tuple[Outcome, CandidateSolution | None]]]]:
        """(index, solve) of every contender: the candidates cheapest bound first, then, once they set the
        best score, the strategies made for this batch, then CAD. Lazy, because what comes later depends on
        the best score so far."""
        lengths = rnd.batch.lengths
        bounds = [candidate_bound(c, lengths, rnd.longest_first) for c in self.candidates]
        for k in sorted(range(len(bounds)), key=lambda k: (float(f"{bounds[k]:.9g}"), k)):
            yield k, self._solver(rnd, self.candidates[k], k, bounds[k])
        if self.synthesize and best() is not None:
            made = synthesized.strategies(self.cluster, self.candidate_keys, lengths, best()[0])  # type: ignore[index]  # not None: checked above
            last = None
            for _ in range(1 + synthesized.ROUNDS if made else 0):  # then strategies around the winner, while it moves
                for cand in made:
                    k = len(contenders)
                    contenders.append(cand)
                    yield k, self._solver(rnd, cand, k, candidate_bound(cand, lengths, rnd.longest_first))
                won = contenders[best()[1]]  # type: ignore[index]  # not None: checked above
                if won is last:
                    break
                last = won
                made = synthesized.around(self.cluster, won, contenders)
        if self.settings.cad:
            yield len(contenders), lambda _: (self._cad(rnd.batch), None)

    def _solver(self, rnd: Round, cand: ResolvedCandidate, k: int, bound: float
                ) -> Callable[[Best | None], tuple[Outcome, CandidateSolution | None]]:
        def solve(best: Best | None) -> tuple[Outcome, CandidateSolution | None]:
            sol, score = self._finished(rnd, cand, k, bound, best, self.settings)
            if sol.solve.dispatch_solver.startswith("greedy+"):
                # an exact dispatch step ran: its objective is Eq. (3), not the canonical estimate, so its plan is
                # kept only when at least as good as the greedy dispatch's on the estimate in force
                greedy = self.settings.model_copy(update={"dispatch": GREEDY_DISPATCH.name})
                alt, alt_score = self._finished(rnd, cand, k, bound, best, greedy)
                if alt_score is not None and (score is None or alt_score < score):
                    sol, score = alt, alt_score
            if score is None:
                return Outcome(sol.solve, None), sol
            return Outcome(sol.solve, score, lambda: self._candidate_plan(rnd.batch, cand, sol)), sol

        return solve

    def _finished(self, rnd: Round, cand: ResolvedCandidate, k: int, bound: float, best: Best | None,
                  settings: PlanSettings) -> tuple[CandidateSolution, float | None]:
        """Contender k pruned (score None), or dispatched, packed and refined, with its score."""
        sol = self._prune_or_solve(rnd, cand, k, bound, best, settings)
        if sol.pipelines is None:
            return sol, None
        score = self._score(cand, sol)
        if settings.refine and not loses_to(best, k, slack=REFINE_MARGIN)(score):
            sol = refine_solution(cand, rnd.batch.lengths, sol, settings, rnd.seed, bound)
            score = self._score(cand, sol)
        return sol, score

    def _score(self, cand: ResolvedCandidate, sol: CandidateSolution) -> float:
        """The solution's score in the objective; records its end-to-end estimate in its summary."""
        assert sol.pipelines is not None
        est = self.cluster.estimate([s.key for s in cand.specs], [p.estimate_s for p in sol.pipelines])
        sol.solve.iteration_s = est.iteration_s
        return self.cluster.score(sol.solve.estimate_s, est.iteration_s)  # type: ignore[arg-type]  # solved: set

    def _prune_or_solve(self, rnd: Round, cand: ResolvedCandidate, k: int, bound: float, best: Best | None,
                        settings: PlanSettings) -> CandidateSolution:
        """Contender k ruled out by its cheap lower `bound`, then by its LP relaxation, or dispatched and packed
        (abandoned as soon as a partial bound loses)."""
        loses = loses_to(best, k) if self.settings.prune else None
        if loses is not None and loses(bound) and np.isfinite(bound):
            return CandidateSolution(CandidateSolve(name=cand.name, bound_s=bound, pruned=True), None)
        relaxed = relaxation_bound(cand, rnd.batch.lengths, best, k) if loses is not None and np.isfinite(bound) else None
        if relaxed is not None:
            return CandidateSolution(CandidateSolve(name=cand.name, bound_s=max(bound, relaxed), pruned=True), None)
        if loses is not None and self.settings.refine:  # the bounds of one dispatch: the local search may still win
            loses = loses_to(best, k, slack=REFINE_MARGIN)
        return solve_candidate(cand, rnd.batch.lengths, settings, seed=rnd.seed, loses=loses,
                               pack_budget_s=rnd.pack_budget_s)

    def _cad(self, b: Batch) -> Outcome:
        """The best CAD plan of the batch (solve.cad), never pruned, recorded in the summary either way."""
        r = best_cad(self.cluster, b.lengths, ids=b.ids.tolist())
        if r is None:
            return Outcome(CandidateSolve(name=CAD_CANDIDATE, infeasible="no CAD layout holds the batch"), None)
        plan = cad_plan(b, r, self.cluster)
        e = plan.estimate
        solve = CandidateSolve(name=CAD_CANDIDATE, estimate_s=e.propagation_s, iteration_s=e.iteration_s,
                               dispatch_solver="cad", pack_solvers=[s.solver for s in r.section.steps])
        return Outcome(solve, self.cluster.score(e.propagation_s, e.iteration_s), lambda: plan)

    def _candidate_plan(self, b: Batch, cand: ResolvedCandidate, sol: CandidateSolution) -> Plan:
        assert sol.pipelines is not None
        plan = build_plan(b, cand, sol.pipelines, self.cluster)
        if cand.synthesized:
            plan.synthesized = True
        if self.seq1f1b is not None or self.settings.cp_shard:
            refine_plan(plan, [self.cluster.laid_out(p.key) for p in plan.pipelines],  # 1F1B MaxLen: splits cap from it
                        [p.micro_batches for p in sol.pipelines], b.lengths, self.seq1f1b, self.settings.cp_shard)
        return with_sync(plan, self.cluster)

    # ---------------------------------------------------------------------------------- planning
    def solve(self, batch: Batch | Sequence[int] | np.ndarray, iteration: int = 0) -> IterationResult:
        """The winning plan of the batch and its summary record (every contender's estimate and solver path)."""
        t0 = perf_counter()
        b = as_batch(batch, iteration)
        sel = self.select(b)
        won = sel.outcomes[sel.winner]  # type: ignore[index]  # select raises when none wins
        plan = won.make_plan()  # type: ignore[misc]  # the winner always has one
        e = plan.estimate
        summary = IterationSummary(
            iteration=b.iteration, strategy=plan.strategy, estimate_s=e.propagation_s, iteration_s=e.iteration_s,
            sync_s=e.sync_s, solver_s=perf_counter() - t0, solver=solver_path(won.solve),
            candidates_s={o.solve.name: o.solve.estimate_s for o in sel.outcomes},
            candidates=[o.solve for o in sel.outcomes],
        )
        if b.sampled is not None:
            summary.tokens = b.tokens
            summary.delayed_token_iters = b.delayed_token_iters
        if self.settings.bound and self.seq1f1b is None:  # Seq1F1B's MaxLen is outside the relaxation's model
            summary.bound_s = self._any_strategy_bound(b.lengths, self.cluster.score(e.propagation_s, e.iteration_s))
        return IterationResult(plan, summary)

    def _any_strategy_bound(self, lengths: np.ndarray, score: float) -> float:
        """The batch's any-strategy lower bound in the objective (solve.bound), the plan's score its first bracket
        (reached, so not probed); deterministic (node limits, no time limit)."""
        from hydraplan.solve.bound import any_strategy_bound

        schemes = list(self.cluster.schemes)
        return any_strategy_bound(lengths, schemes, self.cluster.gpus, transfer=self.cluster.scheme_charges_s, upper=score,
                                  upper_reached=True).latency_s

    def plan(self, batch: Batch | Sequence[int] | np.ndarray, iteration: int = 0) -> Plan:
        """The plan for one batch: a Batch (what `sample_iterations` gives) or a plain list of sequence lengths."""
        return self.solve(batch, iteration).plan

    def plan_stream(self, batches: Iterable[Batch | Sequence[int] | np.ndarray], *, workers: int = 1,
                    lookahead: int | None = None, start: int = 0, pool: WorkerPool | None = None
                    ) -> Generator[IterationResult, None, None]:
        """Plan batches in order, `workers` processes solving up to `lookahead` batches ahead.

        `batches` is consumed lazily (a data loader can keep feeding it); plain length arrays are numbered
        from `start`. Results come back in input order whatever the worker count. `pool`: processes started
        earlier (engine.pool.WorkerPool), used instead of `workers` new ones.
        """
        items = (self.check_feasible(as_batch(b, start + k)) for k, b in enumerate(batches))
        if pool is not None:
            yield from pool.solve_in_order(self, items, lookahead or 2 * pool.size)
            return
        if workers <= 1:
            yield from map(self.solve, items)
            return
        yield from solve_in_order(self, items, workers, lookahead or 2 * workers)
