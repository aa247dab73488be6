"""The communication-aware greedy of one CAD step (DistCA's idea): attention moves from the slowest rank to the
least loaded, cut at the exact query position that closes half the gap."""

from __future__ import annotations

import math

import numpy as np

from hydraplan.solve.cad.model import q_comm, task_cost
from hydraplan.solve.cad.step import StepProblem

CUT_ALIGN = 64  # greedy cut points are multiples of this (FlashAttention tile) in tasks of 4 tiles or more
GREEDY_MAX_MOVES = 4096


def _tail_cut(p: StepProblem, t: int, gap: float) -> int | None:
    """Where to cut task t so that its tail [cut, e) is worth `gap` seconds, solving a*(e^2 - x^2) = gap (None:
    move it whole)."""
    _, s, e, _ = p.tasks[t]
    if not p.cost[t] > gap:
        return None
    align = CUT_ALIGN if e - s >= 4 * CUT_ALIGN else 1
    x = math.sqrt(max(e * e - gap / p.scheme.time.a, s * s))
    cut = int(math.ceil(x / align) * align)
    return cut if s < cut < e else None


def _better(comp: np.ndarray, comm: np.ndarray, new_comp: np.ndarray, new_comm: np.ndarray, hi: int, lo: int,
            budget_s: float) -> bool:
    if new_comm[[hi, lo]].max() > budget_s and new_comm[[hi, lo]].max() > comm[[hi, lo]].max():
        return False
    before = max(np.maximum(comp, comm)[[hi, lo]])
    after = max(np.maximum(new_comp, new_comm)[[hi, lo]])
    return after < before * (1 - 1e-12)


class _Moves:
    """The greedy's state: each task's rank, every rank's compute and comm, and per (document, rank) the ends of
    the document's tasks there (the furthest is how much of its K/V prefix the rank reads)."""

    def __init__(self, p: StepProblem) -> None:
        self.p = p
        self.rank = [t[3] for t in p.tasks]
        self.compute, self.comm = p.loads(self.rank)
        self.reach: dict[tuple[int, int], list[int]] = {}
        for t, x in enumerate(self.rank):
            self.reach.setdefault((p.tasks[t][0], x), []).append(p.tasks[t][2])

    def far(self, doc: int, x: int, drop: int | None = None, add: int | None = None) -> int:
        ends = list(self.reach.get((doc, x), []))
        if drop is not None:
            ends.remove(drop)
        if add is not None:
            ends.append(add)
        return max(ends, default=0)

    def move_comm(self, t: int, hi: int, lo: int, cut: int | None) -> np.ndarray:
        """comm after task t (or its tail [cut, e)) moves from hi to lo."""
        p, far = self.p, self.far
        doc, s, e, home = p.tasks[t]
        new = self.comm.copy()
        if hi != home:
            new -= p.q(t, hi)
        tail_start = s if cut is None else cut
        if cut is not None and hi != home:
            new += q_comm(p.cm, cut - s, home, hi)
        if lo != home:
            new += q_comm(p.cm, e - tail_start, home, lo)
        hi_after = far(doc, hi, drop=e, add=cut)
        new += p.kv(doc, hi_after, hi) - p.kv(doc, far(doc, hi), hi)
        new += p.kv(doc, max(far(doc, lo), e), lo) - p.kv(doc, far(doc, lo), lo)
        return new

    def apply(self, t: int, hi: int, lo: int, cut: int | None, new_comp: np.ndarray, new_comm: np.ndarray) -> None:
        """Task t (or its tail [cut, e), split off as a new task) moves from hi to lo."""
        p = self.p
        doc, s, e, home = p.tasks[t]
        self.reach[(doc, hi)].remove(e)
        self.reach.setdefault((doc, lo), []).append(e)
        if cut is None:
            self.rank[t] = lo
        else:
            self.reach[(doc, hi)].append(cut)
            p.tasks[t] = (doc, s, cut, home)
            p.cost[t] = float(task_cost(p.scheme, s, cut))
            p.add(doc, cut, e, home)
            self.rank.append(lo)
        self.compute, self.comm = new_comp, new_comm

    def move_one(self, hi: int, lo: int, gap: float, budget_s: float) -> bool:
        """The first of hi's tasks, by attention per communicated second, whose move to lo `_better` accepts."""
        p = self.p
        mine = [t for t, x in enumerate(self.rank) if x == hi and p.cost[t] > 0]
        gain = {t: min(p.cost[t], gap) / max(float(self.move_comm(t, hi, lo, None)[[hi, lo]].sum()), 1e-30)
                for t in mine}
        for t in sorted(mine, key=lambda t: -gain[t]):
            cut = _tail_cut(p, t, gap)
            part = p.cost[t] if cut is None else float(task_cost(p.scheme, cut, p.tasks[t][2]))
            new_comp = self.compute.copy()
            new_comp[hi] -= part
            new_comp[lo] += part
            new_comm = self.move_comm(t, hi, lo, cut)
            if _better(self.compute, self.comm, new_comp, new_comm, hi, lo, budget_s):
                self.apply(t, hi, lo, cut, new_comp, new_comm)
                return True
        return False


def greedy(p: StepProblem, budget_s: float) -> list[int]:
    """Communication-aware greedy (DistCA's idea): move attention from the slowest rank to the least loaded,
    the task with the most attention per communicated second first, cutting it at the exact query position
    that closes half the gap. A move is kept only if it lowers the larger of the two ranks' max(compute,
    comm) and keeps their comm within the budget (or no worse than before). Cuts add tasks to `p`."""
    m = _Moves(p)
    for _ in range(GREEDY_MAX_MOVES):
        total = np.maximum(m.compute, m.comm)
        hi, lo = int(np.argmax(total)), int(np.argmin(m.compute))
        gap = (m.compute[hi] - m.compute[lo]) / 2
        if hi == lo or gap <= 0 or m.compute[hi] < m.comm[hi]:
            break
        if not m.move_one(hi, lo, gap, budget_s):
            break
    return m.rank
