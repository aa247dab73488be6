"""CAD in `compare`: the best CAD plan of every batch as a baselines.IterationPlan, and hydraplan-cad's choice
per iteration between it and the heterogeneous plan."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hydraplan.core.cluster import Cluster
from hydraplan.core.errors import UserError
from hydraplan.methods import baselines as bl
from hydraplan.solve.cad import CADResult, best_cad


def as_iteration_plan(result: CADResult, lengths: np.ndarray, cluster: Cluster) -> bl.IterationPlan:
    """A CAD result as a baselines.IterationPlan: one pipeline per replica, one micro-batch per step (each
    document listed once, on the replica holding its first token), micro-batch times = the steps' times,
    latency = the CAD estimate."""
    sec = result.section
    scheme = cluster.scheme(sec.key)
    assert scheme is not None  # CAD planned the section on one of the cluster's schemes
    times = np.array([s.time_s for s in sec.steps])
    pipes = []
    for j in range(sec.replicas):
        mbs = tuple(np.array(sorted(pc.seq for pc in s.pieces if pc.rank == j and pc.start == 0), dtype=np.int64)
                    for s in sec.steps)
        pipes.append(bl.PipelineRun(scheme, mbs, times, result.estimate_s))
    label = f"cad {scheme.label}x{sec.replicas}"
    return bl.IterationPlan("cad", label, lengths, (bl.Phase(label, tuple(pipes), 0),))


def run_cad(batches: Sequence[np.ndarray], cluster: Cluster) -> list[bl.IterationPlan]:
    """The best CAD plan of every batch, as baselines.IterationPlans (UserError if one cannot be planned)."""
    out = []
    for it, lengths in enumerate(batches):
        r = best_cad(cluster, lengths)
        if r is None:
            raise UserError(f"methods cad: iteration {it}: no cp=1 scheme holds the batch within MaxLen", "methods")
        out.append(as_iteration_plan(r, np.asarray(lengths), cluster))
    return out


def choose(score, hetero: Sequence[bl.IterationPlan], cad_plans: Sequence[bl.IterationPlan]) -> list[bl.IterationPlan]:
    """Per iteration the plan with the lower score (baselines.objective_score; ties: the heterogeneous one)."""
    out = []
    for h, c in zip(hetero, cad_plans, strict=True):
        won = c if score(c) < score(h) else h
        out.append(bl.IterationPlan("hydraplan-cad", won.strategy, won.lengths, won.phases, won.overhead_s))
    return out
