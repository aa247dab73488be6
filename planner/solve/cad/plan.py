"""A CAD plan of a batch: every step's tasks balanced (greedy, then the MILP when small enough), and the best
plan over the schemes and step counts worth trying."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.core.cluster import Cluster
from hydraplan.core.cost import pipeline_time_from_mb, seq_cost
from hydraplan.core.schema import CADPiece, CADSection, CADStep, CADTask, Scheme
from hydraplan.solve.cad.balance_greedy import greedy
from hydraplan.solve.cad.balance_milp import milp
from hydraplan.solve.cad.model import comm_model
from hydraplan.solve.cad.step import StepProblem, assign_steps, step_problem, step_time


def solve_step(p: StepProblem, budget_s: float, exact: bool = True) -> tuple[list[int], str]:
    """Greedy, then the MILP refinement if it is small enough and strictly better."""
    rank = greedy(p, budget_s)
    solver = "greedy"
    if exact:
        out = milp(p, budget_s, rank)
        if out is not None:
            ranks, optimal = out
            if step_time(*p.loads(ranks)) < step_time(*p.loads(rank)) * (1 - 1e-9):
                rank, solver = ranks, "greedy+milp" + ("" if optimal else "/node-limit")
            elif optimal:
                solver = "greedy+milp"
    return rank, solver


# -------------------------------------------------------------------------------------------- plans
@dataclass(frozen=True)
class CADResult:
    section: CADSection
    estimate_s: float
    steps: list[list[int]]  # documents (indices into lengths) per step
    per_rank_tokens: list[list[int]]  # [step][rank]


def plan_cad(cluster: Cluster, scheme: Scheme, lengths: np.ndarray, steps: int, *,
             budget: float = 1.0, exact: bool = True, ids: Sequence[int] | None = None) -> CADResult | None:
    """A CAD plan of the batch on d = N // scheme.gpus replicas of `scheme` in `steps` steps, or None if a
    rank's tokens exceed MaxLen. `budget`: a rank's comm may use at most this fraction of the step's mean
    compute (1.0: what ping-pong can hide on an average rank)."""
    if scheme.cp != 1:
        return None
    d = cluster.gpus // scheme.gpus
    if d < 1:
        return None
    lengths = np.asarray(lengths, dtype=np.int64)
    ids = list(range(lengths.size)) if ids is None else [int(i) for i in ids]
    cm = comm_model(cluster.profile, scheme, d)
    out_steps: list[CADStep] = []
    times: list[float] = []
    per_rank_tokens: list[list[int]] = []
    docs_per_step = [v for v in assign_steps(lengths, scheme, steps) if v]
    for docs in docs_per_step:
        p = step_problem(scheme, cm, lengths, docs, d)
        tokens = np.zeros(d, dtype=np.int64)
        for _, s, e, h in p.pieces:
            tokens[h] += e - s
        if tokens.max() > scheme.max_len or tokens.min() == 0:
            return None
        mean_compute = float(p.linear.mean() + sum(p.cost) / d)
        rank, solver = solve_step(p, budget * mean_compute, exact)
        compute, comm = p.loads(rank)
        times.append(step_time(compute, comm))
        per_rank_tokens.append(tokens.tolist())
        out_steps.append(CADStep(
            pieces=[CADPiece(seq=ids[doc], start=s, end=e, rank=h) for doc, s, e, h in p.pieces],
            tasks=[CADTask(seq=ids[doc], start=s, end=e, home=h, rank=x)
                   for (doc, s, e, h), x in zip(p.tasks, rank, strict=True)],
            compute_s=compute.tolist(), comm_s=comm.tolist(), time_s=times[-1], solver=solver,
            attention_imbalance=_imbalance(compute - p.linear),
        ))
    est = pipeline_time_from_mb(times, scheme.pp)
    section = CADSection(tp=scheme.tp, pp=scheme.pp, cp=scheme.cp, recompute=scheme.recompute, replicas=d, budget=budget,
                         steps=out_steps, estimate_s=est)
    return CADResult(section, est, docs_per_step, per_rank_tokens)


def _imbalance(att: np.ndarray) -> float:
    """max / mean attention seconds per rank, minus 1 (0: perfectly balanced)."""
    m = float(att.mean())
    return float(att.max() / m - 1.0) if m > 0 else 0.0


def ideal_bound(scheme: Scheme, gpus: int, lengths: np.ndarray, steps: int) -> float:
    """Lower bound of any CAD plan of this scheme and step count: all work spread evenly, no comm exposed."""
    d = gpus // scheme.gpus
    w = float(seq_cost(scheme, lengths).sum())
    per_step = w / (d * steps) + scheme.time.c
    return per_step * steps + (scheme.pp - 1) * per_step  # the pipeline time of `steps` equal steps, closed form


def best_cad(cluster: Cluster, lengths: np.ndarray, *, top: int = 3, extra_steps: int = 2,
             budget: float = 1.0, exact: bool = True, ids: Sequence[int] | None = None) -> CADResult | None:
    """The best CAD plan in the cluster's objective over its cp = 1 schemes and step counts: the `top` (scheme,
    steps) pairs by ideal_bound, in that objective, are planned and the best kept (None if no scheme holds the
    batch). End to end, a narrow scheme's parameter pull and push can cost more than its faster steps save."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    gpus = cluster.gpus
    options = []
    for s in cluster.schemes:
        d = gpus // s.gpus
        if s.cp != 1 or d < 1:
            continue
        vmin = max(1, -(-total // (d * s.max_len)))
        for v in range(vmin, vmin + extra_steps + 1):
            if v <= lengths.size:
                options.append((objective_s(cluster, s, ideal_bound(s, gpus, lengths, v)), s.key, v, s))
    options.sort(key=lambda o: (o[0], o[1], o[2]))
    best: tuple[float, CADResult] | None = None
    tried = 0
    for _, _, v, s in options:
        if tried >= top:
            break
        r = plan_cad(cluster, s, lengths, v, budget=budget, exact=exact, ids=ids)
        if r is None:
            continue
        tried += 1
        score = objective_s(cluster, s, r.estimate_s)
        if best is None or score < best[0]:
            best = (score, r)
    return None if best is None else best[1]


def objective_s(cluster: Cluster, scheme: Scheme, propagation_s: float) -> float:
    """A CAD plan's number in the cluster's objective: every replica is one pipeline of `scheme` running the
    whole plan, so end to end it adds the pull and push that propagation cannot hide."""
    return cluster.score(propagation_s, cluster.estimate([scheme.key], [propagation_s]).iteration_s)
