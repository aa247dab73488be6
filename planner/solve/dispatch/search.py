"""The local search that finishes a greedy dispatch: moves, then swaps, of sequences off the most loaded
pipeline while that strictly lowers its objective without pushing the partner to the old maximum."""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from hydraplan.solve.dispatch.pipes import Costs, Pipes, State, busy_jit, eq2, loads

LS_WORK = 20_000_000  # cap on (member, partner) pairs one local search evaluates, summed over its steps
PATIENCE, MIN_GAIN = 16, 1e-4  # a search ends after PATIENCE kept steps that together lower the largest
# objective by less than MIN_GAIN (thousands of pipelines tied at the top at cluster scale)


def tied_at_top(values: np.ndarray) -> bool:
    """More than PATIENCE values within MIN_GAIN of the largest. A step of a local search takes only the critical
    pipeline out of that band, so PATIENCE steps cannot lower the largest by MIN_GAIN: Stall would end the search
    with nothing gained, and it need not start."""
    return bool(np.count_nonzero(values >= float(np.max(values)) * (1 - MIN_GAIN)) > PATIENCE)


@dataclass
class Stall:
    """The stop rule shared by the local searches (this one and solve.refine): PATIENCE steps in a row that lower
    the largest objective by less than MIN_GAIN from the last mark."""

    mark: float = np.inf
    stale: int = 0

    def stalled(self, top: float) -> bool:
        """Record the largest objective after a step; True once the search should end."""
        if top < self.mark * (1 - MIN_GAIN):
            self.mark, self.stale = top, 0
        else:
            self.stale += 1
        return self.stale >= PATIENCE


@dataclass(frozen=True)
class _Top:
    """The most loaded pipeline p with each of its members i taken out: its sums and objective without i."""

    p: int
    mem: np.ndarray  # its sequences
    lp: np.ndarray  # their lengths
    lmax: np.ndarray  # p's longest sequence without each
    L: np.ndarray
    C: np.ndarray
    h: np.ndarray  # p's objective without each

    @classmethod
    def of(cls, lengths: np.ndarray, W: np.ndarray | Costs, P: Pipes, st: State, p: int) -> "_Top":
        mem = np.flatnonzero(st.assign == p)
        lp = lengths[mem]
        srt = np.sort(lp)[::-1]
        second = srt[1] if len(srt) > 1 else 0
        rem_lmax = np.where((lp == srt[0]) & (np.count_nonzero(lp == srt[0]) == 1), second, srt[0])
        rem_L = st.L[p] - lp
        rem_C = st.C[p] - W[mem, p]
        rem_mx = (P.a[p] * rem_lmax + P.b[p]) * rem_lmax
        h = P.h(np.where(rem_L > 0, eq2(rem_C, rem_L, rem_mx, P.c[p], P.ppm1[p], P.max_len[p]), 0.0), p)
        return cls(p, mem, lp, rem_lmax, rem_L, rem_C, h)


def _best_move(W: np.ndarray | Costs, J: np.ndarray, P: Pipes, st: State, top: _Top,
               Mx: np.ndarray) -> tuple[float, int, int]:
    """(the larger of the two objectives, member row, target pipeline) of the best move off the top pipeline."""
    D = W.shape[1]
    wq = W[top.mem]  # (m, D)
    Lq = st.L + top.lp[:, None]
    newq = P.h(eq2(st.C + wq, Lq, np.maximum(Mx, wq), P.c, P.ppm1, P.max_len), busy=True)
    val = np.maximum(top.h[:, None], newq)
    val[np.arange(D) >= J[top.mem][:, None]] = np.inf
    val[:, top.p] = np.inf
    r, q = np.unravel_index(int(val.argmin()), val.shape)
    return float(val[r, q]), int(r), int(q)


