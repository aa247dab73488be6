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


@dataclass(frozen=True)
class _Scaled:
    """Latency of an integer strategy whose schemes keep the relaxed optimum's cells (Fig. 12 scaling):
    a cell of scheme k on x_k fractional pipelines meets tau with slack tau - B; on d_k pipelines it
    finishes at max(B + (tau - B) * r, F), r = x_k / d_k. The worst cell of scheme k is therefore the one
    with the smallest bubble when r >= 1 and the largest when r < 1, or its largest floor (which no number
    of pipelines lowers), so per-scheme latency is closed-form. tau is per scheme (its propagation budget for
    the relaxed end-to-end optimum); the latencies compared are end to end, f_k of the propagation.
    Per scheme holding cells (`schemes`): `load` = x_k, the sum of its cells' W / (tau - B), and bmin, bmax
    and fmax over its cells (_scheme_stats)."""

    schemes: np.ndarray
    load: np.ndarray
    bmin: np.ndarray
    bmax: np.ndarray
    fmax: np.ndarray
    tau: np.ndarray
    transfer: np.ndarray
    g: np.ndarray

    def per_scheme(self, d: np.ndarray) -> np.ndarray:
        return _scaled_latency(self.load, d, self.tau, self.bmin, self.bmax, self.fmax, self.transfer)

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


def _scaled_latency(load: np.ndarray, d: np.ndarray, tau: np.ndarray, bmin: np.ndarray, bmax: np.ndarray,
                    fmax: np.ndarray, transfer: np.ndarray) -> np.ndarray:
    """_Scaled's per-scheme latency on d pipelines, elementwise (one strategy, or a block of variants)."""
    r = load / d
    prop = np.maximum(tau * r - (r - 1) * np.where(r >= 1, bmin, bmax), fmax)
    return np.asarray(end_to_end_s(transfer, prop))


