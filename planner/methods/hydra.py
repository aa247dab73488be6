"""hydraplan and its Hydraulis Figure 16 ablations in `compare`, read off the engine's own selection loop:
every candidate solved on every batch (no pruning), so the ablations are comparable iteration by iteration.

(a) homo-maxlen: the static homogeneous scheme, Eq. 3 dispatch, max-length (FFD) packing;
(b) homo-pack:   the same with Eq. 1 packing;
(c) hetero-static: the best single heterogeneous proposal candidate that holds the context length;
(d) hydraplan:   the engine's per-iteration choice among the candidates (plus the homogeneous one, so (d) <= (b))
                 and, as `pack` does by default, the strategies it makes for the batch.
hydraplan-delay is (d) on the batches after hydraplan's outlier delay (solve.delay).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hydraplan.core.batch import Batch
from hydraplan.core.cluster import Cluster
from hydraplan.core.schema import Candidate, PipelineSpec, Scheme, Strategies
from hydraplan.engine.candidate import CandidateSolution
from hydraplan.engine.planner import Planner
from hydraplan.engine.settings import PlanSettings
from hydraplan.methods import baselines as bl
from hydraplan.solve.delay import hydraplan_rule, outlier_delay, stream_batches
from hydraplan.solve.proposal import strategy_label

HOMO_NAME = "homo"


@dataclass
class MethodRun:
    name: str
    plans: list[bl.IterationPlan]
    static: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    note: str = ""


def homo_candidate(scheme: Scheme, gpus: int) -> Candidate:
    spec = PipelineSpec(tp=scheme.tp, pp=scheme.pp, cp=scheme.cp, recompute=scheme.recompute)
    return Candidate(name=HOMO_NAME, pipelines=[spec] * (gpus // scheme.gpus))


def _from_solution(name: str, schemes: Sequence[Scheme], lengths: np.ndarray, groups: Sequence[Sequence[np.ndarray]],
                   gpus: int) -> bl.IterationPlan:
    pipes = tuple(bl.run_pipeline(s, lengths, mbs) for s, mbs in zip(schemes, groups, strict=True))
    used = sum(s.gpus for s in schemes)
    return bl.IterationPlan(name, "", lengths, (bl.Phase(name, pipes, gpus - used),))


def _homo_maxlen(sol: CandidateSolution, schemes: Sequence[Scheme], lengths: np.ndarray, gpus: int) -> bl.IterationPlan:
    """The homogeneous candidate's own dispatch re-packed with FFD, so (a) and (b) differ only in packing."""
    assert sol.pipelines is not None
    owned = [np.concatenate(p.micro_batches) if p.micro_batches else np.zeros(0, np.int64) for p in sol.pipelines]
    groups = [[idx[b] for b in bl.ffd(lengths[idx], sch.max_len)] for idx, sch in zip(owned, schemes, strict=True)]
    return _from_solution("homo-maxlen", schemes, lengths, groups, gpus)


def _named(plans: list[bl.IterationPlan], method: str, strategy: str | None = None) -> list[bl.IterationPlan]:
    return [bl.IterationPlan(method, strategy or p.method, p.lengths, p.phases) for p in plans]


