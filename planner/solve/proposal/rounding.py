"""Rounding the relaxed optimum to integer pipeline counts (paper Fig. 12: "rounding requires scaling")."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from hydraplan.core.sync import end_to_end_s, propagation_budget_s
from hydraplan.solve.proposal.cells import CellCosts
from hydraplan.solve.proposal.relaxed import RelaxedSolution


@dataclass(frozen=True)
class Rounded:
    counts: tuple[tuple[int, int], ...]  # sorted (scheme index, pipelines)
    latency: float


class _Scaled:
    """Latency of an integer strategy whose schemes keep the relaxed optimum's cells (Fig. 12 scaling):
    a cell of scheme k on x_k fractional pipelines meets tau with slack tau - B; on d_k pipelines it
    finishes at max(B + (tau - B) * r, F), r = x_k / d_k. The worst cell of scheme k is therefore the one
    with the smallest bubble when r >= 1 and the largest when r < 1, or its largest floor (which no number
    of pipelines lowers), so per-scheme latency is closed-form. tau is per scheme (its propagation budget for
    the relaxed end-to-end optimum); the latencies compared are end to end, f_k of the propagation."""

    def __init__(self, gpus: np.ndarray, tau: np.ndarray, transfer: np.ndarray, mapping: np.ndarray, W: np.ndarray,
                 B: np.ndarray, F: np.ndarray):
        """tau, transfer: per scheme; mapping: scheme per cell; W, B, F: each cell's work, bubble and floor on
        its scheme."""
        present = np.bincount(mapping, minlength=len(gpus)) > 0
        self.schemes = np.flatnonzero(present)
        col = (np.cumsum(present) - 1)[mapping]
        S = len(self.schemes)
        self.load = np.bincount(col, weights=W / (tau[mapping] - B), minlength=S)
        self.bmin = np.full(S, np.inf)
        self.bmax = np.full(S, -np.inf)
        self.fmax = np.full(S, -np.inf)
        np.minimum.at(self.bmin, col, B)
        np.maximum.at(self.bmax, col, B)
        np.maximum.at(self.fmax, col, F)
        self.tau = tau[self.schemes]
        self.transfer = transfer[self.schemes]
        self.g = gpus[self.schemes]

    def per_scheme(self, d: np.ndarray) -> np.ndarray:
        r = self.load / d
        prop = np.maximum(self.tau * r - (r - 1) * np.where(r >= 1, self.bmin, self.bmax), self.fmax)
        return np.asarray(end_to_end_s(self.transfer, prop))

    def pipelines_for(self, T: np.ndarray) -> np.ndarray:
        """Fewest pipelines per scheme (columns) meeting each latency T (rows): inverts per_scheme."""
        T = np.asarray(propagation_budget_s(self.transfer, T[:, None]))
        r = np.where(T >= self.tau, 1 + (T - self.tau) / (self.tau - self.bmin),
                     1 - (self.tau - T) / (self.tau - self.bmax))
        ok = (r > 0) & (self.fmax <= T * (1 + 1e-12))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.maximum(np.ceil(np.where(ok, self.load / (r * (1 + 1e-12)), np.inf)), 1)

    def allocate(self, gpus: int, beat: float = np.inf) -> np.ndarray | None:
        """Integer pipelines per scheme minimising the largest scaled latency within `gpus` GPUs (exact:
        the optimum is one of the values per_scheme takes at integer d), then leftover GPUs go one
        pipeline at a time to the slowest scheme that still fits. None if nothing fits or if no
        allocation can reach `beat` or less."""
        S = len(self.schemes)
        cap = (gpus - self.g.sum() + self.g) // self.g  # every other scheme keeps one pipeline
        if (cap < 1).any():
            return None
        bound = self.per_scheme(cap).max()  # no scheme does better than on its cap
        if bound > beat:
            return None
        ks = np.repeat(np.arange(S), cap)
        ds = (np.arange(len(ks)) - np.repeat(np.cumsum(cap) - cap, cap) + 1).astype(np.float64)
        r = self.load[ks] / ds
        values = np.maximum(self.tau[ks] * r - (r - 1) * np.where(r >= 1, self.bmin[ks], self.bmax[ks]), self.fmax[ks])
        values = np.asarray(end_to_end_s(self.transfer[ks], values))
        values = values[values >= bound]
        need = self.pipelines_for(values)
        fits = (need * self.g).sum(axis=1) <= gpus
        if not fits.any():
            return None
        d = need[fits][values[fits].argmin()]
        while True:
            room = self.g <= gpus - (d * self.g).sum()
            if not room.any():
                return d
            d[int(np.where(room, self.per_scheme(d), -np.inf).argmax())] += 1


def round_relaxed(cells: CellCosts, relaxed: RelaxedSolution, j: int, gpus: int) -> Rounded | None:
    """Best integer strategy near the relaxed optimum for L' = hi[j]. Each scheme keeps its cells and
    gets the integer pipeline counts that minimise the scaled latency within N GPUs (every floor/ceil
    combination of the fractional counts is among those considered); a scheme holding less than one
    pipeline may instead be dropped, its cells moving to the kept scheme that meets the relaxed latency
    with the fewest GPUs, or, when no kept scheme's floor is that low, to the one with the lowest floor
    (rounding raises the latency anyway: the relaxation spreads a long cell's few sequences over fractions
    of wide pipelines, and one whole pipeline of the widest is often more than N allows next to the rest).
    The best of these variants wins (ties: fewer GPUs)."""
    tau = np.asarray(propagation_budget_s(cells.transfer, float(relaxed.latency[j])))
    cs = relaxed.scheme[j, : j + 1]
    x = np.bincount(cs, weights=relaxed.share[j, : j + 1], minlength=len(cells.schemes))
    used = np.flatnonzero(x > 0)
    by_share = sorted(used.tolist(), key=lambda k: (x[k], k))  # the smallest fractional counts first
    best = _best_rounding(cells, j, tau, cs, used, [k for k in by_share if x[k] < 1], gpus)
    if best is None:  # the kept schemes do not fit in N GPUs together: drop any, not only small ones
        best = _best_rounding(cells, j, tau, cs, used, by_share, gpus)
    return best


MAX_VARIANTS = 1024  # ways of dropping schemes one rounding tries (2^10: every subset of up to 10 schemes)


def _subsets(items: list) -> Iterator[tuple]:
    """Subsets, smallest first: all of them for up to log2(MAX_VARIANTS) items; for more (22 schemes with fractional
    counts at 2M tokens on 1024 GPUs: 4M subsets, hours) every subset up to the size that keeps within
    MAX_VARIANTS, then the prefixes of `items` (in the order given: the smallest shares first) beyond it."""
    sizes = range(len(items) + 1)
    total = 0
    for n in sizes:
        total += math.comb(len(items), n)
        if total > MAX_VARIANTS:
            yield from itertools.chain.from_iterable(itertools.combinations(items, m) for m in range(n))
            yield from (tuple(items[:m]) for m in range(n, len(items) + 1))
            return
    yield from itertools.chain.from_iterable(itertools.combinations(items, n) for n in sizes)


def _best_rounding(cells: CellCosts, j: int, tau: np.ndarray, cs: np.ndarray, used: np.ndarray, droppable: list,
                   gpus: int) -> Rounded | None:
    """Best allocation over every way of dropping some of `droppable` (their cells move to a kept scheme).
    The cells that may move are costed on every used scheme once; a variant only masks the dropped ones.
    tau: each scheme's propagation budget."""
    g = cells.gpus
    c = np.arange(j + 1)
    base = (cells.work[c, cs], cells.bubble[c, cs], cells.floor[c, cs])
    dropped = np.zeros(len(g), dtype=bool)
    dropped[droppable] = True
    rows = np.flatnonzero(dropped[cs])
    sub = np.ix_(rows, used)
    Wu, Bu, Fu = cells.work[sub], cells.bubble[sub], cells.floor[sub]
    slack = tau[used] - Bu
    floor_u = np.where(cells.feasible[sub] & (slack > 0), Fu, np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        need_u = np.where(floor_u <= tau[used], g[used] * Wu / slack, np.inf)
    best: Rounded | None = None
    best_key: tuple | None = None
    for drop in _subsets(droppable):
        dropped[:] = False
        dropped[list(drop)] = True
        kept = ~dropped[used]
        if not kept.any():
            continue
        mapping = cs
        W, B, F = base
        if drop:
            sel = dropped[cs[rows]]
            floor = np.where(kept, floor_u[sel], np.inf)
            if not np.isfinite(floor.min(axis=1)).all():
                continue
            need = np.where(kept, need_u[sel], np.inf)
            col = np.where(np.isfinite(need.min(axis=1)), need.argmin(axis=1), floor.argmin(axis=1))
            moved, r = rows[sel], np.arange(len(col))
            mapping, W, B, F = cs.copy(), W.copy(), B.copy(), F.copy()
            mapping[moved] = used[col]
            W[moved], B[moved], F[moved] = Wu[sel][r, col], Bu[sel][r, col], Fu[sel][r, col]
        scaled = _Scaled(g, tau, cells.transfer, mapping, W, B, F)
        d = scaled.allocate(gpus, np.inf if best_key is None else best_key[0])
        if d is None:
            continue
        counts = tuple((int(k), int(n)) for k, n in zip(scaled.schemes, d))
        key = (float(scaled.per_scheme(d).max()), int((d * scaled.g).sum()), counts)
        if best_key is None or key < best_key:
            best, best_key = Rounded(counts, key[0]), key
    return best
