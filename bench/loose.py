"""The first any-strategy lower bound, looser than solve/bound.py's and kept to show by how much (bench/bench_bound.py
reports both on every row).

For a latency X the relaxation is a small MILP (HiGHS): integer pipeline counts n_P per scheme with
sum g_P n_P <= N, and a fractional assignment x_iP >= 0 of every sequence (sum_P x_iP = 1), allowed only
where l_i <= MaxLen(P) and pp_P (w_iP + c_P) <= X (w = a l^2 + b l: a sequence's micro-batch alone takes
pp_P of its time through the pipeline). Per scheme

    sum_i x_iP (w_iP + c_P l_i / MaxLen_P) <= n_P (X - (pp_P - 1) c_P)   (V >= tokens/MaxLen micro-batches)
    sum_i x_iP w_iP                        <= n_P (X - pp_P c_P)         (V >= 1)

because a pipeline's canonical time is sum_v t(m_v) + (pp-1) max_v t(m_v) >= sum w + V c + (pp-1) c; and
sum_{i big on P} x_iP <= n_P, where i is big on P when w_iP > (X - pp_P c_P) / 2: two big sequences on one
pipeline would already exceed X, so each busy pipeline holds at most one (the integrality of the long
sequences, which the fractional x would otherwise spread over many pipelines). Every
real plan of latency X satisfies them (its busy pipelines give n_P, its dispatch x), so the least feasible X,
found by bisection, is a valid bound on the best plan of any strategy.

End to end (core/sync.py): a busy pipeline of scheme P with one-direction transfer t_P and propagation
p takes max(2t, t + 2p/3, p), so it meets X when p <= min(X, 1.5 (X - t_P)) and X >= 2 t_P: the same MILP
with that propagation budget per scheme.

Sequences of equal length are interchangeable in the relaxation, so they form one item with a count; a
scheme another beats on every coefficient (no more GPUs, MaxLen no shorter, a, b, c, pp and transfer no
larger) is dropped, since swapping its pipelines for the other's keeps every constraint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.core.schema import Scheme
from hydraplan.core.sync import end_to_end_s, propagation_budget_s
from hydraplan.solve.bound import bisect
from hydraplan.solve.highs import SparseModel
from hydraplan.solve.relaxation import dominated

REL_TOL = 1e-3  # bisection stops when the bracket is this tight (relative)
MAX_NODES = 200  # branch-and-bound nodes per probe; a probe left open there counts as feasible (bound stays valid)


@dataclass(frozen=True)
class _Instance:
    lengths: np.ndarray  # (I,) distinct lengths (of a group of sequences: its longest)
    count: np.ndarray  # (I,) how many sequences have each
    keep: np.ndarray  # indices of the non-dominated schemes
    g: np.ndarray  # (K,) GPUs per pipeline
    pp: np.ndarray
    c: np.ndarray
    max_len: np.ndarray
    transfer: np.ndarray  # (K,) one-direction sync seconds (0: propagation objective)
    w: np.ndarray  # (I, K) a l^2 + b l (of a group: its mean)
    lin: np.ndarray  # (I, K) w + c l / MaxLen (of a group: its mean)
    alone: np.ndarray  # (I, K) pp (w + c) of the item's longest sequence
    w_min: np.ndarray  # (I, K) w of the item's shortest sequence
    gpus: int

    def budget(self, X: float) -> np.ndarray:
        """Propagation budget of each scheme's pipelines at end-to-end latency X (-inf: unusable)."""
        return np.asarray(propagation_budget_s(self.transfer, X))

    def floor(self) -> float:
        """The least X at which every sequence fits whole on some scheme (X where pp (w + c) fits the budget)."""
        alone = self.alone
        ok = self.lengths[:, None] <= self.max_len
        need = np.asarray(end_to_end_s(self.transfer, alone))  # budget's inverse: alone > 0
        return float(np.where(ok, need, np.inf).min(axis=1).max())

    def volume(self) -> float:
        """GPU-seconds over N: the slowest pipeline takes at least the mean of the cheapest linear loads."""
        ok = self.lengths[:, None] <= self.max_len
        per = np.where(ok, self.g * self.lin, np.inf).min(axis=1)
        return float((self.count * per).sum() / self.gpus)


