"""The cell cost model of the proposal: the length distribution binned into cells, each costed on every scheme
for the nominal batch (work, bubble, floor; the package docstring derives them), and the homogeneous fallback."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hydraplan.core.cost import seq_cost
from hydraplan.core.schema import Scheme
from hydraplan.core.sync import charges, end_to_end_s

LENGTH_STEP = 128


@dataclass(frozen=True)
class CellCosts:
    """Per-cell, per-scheme costs of the nominal batch; cell j covers lengths (hi[j-1], hi[j]]."""

    schemes: tuple[Scheme, ...]
    hi: np.ndarray  # (M,) upper boundary of each cell (the L' of Problem 1); hi[-1] == context_len
    lmax: np.ndarray  # (M,) longest length present in the cell
    tokens: np.ndarray  # (M,) expected tokens of the nominal batch in the cell
    count: np.ndarray  # (M,) expected sequences of the nominal batch in the cell
    work: np.ndarray  # (M, K) W of the cell on one pipeline of each scheme
    bubble: np.ndarray  # (M, K) (pp-1) * longest micro-batch time
    floor: np.ndarray  # (M, K) pp * T(lmax): the pipeline holding the cell's longest sequence takes at least this
    feasible: np.ndarray  # (M, K) MaxLen(P) >= hi
    gpus: np.ndarray  # (K,)
    transfer: np.ndarray  # (K,) one-direction LNK seconds per scheme (core.sync.charges: 0 with the propagation objective)

    @property
    def n_cells(self) -> int:
        return len(self.hi)

    def interval_latency(self, i: int, j: int, k: int, d: float) -> float:
        """Latency of cells i..j-1 (0-based, j exclusive) on d pipelines of scheme k."""
        return float(max(self.work[i:j, k].sum() / d + self.bubble[j - 1, k], self.floor[j - 1, k]))

    def interval_time(self, i: int, j: int, k: int, d: float) -> float:
        """The same in the objective: the end-to-end time of those pipelines (their propagation when t = 0)."""
        return float(end_to_end_s(self.transfer[k], self.interval_latency(i, j, k, d)))


def build_cells(schemes: list[Scheme], values: np.ndarray, counts: np.ndarray, context_len: int,
                tokens_per_iter: float, step: int = LENGTH_STEP, transfer: np.ndarray | None = None) -> CellCosts:
    """Bin a length histogram (already truncated to context_len) and cost every cell on every scheme;
    `transfer` (per scheme) makes every latency end to end."""
    values = np.asarray(values, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.float64)
    keep = counts > 0
    values, counts = values[keep], counts[keep]
    order = np.argsort(values)
    values, counts = values[order], counts[order]
    counts = counts * (tokens_per_iter / float((values * counts).sum()))
    bins = np.minimum((values + step - 1) // step * step, context_len)
    starts = np.flatnonzero(np.r_[True, bins[1:] != bins[:-1]])
    hi = bins[starts].copy()
    hi[-1] = context_len
    lmax = values[np.r_[starts[1:] - 1, len(values) - 1]]
    lv = values.astype(np.float64)
    s1 = np.add.reduceat(counts * lv, starts)

    c = np.array([s.time.c for s in schemes])
    util = np.array([s.max_len if s.pp == 1 else min(s.util_len, s.max_len) for s in schemes], dtype=np.float64)
    pp = np.array([s.pp for s in schemes], dtype=np.float64)
    maxlen = np.array([s.max_len for s in schemes])
    seq = np.stack([seq_cost(s, values) for s in schemes], axis=1)  # canonical a*l^2 + b*l, (lengths, K)
    mb = np.minimum(lv[:, None], util) / util
    work = np.add.reduceat(counts[:, None] * (seq + mb * c), starts, axis=0)
    lm = lmax.astype(np.float64)[:, None]
    longest = np.stack([seq_cost(s, lmax) for s in schemes], axis=1)
    bubble = (pp - 1) * (np.maximum(lm, util) / lm * longest + c)  # m/l_max sequences of length l_max, + c
    return CellCosts(schemes=tuple(schemes), hi=hi, lmax=lmax, tokens=s1, count=np.add.reduceat(counts, starts),
                     work=work, bubble=bubble, floor=pp * (longest + c),
                     feasible=maxlen[None, :] >= hi[:, None], gpus=np.array([s.gpus for s in schemes]),
                     transfer=charges(transfer, len(schemes)))


def best_homogeneous(cells: CellCosts, gpus: int) -> tuple[int, int, float] | None:
    """(scheme, pipelines, latency in the objective) of the fastest single-scheme strategy that holds the
    context length."""
    best = None
    for k in np.flatnonzero(cells.feasible[-1]):
        d = gpus // int(cells.gpus[k])
        lat = cells.interval_time(0, cells.n_cells, int(k), d)
        if best is None or lat < best[2]:
            best = (int(k), d, lat)
    return best