@numba.njit(cache=True)
def _lmax_without(lengths: np.ndarray, assign: np.ndarray, oth: np.ndarray, D: int) -> np.ndarray:  # pragma: no cover
    """Per sequence k of `oth`, the longest sequence left on its pipeline without k: its pipeline's longest, or
    for that one sequence (of equals, any one: the second is as long) the second longest. Compiled: two passes
    where numpy sorted on every step of the search."""
    top1, top2 = np.zeros(D, dtype=np.int64), np.zeros(D, dtype=np.int64)
    first = np.full(D, -1, dtype=np.int64)
    for k in oth:
        q, l = assign[k], lengths[k]
        if first[q] < 0 or l > top1[q]:
            top1[q], first[q] = l, k
    for k in oth:
        q = assign[k]
        if k != first[q]:
            top2[q] = max(top2[q], lengths[k])
    out = np.empty(oth.size, dtype=np.int64)
    for s in range(oth.size):
        q = assign[oth[s]]
        out[s] = top2[q] if oth[s] == first[q] else top1[q]
    return out


@dataclass(frozen=True)
class _Fixed:
    """What the steps of one local search share: the swap kernel's cost table (per group of identical pipelines)
    and the sequences shortest first, equals by index (the order partners are scanned in)."""

    Wg: np.ndarray
    gid: np.ndarray
    by_len: np.ndarray

    @classmethod
    def of(cls, lengths: np.ndarray, W: np.ndarray | Costs) -> "_Fixed":
        Wg, gid = (W.Wg, W.gid) if isinstance(W, Costs) else (W, np.arange(W.shape[1]))
        return cls(np.ascontiguousarray(Wg, dtype=np.float64), gid, np.argsort(lengths, kind="stable"))


@dataclass(frozen=True)
class _Swap:
    value: float  # the larger of the two new objectives
    i: int  # member of the top pipeline
    k: int  # sequence of pipeline q it trades places with
    q: int
    lmax_p: int  # the two pipelines' longest sequences after the swap
    lmax_q: int


def _best_swap(lengths: np.ndarray, W: np.ndarray | Costs, fixed: _Fixed, J: np.ndarray, P: Pipes, st: State,
               top: _Top) -> _Swap | None:
    """The best swap of a member of the top pipeline p with a shorter sequence of another pipeline (None: none
    allowed). A partner no shorter cannot lower p's load: its cost, tokens and longest only grow."""
    p, mem = top.p, top.mem
    oth = fixed.by_len[st.assign[fixed.by_len] != p]  # every other sequence, shortest first
    remq_lmax = _lmax_without(lengths, st.assign, oth, st.L.size)  # a partner's pipeline keeps the rest
    n = int(np.searchsorted(lengths[oth], top.lp.max()))  # the partners: strictly shorter than some member
    oth, remq_lmax = oth[:n], remq_lmax[:n]
    q = st.assign[oth]
    val, r, s = _swap_scan(p, mem, top.lp, top.lmax, top.L, top.C, J[mem], oth, lengths[oth], q, remq_lmax, J[oth],
                           W[oth, p], W[oth, q], fixed.Wg, fixed.gid, st.L, st.C,
                           P.a, P.b, P.c, P.ppm1, P.max_len, P.t, P.sync)
    if r < 0:
        return None
    li, lk = int(top.lp[r]), int(lengths[oth[s]])
    return _Swap(val, int(mem[r]), int(oth[s]), int(q[s]), max(int(top.lmax[r]), lk), max(int(remq_lmax[s]), li))