def _instance(lengths: np.ndarray, schemes: Sequence[Scheme], gpus: int, transfer: np.ndarray | None) -> _Instance:
    """The MILP's data: items are the distinct lengths with their counts."""
    t_all = np.zeros(len(schemes)) if transfer is None else np.asarray(transfer, dtype=np.float64)
    usable = np.array([s.gpus <= gpus for s in schemes])
    keep = np.flatnonzero(usable & ~dominated(list(schemes), np.where(usable, t_all, np.inf)))
    ks = [schemes[k] for k in keep]
    lengths = np.asarray(lengths, dtype=np.int64)
    a = np.array([s.time.a for s in ks])
    b = np.array([s.time.b for s in ks])
    c = np.array([s.time.c for s in ks])
    ml = np.array([s.max_len for s in ks], dtype=np.float64)
    pp = np.array([s.pp for s in ks], dtype=np.float64)
    _, inv, count = np.unique(lengths, return_inverse=True, return_counts=True)
    l = lengths.astype(np.float64)[:, None]
    w_seq = (a * l + b) * l
    w = np.zeros((len(count), len(ks)))
    np.add.at(w, inv, w_seq)
    longest = np.zeros(len(count), dtype=np.int64)
    np.maximum.at(longest, inv, lengths)
    shortest = np.full(len(count), np.iinfo(np.int64).max)
    np.minimum.at(shortest, inv, lengths)
    tok = np.bincount(inv, weights=lengths.astype(np.float64))
    w /= count[:, None]
    lm = longest.astype(np.float64)[:, None]
    return _Instance(lengths=longest, count=count.astype(np.float64), keep=keep,
                     g=np.array([s.gpus for s in ks], dtype=np.float64), pp=pp, c=c, max_len=ml,
                     transfer=t_all[keep], w=w, lin=w + c * (tok / count)[:, None] / ml,
                     alone=pp * ((a * lm + b) * lm + c), w_min=(a * shortest[:, None] + b) * shortest[:, None],
                     gpus=gpus)


def _probe(inst: _Instance, X: float, max_nodes: int | None, time_limit_s: float | None) -> bool:
    """Whether the MILP is feasible at X; a search ended by a limit without a point counts as feasible (the
    bound can only get lower so)."""
    budget = inst.budget(X)
    ok = (inst.lengths[:, None] <= inst.max_len) & (inst.alone <= budget) & (budget - inst.pp * inst.c > 0)
    if not ok.any(axis=1).all():
        return False
    used = np.flatnonzero(ok.any(axis=0))
    ii, kk = np.nonzero(ok[:, used])
    nx, nk, I = ii.size, used.size, len(inst.lengths)
    k_sch = used[kk]
    m = SparseModel()
    x = m.add_vars(nx, 0.0, inst.count[ii])
    n = m.add_vars(nk, 0.0, np.floor(inst.gpus / inst.g[used]), integer=True)
    m.add_rows(I, ii, x, np.ones(nx), lower=inst.count, upper=inst.count)
    cap_lin = budget[used] - (inst.pp[used] - 1) * inst.c[used]
    cap_one = budget[used] - inst.pp[used] * inst.c[used]
    big = inst.w_min[ii, k_sch] > cap_one[kk] / 2
    e = np.arange(nk)
    m.add_rows(nk, np.r_[kk, e], np.r_[x, n], np.r_[inst.lin[ii, k_sch], -cap_lin], upper=0.0)  # V >= tokens / MaxLen
    m.add_rows(nk, np.r_[kk, e], np.r_[x, n], np.r_[inst.w[ii, k_sch], -cap_one], upper=0.0)  # V >= 1
    m.add_rows(nk, np.r_[kk[big], e], np.r_[x[big], n], np.r_[np.ones(int(big.sum())), -np.ones(nk)], upper=0.0)
    m.add_rows(1, np.zeros(nk), n, inst.g[used], upper=float(inst.gpus))
    return m.solve(max_nodes=max_nodes, time_limit_s=time_limit_s).status != "infeasible"


def loose_bound(lengths: np.ndarray | Sequence[int], schemes: Sequence[Scheme], gpus: int, *,
                transfer: np.ndarray | Sequence[float] | None = None, upper: float | None = None,
                upper_reached: bool = False, rel_tol: float = REL_TOL, max_nodes: int | None = MAX_NODES,
                time_limit_s: float | None = None) -> float:
    """The least latency (within rel_tol) at which the MILP is feasible: a lower bound on every plan's propagation
    time (transfer None) or end-to-end time (transfer_s per scheme) of the batch on `gpus` GPUs. `upper` narrows
    the first bracket; with `upper_reached` (a plan's latency) it is taken as feasible without a probe."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return 0.0
    inst = _instance(lengths, schemes, gpus, None if transfer is None else np.asarray(transfer, dtype=np.float64))
    lo = max(inst.floor(), inst.volume())
    if not np.isfinite(lo):
        raise ValueError(f"any-strategy bound: a sequence of length {int(inst.lengths.max())} fits no scheme")
    res = bisect(lambda X: np.zeros(0) if _probe(inst, X, max_nodes, time_limit_s) else None, lo, upper, rel_tol,
                 np.zeros(0) if upper_reached else None)
    return res.lo
