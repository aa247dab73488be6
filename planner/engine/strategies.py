"""Candidate strategies as a run uses them: checked against the cluster, ranks placed, the static
baseline's layout added."""

from __future__ import annotations

import hashlib
import warnings

from hydraplan.core.cluster import Cluster
from hydraplan.core.errors import UserError
from hydraplan.core.schema import Candidate, PipelineSpec, Scheme, Strategies
from hydraplan.solve.placement import check_ranks, place_ranks, split_groups
from hydraplan.store.fileio import model_json

STATIC_CANDIDATE = "static"


def resolve_strategies(strategies: Strategies, cluster: Cluster, *, context_len: int | None = None,
                       source: str = "strategies") -> Strategies:
    """Check a (possibly hand-written) strategies file against the cluster and fill its derived fields:
    ranks (placed around any the file gives), max_len per candidate, profile, gpus and context_len."""
    names = [c.name for c in strategies.candidates]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise UserError(f"{source}: field candidates.{i}.name: duplicate candidate name (got {name!r})")
    gpus = cluster.gpus
    out: list[Candidate] = []
    for ci, cand in enumerate(strategies.candidates):
        where = f"{source}: field candidates.{ci}"
        schemes = []
        for pi, p in enumerate(cand.pipelines):
            scheme = cluster.scheme(p.key)
            if scheme is None:
                have = " ".join(s.label for s in cluster.schemes)
                raise UserError(
                    f"{where}.pipelines.{pi}: scheme {p.label} is not in profile {cluster.name} "
                    f"for {gpus} GPUs (it has {have})"
                )
            schemes.append(scheme)
        if cand.gpus > gpus:
            raise UserError(f"{where}: candidate {cand.name} uses {cand.gpus} GPUs, the run has {gpus}")
        problems = check_ranks([p.ranks or [] for p in cand.pipelines], gpus)
        if problems:
            pi, problem = problems[0]
            raise UserError(f"{where}.pipelines.{pi}.ranks: {problem}")
        pipelines = list(cand.pipelines)
        if any(p.ranks is None for p in pipelines):  # placed around the ranks the file gives
            pipelines = place_ranks(pipelines, gpus, cluster.gpus_per_node)
        out.append(cand.model_copy(update={"pipelines": pipelines, "max_len": max(s.max_len for s in schemes)}))
    return strategies.model_copy(update={
        "profile": cluster.name, "gpus": gpus, "context_len": context_len or strategies.context_len, "candidates": out,
    })


class PlacementWarning(UserWarning):
    """Legal but likely slow: a TP/CP group across nodes, a candidate that cannot hold the context."""


def short_candidates(strategies: Strategies, cluster: Cluster) -> list[tuple[int, str]]:
    """(candidate index, message) for candidates whose largest MaxLen is below the run's context length:
    they can never plan an iteration that holds a sequence of that length. Proposed candidates meant for
    shorter iterations (their optimal_for range ends within their MaxLen) are not reported."""
    if strategies.context_len is None:
        return []
    out = []
    for i, cand in enumerate(strategies.candidates):
        lens = [s.max_len for p in cand.pipelines if (s := cluster.scheme(p.key)) is not None]
        longest = cand.max_len if cand.max_len is not None else max(lens, default=0)
        if cand.optimal_for is not None and cand.optimal_for[1] <= longest:
            continue  # proposed for shorter iterations (its L' range ends where it fits): by design
        if longest < strategies.context_len:
            out.append((i, f"candidate {cand.name} holds at most {longest} tokens, below the context length "
                           f"{strategies.context_len}: it can only plan iterations without such a sequence"))
    return out


def warn_placement(strategies: Strategies, cluster: Cluster, context_len: int) -> None:
    """The placement findings of `hydraplan validate`, as warnings before planning starts."""
    for cand in strategies.candidates:
        for pi, p in enumerate(cand.pipelines):
            for problem in split_groups(p.ranks or [], p.tp, p.pp, p.cp, cluster.gpus_per_node):
                warnings.warn(f"candidate {cand.name} pipeline {pi}: {problem}", PlacementWarning, stacklevel=2)
    short = short_candidates(strategies.model_copy(update={"context_len": context_len}), cluster)
    if len(short) < len(strategies.candidates):  # none holds it: planning stops with an error naming the length
        for _, message in short:
            warnings.warn(message, PlacementWarning, stacklevel=2)


def strategies_digest(strategies: Strategies) -> str:
    return hashlib.sha256(model_json(strategies).encode()).hexdigest()


def with_static_candidate(strategies: Strategies, scheme: Scheme, cluster: Cluster,
                          context_len: int | None) -> Strategies:
    """The candidates plus the static baseline's layout (`scheme` on every GPU, named STATIC_CANDIDATE)
    unless one of them is that layout already: then every plan is at least as fast as the best static
    layout packed by our solvers (the proposal's homogeneous fallback is chosen by the DP's expectation,
    which can prefer another scheme). Idempotent, so a resumed run's strategies.json gets nothing added twice."""
    d = cluster.gpus // scheme.gpus
    layout = [scheme.key] * d
    if any(sorted(p.key for p in c.pipelines) == layout for c in strategies.candidates):
        return strategies
    name = STATIC_CANDIDATE
    while name in {c.name for c in strategies.candidates}:
        name += "'"
    spec = PipelineSpec(tp=scheme.tp, pp=scheme.pp, cp=scheme.cp, recompute=scheme.recompute)
    static = Candidate(name=name, pipelines=[spec] * d, kind="homogeneous", sources=["static-baseline"])
    added = strategies.model_copy(update={"candidates": [*strategies.candidates, static]})
    return resolve_strategies(added, cluster, context_len=context_len, source="strategies")
