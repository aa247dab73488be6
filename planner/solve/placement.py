"""Rank placement: concrete GPUs for every pipeline of a strategy.

A pipeline's ranks are listed in the order of docs/formats.md (ranks[(s*cp + c)*tp + t]), so a contiguous block of
ranks puts each stage's TP x CP group on consecutive GPUs. Placement keeps those groups, and every
pipeline that fits in one node, inside a node: pipelines of at least a node take whole free nodes
(starting at a node boundary), the rest are first-fit-decreasing bin-packed into the nodes' free GPUs.
Only when fragmentation leaves no such room (never for power-of-two sizes) does a pipeline take the
lowest free ranks. Pipelines that already carry ranks (hand-written files) keep them.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    return [PipelineSpec(tp=p.tp, pp=p.pp, cp=p.cp, ranks=r) for p, r in zip(pipelines, out, strict=True)]


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
