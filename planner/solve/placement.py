"""Rank placement: concrete GPUs for every pipeline of a strategy.

A pipeline's ranks are listed in the order of docs/formats.md (ranks[(s*cp + c)*tp + t]), so a contiguous block of
ranks puts each stage's TP x CP group on consecutive GPUs. Placement keeps those groups, and every
pipeline that fits in one node, inside a node: pipelines of at least a node take whole free nodes
(starting at a node boundary), the rest are first-fit-decreasing bin-packed into the nodes' free GPUs.
Only when fragmentation leaves no such room (never for power-of-two sizes) does a pipeline take the
lowest free ranks. Pipelines that already carry ranks (hand-written files) keep them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from hydraplan.core.errors import UserError
from hydraplan.core.schema import PipelineSpec


def place_ranks(pipelines: Sequence[PipelineSpec], gpus: int, gpus_per_node: int) -> list[PipelineSpec]:
    """The pipelines, in the given order, with ranks in [0, gpus), disjoint, node-aware."""
    if gpus_per_node < 1:
        raise UserError(f"--gpus-per-node must be positive (got {gpus_per_node})")
    need = sum(p.gpus for p in pipelines)
    if need > gpus:
        raise UserError(f"strategy needs {need} GPUs but --gpus is {gpus}")
    taken = [False] * gpus
    for i, p in enumerate(pipelines):
        for r in p.ranks or ():
            if r >= gpus or taken[r]:
                what = "is outside [0, --gpus)" if r >= gpus else "is used twice"
                raise UserError(f"pipelines.{i}.ranks: rank {r} {what} (--gpus {gpus})")
            taken[r] = True
    nodes = _Nodes(taken, gpus_per_node)
    out: list[list[int] | None] = [list(p.ranks) if p.ranks is not None else None for p in pipelines]
    todo = sorted((i for i, p in enumerate(pipelines) if p.ranks is None), key=lambda i: -pipelines[i].gpus)
    for i in todo:
        g = pipelines[i].gpus
        out[i] = nodes.whole(g) if g >= gpus_per_node else nodes.within_one(g)
    return [PipelineSpec(tp=p.tp, pp=p.pp, cp=p.cp, recompute=p.recompute, ranks=r) for p, r in zip(pipelines, out, strict=True)]


class _Nodes:
    """Free ranks per node (ascending). Free counts only shrink, so the first node that can take g ranks,
    or start a run of whole free nodes for g, never moves left: a cursor per g makes placing thousands of
    pipelines (8192 GPUs) linear in the nodes, not pipelines x nodes."""

    def __init__(self, taken: list[bool], gpus_per_node: int):
        gpus = len(taken)
        self.size = [min(gpus_per_node, gpus - n) for n in range(0, gpus, gpus_per_node)]
        self.free = [[r for r in range(n, n + sz) if not taken[r]] for n, sz in zip(range(0, gpus, gpus_per_node), self.size)]
        self.first_fit: dict[int, int] = {}  # g -> no node before this one has g free ranks
        self.first_run: dict[int, int] = {}  # g -> no run of whole free nodes for g starts before this node

    def _take(self, node: int, g: int) -> list[int]:
        ranks, self.free[node] = self.free[node][:g], self.free[node][g:]
        return ranks

    def whole(self, g: int) -> list[int]:
        """g ranks from a run of consecutive entirely free nodes, starting at a node boundary."""
        run_start, run = self.first_run.get(g, 0), 0
        for n in range(run_start, len(self.free)):
            if len(self.free[n]) != self.size[n]:
                run_start, run = n + 1, 0
                continue
            run += self.size[n]
            if run >= g:
                self.first_run[g] = run_start
                return self._take_run(run_start, n, g)
        self.first_run[g] = len(self.free)
        return self.lowest(g)

    def _take_run(self, first: int, last: int, g: int) -> list[int]:
        ranks: list[int] = []
        for m in range(first, last + 1):
            ranks += self._take(m, g - len(ranks))
        return ranks

    def within_one(self, g: int) -> list[int]:
        """Lowest free ranks of the first node with g free GPUs (first fit)."""
        for n in range(self.first_fit.get(g, 0), len(self.free)):
            if len(self.free[n]) >= g:
                self.first_fit[g] = n
                return self._take(n, g)
        self.first_fit[g] = len(self.free)
        return self.lowest(g)

    def lowest(self, g: int) -> list[int]:
        """Fallback when fragmentation leaves no node-respecting room: the lowest free ranks."""
        ranks: list[int] = []
        for n in range(len(self.free)):
            if len(ranks) == g:
                break
            ranks += self._take(n, g - len(ranks))
        return sorted(ranks)


def check_ranks(ranks_per_pipeline: Sequence[Sequence[int]], gpus: int) -> list[tuple[int, str]]:
    """(pipeline index, problem) for ranks out of [0, gpus) or shared between/within pipelines."""
    problems: list[tuple[int, str]] = []
    owner: dict[int, int] = {}
    for p, ranks in enumerate(ranks_per_pipeline):
        bad = sorted({r for r in ranks if not 0 <= r < gpus})
        if bad:
            problems.append((p, f"ranks {bad} out of range [0, {gpus})"))
        for r, n in sorted(Counter(ranks).items()):
            if n > 1:
                problems.append((p, f"rank {r} listed {n} times"))
        for r in sorted(set(ranks)):
            if r in owner and owner[r] != p:
                problems.append((p, f"rank {r} also used by pipeline {owner[r]}"))
            owner.setdefault(r, p)
    return problems


def split_groups(ranks: Sequence[int], tp: int, pp: int, cp: int, gpus_per_node: int) -> list[str]:
    """TP and CP groups of one pipeline (ranks[(s*cp + c)*tp + t], docs/formats.md) that cross a node boundary
    although they could sit in one node: their collectives then run on the inter-node network every
    layer, which the profile's times do not model. A TP group wider than a node, or a CP group whose
    stage block (tp*cp ranks) is, must span nodes and is not reported."""
    if len(ranks) != tp * pp * cp or gpus_per_node < 1:
        return []
    out = []

    def check(kind: str, s: int, group: list[int]) -> None:
        nodes = sorted({r // gpus_per_node for r in group})
        if len(nodes) > 1:
            out.append(f"stage {s} {kind} group on ranks {group} spans nodes {nodes} ({gpus_per_node} GPUs per node)")

    for s in range(pp):
        if tp > 1 and tp <= gpus_per_node:
            for c in range(cp):
                check("TP", s, list(ranks[(s * cp + c) * tp:(s * cp + c + 1) * tp]))
        if cp > 1 and tp * cp <= gpus_per_node:
            for t in range(tp):
                check("CP", s, [ranks[(s * cp + c) * tp + t] for c in range(cp)])
    return out


def place_reusing(specs: Sequence[PipelineSpec], known: Iterable[PipelineSpec], gpus: int,
                  gpus_per_node: int) -> list[PipelineSpec]:
    """Ranks for `specs`, reusing the rank lists of `known` pipelines of the same scheme where they are still
    free (in the order given: earlier ones are preferred); the rest placed node-aware around them."""
    pool: dict[tuple[int, int, int], dict[tuple[int, ...], None]] = {}  # insertion-ordered sets
    for p in known:  # by <tp,pp,cp>: recomputing or not, a layout's process groups are the same
        if p.ranks is not None:
            pool.setdefault(p.key[:3], {})[tuple(p.ranks)] = None
    # a rank list found taken stays taken: each scheme's scan only moves on (one iterator per scheme)
    scan = {k: iter(v) for k, v in pool.items()}
    taken: set[int] = set()
    out = []
    for p in specs:
        pick = next((r for r in scan.get(p.key[:3], ()) if taken.isdisjoint(r)), None)
        if pick is not None:
            taken.update(pick)
        out.append(PipelineSpec(tp=p.tp, pp=p.pp, cp=p.cp, recompute=p.recompute, ranks=None if pick is None else list(pick)))
    return place_ranks(out, gpus, gpus_per_node)


def process_groups(pipelines: Iterable[PipelineSpec]) -> set[tuple[int, ...]]:
    """The TP and CP groups (more than one rank) the runtime creates for these pipelines (runtime/groups.py)."""
    out: set[tuple[int, ...]] = set()
    for p in pipelines:
        ranks = list(p.ranks or [])
        for s in range(p.pp):
            stage = ranks[s * p.tp * p.cp:(s + 1) * p.tp * p.cp]
            out.update(g for g in (tuple(stage[c * p.tp:(c + 1) * p.tp]) for c in range(p.cp)) if len(g) > 1)
            out.update(g for g in (tuple(stage[t::p.tp]) for t in range(p.tp)) if len(g) > 1)
    return out
