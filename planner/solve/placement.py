"""Rank placement: concrete GPUs for every pipeline of a strategy, on a fixed family of rank sets.

A pipeline's ranks are listed in the order of docs/formats.md (ranks[(s*cp + c)*tp + t]): each stage is a
block of tp*cp consecutive ranks, its TP groups runs of tp inside it and its CP groups every tp-th rank of
it. Placement puts every stage on an aligned block (ranks [k*S, (k+1)*S) for S = tp*cp), so every TP and
CP group a plan can have belongs to one family fixed by the schemes and the GPU count (`family`), which
the runtime creates once at start-up: no plan, however its strategy was chosen, makes a new one.

Within that rule placement keeps TP x CP groups, and every pipeline that fits in one node, inside a node:
pipelines of at least a node take whole free nodes (from a node boundary that is a multiple of S), the
rest go to the first node with an aligned run of free GPUs for them, widest first (first-fit decreasing),
and when fragmentation leaves no such run a pipeline takes the lowest free aligned blocks, one per stage.
Widest first, power-of-two sizes always find room so; only sizes that fit no aligned block (say tp = 6 on
8-GPU nodes) may end on the lowest free ranks, off the family. Pipelines that already carry ranks
(hand-written files) keep them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from hydraplan.core.errors import UserError
from hydraplan.core.schema import PipelineSpec


def place_ranks(pipelines: Sequence[PipelineSpec], gpus: int, gpus_per_node: int) -> list[PipelineSpec]:
    """The pipelines, in the given order, with ranks in [0, gpus), disjoint, node-aware, stages on aligned blocks."""
    if gpus_per_node < 1:
        raise UserError(f"gpus_per_node must be positive (got {gpus_per_node})", "gpus_per_node")
    need = sum(p.gpus for p in pipelines)
    if need > gpus:
        raise UserError(f"gpus {gpus}: the strategy needs {need} GPUs", "gpus")
    taken = [False] * gpus
    for i, p in enumerate(pipelines):
        for r in p.ranks or ():
            if r >= gpus or taken[r]:
                what = f"is outside the run's {gpus} GPUs" if r >= gpus else "is used twice"
                raise UserError(f"pipelines.{i}.ranks: rank {r} {what}")
            taken[r] = True
    free = _Free(taken, gpus_per_node)
    out = list(pipelines)
    for i in sorted((i for i, p in enumerate(pipelines) if p.ranks is None), key=lambda i: -pipelines[i].gpus):
        p = pipelines[i]
        out[i] = PipelineSpec(tp=p.tp, pp=p.pp, cp=p.cp, recompute=p.recompute, ranks=free.place(p.tp * p.cp, p.pp))
    return out


class _Free:
    """Free ranks as one bit mask per node. Free GPUs only ever get fewer, so the first node that can take a
    run, the first run of whole free nodes and the first free aligned block never move left: a cursor per
    kind of request makes placing thousands of pipelines (8192 GPUs) linear in the nodes."""

    def __init__(self, taken: list[bool], gpus_per_node: int):
        self.gpus, self.gpn = len(taken), gpus_per_node
        bases = range(0, self.gpus, gpus_per_node)
        self.size = [min(gpus_per_node, self.gpus - b) for b in bases]
        self.mask = [sum(1 << (r - b) for r in range(b, b + sz) if not taken[r]) for b, sz in zip(bases, self.size)]
        self.cursor: dict[tuple[str, int, int], int] = {}

    def place(self, S: int, pp: int) -> list[int]:
        """pp stage blocks of S ranks: one aligned run inside a node or over whole nodes, else any free
        aligned blocks, else (off the family) the lowest free ranks."""
        g = S * pp
        x = self._whole_nodes(S, g) if g >= self.gpn else self._in_node(S, g)
        if x is not None:
            ranks = list(range(x, x + g))
        else:
            blocks = self._blocks(S, pp)
            ranks = [r for b in blocks for r in range(b, b + S)] if blocks is not None else self._lowest(g)
        for r in ranks:
            self.mask[r // self.gpn] &= ~(1 << (r % self.gpn))
        return ranks

    def _full(self, n: int) -> bool:
        return self.mask[n] == (1 << self.size[n]) - 1

    def _in_node(self, S: int, g: int) -> int | None:
        """First rank of the first aligned run of g free ranks inside one node."""
        key = ("node", S, g)
        win = (1 << g) - 1
        for n in range(self.cursor.get(key, 0), len(self.mask)):
            m, base = self.mask[n], n * self.gpn
            if m.bit_count() < g:
                continue
            for x in range(-(-base // S) * S, base + self.size[n] - g + 1, S):
                if m & (win << (x - base)) == win << (x - base):
                    self.cursor[key] = n
                    return x
        self.cursor[key] = len(self.mask)
        return None

    def _whole_nodes(self, S: int, g: int) -> int | None:
        """First rank of a run of entirely free nodes holding g ranks, starting at a multiple of S."""
        key = ("whole", S, g)
        n, N = self.cursor.get(key, 0), len(self.mask)
        while n < N:
            if (n * self.gpn) % S or not self._full(n):
                n += 1
                continue
            got, m = 0, n
            while m < N and got < g and self._full(m):
                got, m = got + self.size[m], m + 1
            if got >= g:
                self.cursor[key] = n
                return n * self.gpn
            n = m + 1  # every start up to m runs into node m (not entirely free) or the end
        self.cursor[key] = N
        return None

    def _is_free(self, x: int, S: int) -> bool:
        return all(self.mask[r // self.gpn] >> (r % self.gpn) & 1 for r in range(x, x + S))

    def _blocks(self, S: int, count: int) -> list[int] | None:
        """The lowest `count` free aligned blocks of S ranks (None: fewer are free)."""
        key = ("block", S, 0)
        found: list[int] = []
        for k in range(self.cursor.get(key, 0), self.gpus // S):
            if self._is_free(k * S, S):
                if not found:
                    self.cursor[key] = k
                found.append(k * S)
                if len(found) == count:
                    return found
        if not found:
            self.cursor[key] = self.gpus // S
        return None

    def _lowest(self, g: int) -> list[int]:
        """Fallback when no aligned blocks are left (sizes that fit none): the lowest free ranks."""
        free = (r for n, m in enumerate(self.mask) for r in range(n * self.gpn, n * self.gpn + self.size[n])
                if m >> (r - n * self.gpn) & 1)
        return [next(free) for _ in range(g)]


def check_ranks(ranks_per_pipeline: Sequence[Sequence[int]], gpus: int) -> list[tuple[int, str]]:
    """(pipeline index, problem) for ranks out of [0, gpus) or shared between/within pipelines."""
    flat = np.fromiter((r for ranks in ranks_per_pipeline for r in ranks), dtype=np.int64)
    if not flat.size or (flat.min() >= 0 and flat.max() < gpus and np.bincount(flat).max() == 1):
        return []  # the common case, at once (10^5 pipelines at 8192 GPUs); the loop below names each problem
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
    if len(ranks) != tp * pp * cp or gpus_per_node < 1 or min(ranks) // gpus_per_node == max(ranks) // gpus_per_node:
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


def family(keys: Iterable[tuple], gpus: int) -> list[tuple[int, ...]]:
    """Every TP and CP group (of more than one rank) that pipelines of these schemes (tp, pp, cp[, recompute])
    have when their stages sit on aligned blocks, as place_ranks puts them: per (tp, cp), in each block
    [k*S, (k+1)*S) of S = tp*cp ranks, its TP groups (runs of tp) and CP groups (every tp-th rank); schemes
    that differ only in recomputation have the same groups. In a fixed order, the one in which every rank
    creates its own (runtime/groups.py)."""
    out: dict[tuple[int, ...], None] = {}
    for tp, cp in sorted({(k[0], k[2]) for k in keys}):
        S = tp * cp
        for x in range(0, gpus - S + 1, S):
            if tp > 1:
                out.update((tuple(range(x + c * tp, x + (c + 1) * tp)), None) for c in range(cp))
            if cp > 1:
                out.update((tuple(range(x + t, x + S, tp)), None) for t in range(tp))
    return list(out)


def groups_per_rank(groups: Iterable[Sequence[int]], gpus: int) -> np.ndarray:
    """How many of the groups each rank belongs to (each group a communicator its members set up)."""
    members = [r for g in groups for r in g]
    return np.bincount(np.asarray(members, dtype=np.int64), minlength=gpus)


def replica_ranks(gpus_per_replica: int, replica: int) -> list[int]:
    """CAD's layout (engine/cad_plan.py): replica j of a homogeneous cp = 1 scheme on ranks [j*g, (j+1)*g), so
    its stages sit on aligned blocks too."""
    return list(range(replica * gpus_per_replica, (replica + 1) * gpus_per_replica))


def cad_groups(keys: Iterable[tuple], gpus: int) -> list[tuple[int, ...]]:
    """The exchange groups of CAD plans on these cp = 1 schemes, as many replicas as fit: per layout (tp, pp,
    cp; recomputation changes none) and TP rank t, the replicas' ranks at t (runtime/cad.py)."""
    out: dict[tuple[int, ...], None] = {}
    for tp, pp, cp in sorted({tuple(k[:3]) for k in keys}):
        g = tp * pp * cp
        replicas = [replica_ranks(g, j) for j in range(gpus // g)]
        if len(replicas) > 1:
            out.update((tuple(r[t] for r in replicas), None) for t in range(tp))
    return list(out)
