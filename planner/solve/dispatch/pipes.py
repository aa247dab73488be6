"""The arrays every dispatch solver works on: pipelines sorted by MaxLen with their scheme coefficients, the
(sequence x pipeline) cost table read from its per-group form, and the Eq. (2) load of running sums."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from hydraplan.core.schema import Scheme
from hydraplan.core.sync import busy_float_s, busy_s, charges

busy_jit = numba.njit(cache=True)(busy_float_s)  # h of one busy pipeline in the compiled loops


@dataclass(frozen=True)
class Pipes:
    """Scheme coefficients as arrays over pipelines sorted by MaxLen descending (eligibility = prefix).
    Identical schemes (repeats) form a group: per-sequence tables are computed per group, then spread."""

    order: np.ndarray  # sorted position -> index into `schemes`
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray
    ppm1: np.ndarray
    max_len: np.ndarray
    gid: np.ndarray  # group per sorted pipeline, groups numbered in order of first appearance
    rep: np.ndarray  # first sorted pipeline of each group
    t: np.ndarray  # one-direction LNK transfer per sorted pipeline (all 0: the propagation objective)
    sync: bool  # some t > 0

    @classmethod
    def of(cls, schemes: list[Scheme], transfer: np.ndarray | None = None) -> "Pipes":
        ml = np.array([s.max_len for s in schemes], dtype=np.int64)
        order = np.argsort(-ml, kind="stable")
        pick = [schemes[k] for k in order]
        t = charges(transfer, len(schemes))[order]
        keys = [(s.time.a, s.time.b, s.time.c, s.pp, s.max_len, float(tk)) for s, tk in zip(pick, t)]
        first: dict[tuple, int] = {}
        gid = np.array([first.setdefault(k, len(first)) for k in keys], dtype=np.int64)
        rep = np.array([keys.index(k) for k in first], dtype=np.int64)
        return cls(
            order=order,
            a=np.array([s.time.a for s in pick]), b=np.array([s.time.b for s in pick]),
            c=np.array([s.time.c for s in pick]), ppm1=np.array([s.pp - 1 for s in pick], dtype=np.float64),
            max_len=ml[order], gid=gid, rep=rep, t=t, sync=bool(t.any()),
        )

    def h(self, load: np.ndarray, cols: np.ndarray | slice | int = slice(None), busy: bool = False) -> np.ndarray:
        """The objective of loads in columns `cols` (the loads themselves without sync; 0 for an empty
        pipeline unless `busy` says every load holds a sequence)."""
        if not self.sync:
            return load
        out = busy_s(self.t[cols], load)
        return out if busy else np.where(load > 0, out, 0.0)

    def group_cost(self, lengths: np.ndarray) -> np.ndarray:
        """(B, G) table of a_g l_i^2 + b_g l_i."""
        l = lengths.astype(np.float64)[:, None]
        return (self.a[self.rep] * l + self.b[self.rep]) * l

    def eligible_count(self, lengths: np.ndarray) -> np.ndarray:
        """J_i: how many (sorted) pipelines can hold sequence i."""
        return np.searchsorted(-self.max_len, -lengths, side="right")


class Costs:
    """W[i, j] = a_j l_i^2 + b_j l_i over sequences x sorted pipelines, read from the (B, G) group table:
    the full (B, D) table is 800 MB at 8192 GPUs. Supports the indexing the solvers use: W[rows, cols]
    (cols mapped to groups) and W[rows] (whole rows, materialized)."""

    def __init__(self, Wg: np.ndarray, gid: np.ndarray) -> None:
        self.Wg, self.gid = Wg, gid
        self.shape = (Wg.shape[0], gid.size)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, tuple):
            rows, cols = key
            return self.Wg[rows, self.gid[cols]]
        return self.Wg[key][..., self.gid]


def eq2(C: np.ndarray, L: np.ndarray, mx: np.ndarray, c: np.ndarray, ppm1: np.ndarray,
        max_len: np.ndarray) -> np.ndarray:
    """Eq. (2) of a busy pipeline from its running sums: sequence costs C, c per micro-batch its L tokens need
    (ceil(L / MaxLen)), (pp - 1) times its longest sequence's cost mx plus c."""
    return C + c * -(-L // max_len) + ppm1 * (mx + c)


def loads(C: np.ndarray, L: np.ndarray, Mx: np.ndarray, P: Pipes) -> np.ndarray:
    """Eq. (2) per pipeline from the running sums, 0 when empty (works on (..., D) arrays)."""
    return np.where(L > 0, eq2(C, L, Mx, P.c, P.ppm1, P.max_len), 0.0)


@dataclass
class State:
    """An assignment (sorted-pipeline index per sequence) with its running sums per pipeline: cost sum C,
    tokens L and longest sequence lmax."""

    assign: np.ndarray
    C: np.ndarray
    L: np.ndarray
    lmax: np.ndarray

    @classmethod
    def of(cls, lengths: np.ndarray, W: np.ndarray | Costs, assign: np.ndarray) -> "State":
        B, D = len(lengths), W.shape[1]
        w = W[np.arange(B), assign]
        C = np.bincount(assign, weights=w, minlength=D)
        L = np.bincount(assign, weights=lengths, minlength=D).astype(np.int64)
        lmax = np.zeros(D, dtype=np.int64)
        np.maximum.at(lmax, assign, lengths)
        return cls(assign, C, L, lmax)

    def objective(self, P: Pipes) -> np.ndarray:
        """Each pipeline's objective: h of its Eq. (2) load."""
        return P.h(loads(self.C, self.L, (P.a * self.lmax + P.b) * self.lmax, P))


def cost_sorted(lengths: np.ndarray, W: np.ndarray | Costs, P: Pipes, assign: np.ndarray) -> float:
    """The dispatch objective of an assignment to sorted pipelines: the largest h of Eq. (2)."""
    return float(State.of(lengths, W, assign).objective(P).max(initial=0.0))
