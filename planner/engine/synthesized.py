"""Strategies synthesized for one batch (solve/synthesis.py) run through the Planner's candidate loop: placed
next to the candidates' ranks, bounded, dispatched and packed like a candidate."""

from __future__ import annotations

import numpy as np

from hydraplan.core.sync import objective_transfer_s
from hydraplan.solve.synthesis import place_reusing, specs_of, synthesize, worth_trying

NAME = "batch:"  # synthesized strategies are named batch:0, batch:1, ... in a plan and its summary


def solve_synthesized(planner, lengths: np.ndarray, longest_first: np.ndarray, seed: int, best: tuple[float, int],
                      pack_budget_s: float) -> tuple[list, list, tuple[float, int]]:
    """Strategies made for this batch, placed, dispatched and packed after the planner's candidates (which set
    `best`, (score in the planner's objective, index)); returns them as resolved candidates, their solutions
    (indexed after the candidates) and the new best. Shaped and scored in the planner's objective (end to end:
    each scheme's transfer enters the MILP), pruned against the candidates' best exactly like a candidate;
    ties keep the candidate."""
    from hydraplan.engine.planner import ResolvedCandidate, candidate_bound

    schemes = list(planner.view.schemes)
    transfer = objective_transfer_s(planner.profile, np.array([s.tp for s in schemes]), np.array([s.pp for s in schemes]),
                                    planner.gpus, planner.objective)
    if not worth_trying(lengths, schemes, planner.gpus, best[0], transfer):
        return [], [], best
    index = {s.key: k for k, s in enumerate(schemes)}
    prefer = sorted({index[s.key] for c in planner.candidates for s in c.schemes if s.key in index})
    known = [p for c in planner.candidates for p in c.specs]
    out, sols = [], []
    for j, counts in enumerate(synthesize(lengths, schemes, planner.gpus, upper=best[0], transfer=transfer,
                                          prefer=prefer)):
        specs = place_reusing(specs_of(counts, schemes), known, planner.gpus, planner.view.gpu.gpus_per_node)
        k = len(planner.candidates) + j
        cand = ResolvedCandidate(f"{NAME}{j}", tuple(specs), tuple(schemes[index[p.key]] for p in specs),
                                 tuple(float(transfer[index[p.key]]) for p in specs))
        sol, best = planner.prune_or_solve(cand, k, lengths, candidate_bound(cand, lengths, longest_first), best, seed,
                                           pack_budget_s)
        out.append(cand)
        sols.append(sol)
    return out, sols, best
