"""Strategies made for one batch (solve.synthesis), as contenders of the engine's selection loop.

LNK pulls every parameter every iteration anyway, so any iteration may run any strategy: the candidate list
only saves solver time. The strategies are shaped and scored in the cluster's objective (end to end: each
scheme's transfer enters the MILP). Solving needs only their schemes, so ranks are placed for the winner
alone (engine.assemble.build_plan), like the candidates, stages on aligned blocks: their TP and CP groups are
among those the runtime created at start-up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Set

import numpy as np

from hydraplan.core.cluster import Cluster
from hydraplan.engine.candidate import ResolvedCandidate
from hydraplan.solve.synthesis import NAME, NEAR_PIPELINES, neighbors, specs_of, synthesize

ROUNDS = 1  # rounds of strategies one pipeline away from the winner, while one of them wins


def strategies(cluster: Cluster, candidate_keys: Set[tuple], lengths: np.ndarray, best_s: float
               ) -> list[ResolvedCandidate]:
    """The strategies the any-strategy relaxation shapes for this batch below `best_s` (the candidates' best score),
    placed and resolved, in the order to try them; none when it shows none can win. `candidate_keys`: the
    schemes the candidates use, offered besides the relaxation's shortlist."""
    index = cluster.scheme_index
    prefer = sorted(index[key] for key in candidate_keys if key in index)
    made = synthesize(lengths, list(cluster.schemes), cluster.gpus, upper=best_s, transfer=cluster.scheme_charges_s,
                      prefer=prefer)
    return [_resolved(cluster, counts, j) for j, counts in enumerate(made)]


def around(cluster: Cluster, won: ResolvedCandidate, tried: list[ResolvedCandidate]) -> list[ResolvedCandidate]:
    """The strategies one pipeline away from `won` (the batch's winner so far, when small: solve.synthesis.neighbors)
    that are not among `tried` (the batch's contenders so far), named on from the strategies made for it."""
    if len(won.specs) > NEAR_PIPELINES:
        return []
    seen = {_counts(cluster, c) for c in tried}
    fresh = [c for c in neighbors(dict(_counts(cluster, won)), list(cluster.schemes), cluster.gpus)
             if tuple(sorted(c.items())) not in seen]
    first = sum(c.synthesized for c in tried)
    return [_resolved(cluster, counts, first + j) for j, counts in enumerate(fresh)]


def _counts(cluster: Cluster, cand: ResolvedCandidate) -> tuple[tuple[int, int], ...]:
    return tuple(sorted(Counter(cluster.scheme_index[p.key] for p in cand.specs).items()))


def _resolved(cluster: Cluster, counts: dict[int, int], j: int) -> ResolvedCandidate:
    """Strategy j made for the batch; ranks placed only if it wins (engine.assemble.build_plan)."""
    schemes, index, transfer = cluster.schemes, cluster.scheme_index, cluster.scheme_charges_s
    specs = specs_of(counts, schemes)
    return ResolvedCandidate(f"{NAME}{j}", tuple(specs), tuple(schemes[index[p.key]] for p in specs),
                             tuple(float(transfer[index[p.key]]) for p in specs), synthesized=True)