def _scheme_stats(K: int, tau: np.ndarray, mapping: np.ndarray, W: np.ndarray, B: np.ndarray,
                  F: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per (variant, scheme) of a block of variants (rows of mapping, W, B, F: each cell's scheme and its costs
    there): whether the scheme holds cells, its load (summed in cell order) and bmin, bmax, fmax."""
    V = len(mapping)
    keys = (np.arange(V)[:, None] * K + mapping).ravel()
    present = (np.bincount(keys, minlength=V * K) > 0).reshape(V, K)
    with np.errstate(divide="ignore", invalid="ignore"):  # a rejected variant's cells may sit where they cannot
        weights = W / (tau[mapping] - B)
    load = np.bincount(keys, weights=weights.ravel(), minlength=V * K).reshape(V, K)
    bmin, bmax, fmax = np.full(V * K, np.inf), np.full(V * K, -np.inf), np.full(V * K, -np.inf)
    np.minimum.at(bmin, keys, B.ravel())
    np.maximum.at(bmax, keys, B.ravel())
    np.maximum.at(fmax, keys, F.ravel())
    return present, load, bmin.reshape(V, K), bmax.reshape(V, K), fmax.reshape(V, K)


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


VARIANT_BLOCK = 64  # variants costed at once (bounds the (variants, cells, schemes) arrays of _moved)


def _best_rounding(cells: CellCosts, j: int, tau: np.ndarray, cs: np.ndarray, used: np.ndarray, droppable: list,
                   gpus: int) -> Rounded | None:
    """Best allocation over every way of dropping some of `droppable` (their cells move to a kept scheme).
    The cells that may move are costed on every used scheme once; a variant only masks the dropped ones.
    Variants are costed a block at a time (_moved, _scheme_stats, _bounds): only those whose bound may beat the
    best so far are allocated, in the order of _subsets, so the result is the one-by-one search's. tau: each scheme's
    propagation budget."""
    g = cells.gpus
    c = np.arange(j + 1)
    base = (cells.work[c, cs], cells.bubble[c, cs], cells.floor[c, cs])
    movable = np.zeros(len(g), dtype=bool)
    movable[droppable] = True
    rows = np.flatnonzero(movable[cs])
    sub = np.ix_(rows, used)
    Wu, Bu, Fu = cells.work[sub], cells.bubble[sub], cells.floor[sub]
    slack = tau[used] - Bu
    floor_u = np.where(cells.feasible[sub] & (slack > 0), Fu, np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        need_u = np.where(floor_u <= tau[used], g[used] * Wu / slack, np.inf)
    column = np.zeros(len(g), dtype=np.int64)
    column[used] = np.arange(len(used))
    best: Rounded | None = None
    best_key: tuple | None = None
    variants = _subsets(droppable)
    while block := list(itertools.islice(variants, VARIANT_BLOCK)):
        dropped = np.zeros((len(block), len(used)), dtype=bool)
        for v, drop in enumerate(block):
            dropped[v, column[list(drop)]] = True
        mapping, W, B, F, rejected = _moved(dropped, cs, rows, column, base, used, (Wu, Bu, Fu), floor_u, need_u)
        present, load, bmin, bmax, fmax = _scheme_stats(len(g), tau, mapping, W, B, F)
        fits, bound = _bounds(g, tau, cells.transfer, present, load, bmin, bmax, fmax, gpus)
        for v in range(len(block)):
            beat = np.inf if best_key is None else best_key[0]
            if rejected[v] or not fits[v] or bound[v] > beat:  # allocate would return None
                continue
            held = np.flatnonzero(present[v])
            scaled = _Scaled(held, load[v, held], bmin[v, held], bmax[v, held], fmax[v, held], tau[held],
                             cells.transfer[held], g[held])
            d = scaled.allocate(gpus, beat)
            if d is None:
                continue
            counts = tuple((int(k), int(n)) for k, n in zip(scaled.schemes, d))
            key = (float(scaled.per_scheme(d).max()), int((d * scaled.g).sum()), counts)
            if best_key is None or key < best_key:
                best, best_key = Rounded(counts, key[0]), key
    return best


def _moved(dropped: np.ndarray, cs: np.ndarray, rows: np.ndarray, column: np.ndarray,
           base: tuple[np.ndarray, ...], used: np.ndarray, costs_u: tuple[np.ndarray, ...], floor_u: np.ndarray,
           need_u: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per variant (rows of `dropped`: which used schemes it drops), each cell's scheme and its work, bubble and
    floor there: a cell of a dropped scheme moves to the kept scheme meeting the budget with the fewest GPUs,
    else to the one with the lowest floor; and whether the variant is rejected (it keeps nothing, or a cell
    has no kept scheme to go to)."""
    V = len(dropped)
    kept = ~dropped[:, None, :]
    floor = np.where(kept, floor_u, np.inf)  # (variant, movable cell, used scheme)
    need = np.where(kept, need_u, np.inf)
    # the minima read at the argmins: a min reduction over the short last axis costs ~4x its argmin
    need_at, floor_at = need.argmin(axis=2)[..., None], floor.argmin(axis=2)[..., None]
    need_min = np.take_along_axis(need, need_at, axis=2)[..., 0]
    floor_min = np.take_along_axis(floor, floor_at, axis=2)[..., 0]
    col = np.where(np.isfinite(need_min), need_at[..., 0], floor_at[..., 0])
    moves = dropped[:, column[cs[rows]]]
    stuck = (moves & ~np.isfinite(floor_min)).any(axis=1) | dropped.all(axis=1)
    mapping = np.repeat(cs[None, :], V, axis=0)
    out = [np.repeat(x[None, :], V, axis=0) for x in base]
    v, r = np.nonzero(moves)
    mapping[v, rows[r]] = used[col[v, r]]
    for x, xu in zip(out, costs_u):
        x[v, rows[r]] = xu[r, col[v, r]]
    return (mapping, *out, stuck)


def _bounds(g: np.ndarray, tau: np.ndarray, transfer: np.ndarray, present: np.ndarray, load: np.ndarray,
            bmin: np.ndarray, bmax: np.ndarray, fmax: np.ndarray, gpus: int) -> tuple[np.ndarray, np.ndarray]:
    """Per variant (rows of _scheme_stats): whether every scheme it uses has room for a pipeline (cap >= 1) and
    the bound `_Scaled.allocate` starts from, the largest scaled latency with every scheme at its cap."""
    cap = (gpus - (present * g).sum(axis=1, keepdims=True) + g) // g
    with np.errstate(divide="ignore", invalid="ignore"):
        latency = _scaled_latency(load, cap, tau, bmin, bmax, fmax, transfer)
    return ~(present & (cap < 1)).any(axis=1), np.where(present, latency, -np.inf).max(axis=1)