def run_hydra(batches: list[np.ndarray], cluster: Cluster, proposed: Strategies, context_len: int, seed: int,
              homo: Scheme, methods: Sequence[str], advance: Callable[[str], None]) -> dict[str, MethodRun]:
    """hydraplan and the ablations on the batches (module docstring), each batch planned by the engine with
    the same per-iteration seed as `pack`."""
    strategies = Strategies(candidates=[*proposed.candidates, homo_candidate(homo, cluster.gpus)], context_len=context_len)
    settings = PlanSettings(seed=seed, prune=False)
    planner = Planner.for_cluster(cluster, strategies, settings, context_len)
    cands = planner.candidates
    labels = {c.name: strategy_label(c) for c in planner.strategies.candidates}
    per_cand: dict[str, list[bl.IterationPlan | None]] = {c.name: [] for c in cands}
    homo_maxlen: list[bl.IterationPlan] = []
    dynamic: list[bl.IterationPlan] = []
    for it, lengths in enumerate(batches):
        sel = planner.select(Batch.of_lengths(lengths, it))
        for k, c in enumerate(cands):
            sol = sel.solutions[k]
            if sol.pipelines is None:
                per_cand[c.name].append(None)
                continue
            per_cand[c.name].append(_from_solution(c.name, c.schemes, lengths, [p.micro_batches for p in sol.pipelines],
                                                   cluster.gpus))
            if c.name == HOMO_NAME:
                homo_maxlen.append(_homo_maxlen(sol, c.schemes, lengths, cluster.gpus))
        assert sel.winner is not None
        if sel.winner < len(cands):
            won_plan = per_cand[cands[sel.winner].name][-1]
            assert won_plan is not None  # the winner has a solution
            dynamic.append(won_plan)
        else:  # a strategy made for the batch
            won, sol = sel.contenders[sel.winner], sel.solutions[sel.winner]
            assert sol.pipelines is not None
            dynamic.append(_from_solution(won.name, won.schemes, lengths, [p.micro_batches for p in sol.pipelines],
                                          cluster.gpus))
        advance("hydraplan")
    complete = {name: [p for p in plans if p is not None] for name, plans in per_cand.items()
                if all(p is not None for p in plans)}
    homo_label = f"{homo.label}x{cluster.gpus // homo.gpus}"
    runs = {
        "homo-maxlen": MethodRun("homo-maxlen", _named(homo_maxlen, "homo-maxlen", homo_label), homo_label),
        "homo-pack": MethodRun("homo-pack", _named(complete[HOMO_NAME], "homo-pack", homo_label), homo_label),
    }
    score = bl.objective_score(cluster)
    static = [c for c in cands if c.name != HOMO_NAME and c.name in complete and c.max_len >= context_len]
    hetero = [c for c in static if len({s.key for s in c.schemes}) > 1] or static
    if hetero:
        best = min(hetero, key=lambda c: np.mean([score(p) for p in complete[c.name]]))
        runs["hetero-static"] = MethodRun("hetero-static", _named(complete[best.name], "hetero-static"), best.name)
    runs["hydraplan"] = MethodRun("hydraplan", _named(dynamic, "hydraplan"), "dynamic")
    for run in runs.values():
        run.labels = {s: labels[s] for s in {p.strategy for p in run.plans} | {run.static} if s in labels}
    return {k: v for k, v in runs.items() if k in methods}


def run_hydra_delay(batches: list[np.ndarray], cluster: Cluster, proposed: Strategies, dataset_lengths: np.ndarray,
                    context_len: int, tokens_per_iter: int, seed: int, homo: Scheme,
                    advance: Callable[[str], None]) -> MethodRun:
    """hydraplan, planned exactly as run_hydra does, on the batches after hydraplan's outlier delay (drained
    by the last iteration, so it trains exactly the sampled sequences)."""
    rule = hydraplan_rule(dataset_lengths, tokens_per_iter)
    delayed = list(outlier_delay(stream_batches(batches), rule, len(batches)))
    run = run_hydra([d.lengths for d in delayed], cluster, proposed, context_len, seed, homo, ("hydraplan",),
                    advance)["hydraplan"]
    plans = [bl.IterationPlan("hydraplan-delay", p.strategy, p.lengths, p.phases, delayed_token_iters=d.delayed_token_iters)
             for p, d in zip(run.plans, delayed, strict=True)]
    note = (f"outliers: sequences longer than {rule.thresholds[0]} tokens (under one per iteration in the dataset); "
            f"released together once they hold {rule.tokens} tokens, or after {rule.max_wait} iterations")
    return MethodRun("hydraplan-delay", plans, run.static, run.labels, note)