@numba.njit(cache=True)
def _eq2_h(C: float, L: int, l: int, a: float, b: float, c: float, ppm1: float, max_len: int, t: float,
           sync: bool) -> float:
    """The objective of one busy pipeline (Pipes.h of eq2) with longest sequence l, in eq2's order of operations."""
    load = C + c * -(-L // max_len) + ppm1 * ((a * l + b) * l + c)
    return busy_jit(t, load) if sync else load


@numba.njit(cache=True)
def _swap_scan(p, mem, lp, lmax_p, L_p, C_p, J_mem, oth, lk, q, lmax_q, J_oth, w_kp, w_kq, Wg, gid, L, C,
               a, b, c, ppm1, max_len, t, sync):  # pragma: no cover - compiled
    """(the larger of the two new objectives, member row, partner row) of the best allowed swap; among equals the
    first in (member, partner index) order; row -1: none allowed. Partners come shortest first, and p's
    new load only grows with the partner's length (its cost, tokens and longest), so a member's scan ends at the
    first partner that leaves p above the best so far, or is no shorter than the member. Compiled: 10^5 pairs
    at a thousand GPUs."""
    best, br, bs = np.inf, -1, -1
    for r in range(mem.size):
        li = lp[r]
        for s in range(oth.size):
            k, qq = lk[s], q[s]
            if k >= li:
                break
            n_p = _eq2_h(C_p[r] + w_kp[s], L_p[r] + k, max(lmax_p[r], k), a[p], b[p], c[p], ppm1[p], max_len[p],
                         t[p], sync)
            if br >= 0 and n_p > best:
                break
            if not (qq < J_mem[r] and p < J_oth[s]):
                continue
            n_q = _eq2_h((C[qq] - w_kq[s]) + Wg[mem[r], gid[qq]], (L[qq] - k) + li, max(lmax_q[s], li), a[qq], b[qq],
                         c[qq], ppm1[qq], max_len[qq], t[qq], sync)
            v = max(n_p, n_q)
            if br < 0 or v < best or (v == best and r == br and oth[s] < oth[bs]):
                best, br, bs = v, r, s
    return best, br, bs


def _move(lengths: np.ndarray, W: np.ndarray | Costs, st: State, i: int, p: int, q: int, lmax_p: int) -> None:
    st.assign[i] = q
    st.C[p] -= W[i, p]; st.C[q] += W[i, q]
    st.L[p] -= lengths[i]; st.L[q] += lengths[i]
    st.lmax[p] = lmax_p; st.lmax[q] = max(st.lmax[q], lengths[i])


def _swap(lengths: np.ndarray, W: np.ndarray | Costs, st: State, p: int, sw: _Swap) -> None:
    i, k, qq = sw.i, sw.k, sw.q
    st.assign[i], st.assign[k] = qq, p
    st.C[p] += W[k, p] - W[i, p]; st.C[qq] += W[i, qq] - W[k, qq]
    st.L[p] += lengths[k] - lengths[i]; st.L[qq] += lengths[i] - lengths[k]
    st.lmax[p] = sw.lmax_p; st.lmax[qq] = sw.lmax_q


def local_search(lengths: np.ndarray, W: np.ndarray | Costs, J: np.ndarray, P: Pipes, assign: np.ndarray,
                 max_steps: int, swaps: bool = True) -> np.ndarray:
    """Moves, then swaps, of sequences off the most loaded pipeline while that strictly lowers its load
    without pushing the partner to the old maximum (the sorted load vector decreases: it terminates).

    Each step evaluates (members of the top pipeline) x (pipelines, then other sequences) pairs; at most
    LS_WORK pairs are evaluated in all. A step takes only the top pipeline out of the band of pipelines near
    the largest objective, so with thousands of pipelines at one level (thousands of GPUs) the search would
    spend seconds per candidate for almost nothing: it ends after PATIENCE steps that lower the largest
    objective by less than MIN_GAIN together, and at once when more than PATIENCE pipelines are in that band.
    Deterministic: work is counted, not timed."""
    st = State.of(lengths, W, assign.copy())
    B, D = W.shape
    work, stall = 0, Stall()
    fixed = _Fixed.of(lengths, W)
    for step in range(max_steps):
        if work > LS_WORK:
            break
        Mx = (P.a * st.lmax + P.b) * st.lmax
        O = P.h(loads(st.C, st.L, Mx, P))
        p = int(O.argmax())
        if (step == 0 and tied_at_top(O)) or stall.stalled(float(O[p])):
            break
        below = O[p] * (1 - 1e-12)
        top = _Top.of(lengths, W, P, st, p)
        work += len(top.mem) * D
        val, r, q = _best_move(W, J, P, st, top, Mx)
        if val < below:
            _move(lengths, W, st, int(top.mem[r]), p, q, int(top.lmax[r]))
            continue
        others = B - len(top.mem)
        if not swaps or others == 0:
            break
        work += len(top.mem) * others
        sw = _best_swap(lengths, W, fixed, J, P, st, top)
        if sw is None or not sw.value < below:
            break
        _swap(lengths, W, st, p, sw)
    return st.assign
