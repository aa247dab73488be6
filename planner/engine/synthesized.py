"""Strategies made for one batch (solve.synthesis), as contenders of the engine's selection loop.

LNK pulls every parameter every iteration anyway, so any iteration may run any strategy: the candidate list
only saves solver time. The strategies are shaped and scored in the cluster's objective (end to end: each
scheme's transfer enters the MILP). Solving needs only their schemes, so ranks are placed for the winner
alone (engine.plans.build_plan), like the candidates, stages on aligned blocks: their TP and CP groups are
among those the runtime created at start-up.
"""

from __future__ import annotations

from collections.abc import Set

import numpy as np

from hydraplan.core.cluster import Cluster
from hydraplan.engine.candidate import ResolvedCandidate
from hydraplan.solve.synthesis import NAME, specs_of, synthesize


def strategies(cluster: Cluster, candidate_keys: Set[tuple], lengths: np.ndarray, best_s: float
               ) -> list[ResolvedCandidate]:
    """The strategies the any-strategy relaxation shapes for this batch below `best_s` (the candidates' best score),
    placed and resolved, in the order to try them; none when it shows none can win. `candidate_keys`: the
    schemes the candidates use, offered besides the relaxation's shortlist."""
    schemes = list(cluster.schemes)
    transfer = cluster.charged_for(schemes)
    index = {s.key: k for k, s in enumerate(schemes)}
    prefer = sorted(index[key] for key in candidate_keys if key in index)
    out = []
    for j, counts in enumerate(synthesize(lengths, schemes, cluster.gpus, upper=best_s, transfer=transfer, prefer=prefer)):
        specs = specs_of(counts, schemes)  # ranks placed only if it wins (engine.plans.build_plan)
        out.append(ResolvedCandidate(f"{NAME}{j}", tuple(specs), tuple(schemes[index[p.key]] for p in specs),
                                     tuple(float(transfer[index[p.key]]) for p in specs), synthesized=True))
    return out
