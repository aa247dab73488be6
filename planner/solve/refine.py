"""Local search after dispatch and packing: sequences moved off the critical pipeline, swapped with another
pipeline's, or exchanged for a few of another's, each touched pipeline re-packed, a change kept only when both
touched pipelines end below the critical one's time in the objective (the canonical estimate, through each
pipeline's end-to-end map when it pays a transfer).

The dispatch balances the Eq. (2) bound of each pipeline, which cannot see how its sequences pack (seven
sequences over half of MaxLen need seven micro-batches, whatever their tokens). The search works on the packed
micro-batches: a sequence leaves its micro-batch and joins the one of the receiver where it raises the time
least (or a new one), so every change is costed exactly as the cost model prices it; the two pipelines are
then re-packed (greedy, no CP-SAT) and the better packing kept. A kept change lowers the largest time or the
number of pipelines at it, so the search ends; it is deterministic (steps are counted, not timed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np

from hydraplan.core.cost import pipeline_estimate
from hydraplan.core.schema import Scheme
from hydraplan.core.sync import BACKWARD_SHARE, charges, end_to_end_s
from hydraplan.solve.dispatch.search import Stall, tied_at_top  # the dispatch search's stop rule
from hydraplan.solve.packing import pack

MAX_STEPS = 200  # kept changes per search
EXCHANGES = 6  # sequences of the critical pipeline an exchange is tried for per step, with TARGETS receivers each
TARGETS = 4
SWAP_TARGETS = 8  # pipelines a swap step prices exactly: those with the best pairs by the work exchange alone
_TOL = 1e-12


@dataclass
class Refined:
    """Micro-batches (index arrays into the batch) per pipeline and their canonical estimates, after the search."""

    micro_batches: list[list[np.ndarray]]
    estimates: np.ndarray
    touched: set[int] = field(default_factory=set)  # pipelines the kept changes re-packed
    moves: int = 0


class _State:
    """Every sequence's pipeline and micro-batch, with each micro-batch's tokens and work."""

    def __init__(self, lengths: np.ndarray, schemes: list[Scheme], transfer: np.ndarray | None,
                 micro_batches: list[list[np.ndarray]]) -> None:
        self.lengths, self.schemes = lengths, schemes
        D = len(schemes)
        self.t = charges(transfer, D)
        self.c = np.array([s.time.c for s in schemes])
        self.p = np.array([s.pp - 1 for s in schemes], dtype=np.float64)
        self.max_len = np.array([s.max_len for s in schemes])
        kinds: dict[tuple[float, float], int] = {}
        self.kind = np.array([kinds.setdefault((s.time.a, s.time.b), len(kinds)) for s in schemes])
        coef = np.array(list(kinds))
        l = lengths.astype(np.float64)
        self.kind_work = (coef[:, :1] * l + coef[:, 1:]) * l  # (distinct (a, b), sequences): a l^2 + b l
        self.owner = np.full(lengths.size, -1, dtype=np.int64)  # -1: in no micro-batch
        self.mb = np.full(lengths.size, -1, dtype=np.int64)
        self.mb_pipe: list[int] = []
        self._members: dict[int, np.ndarray] = {}
        self._loads: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for j, mbs in enumerate(micro_batches):
            self.set_pipeline(j, mbs)

    def work(self, j: np.ndarray | int, i: np.ndarray | int) -> np.ndarray:
        """a l^2 + b l of sequences i on pipelines j."""
        return self.kind_work[self.kind[j], i]

    def objective(self, j: np.ndarray | int, prop: np.ndarray | float) -> np.ndarray:
        return np.asarray(end_to_end_s(self.t[j], prop), dtype=np.float64)

    def set_pipeline(self, j: int, mbs: list[np.ndarray]) -> None:
        for g in mbs:
            self.owner[g] = j
            self.mb[g] = len(self.mb_pipe)
            self.mb_pipe.append(j)
        self.changed(j)

    def changed(self, *pipelines: int) -> None:
        for j in pipelines:
            self._members.pop(j, None)
            self._loads.pop(j, None)

    def members(self, j: int) -> np.ndarray:
        if j not in self._members:
            self._members[j] = np.flatnonzero(self.owner == j)
        return self._members[j]

    def micro_batches(self, j: int) -> list[np.ndarray]:
        mine = self.members(j)
        order = np.lexsort((mine, -self.lengths[mine], self.mb[mine]))
        mine = mine[order]
        return np.split(mine, np.flatnonzero(np.diff(self.mb[mine])) + 1) if mine.size else []

    def loads(self, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Pipeline j's micro-batch ids, their work and their tokens."""
        if j not in self._loads:
            mine = self.members(j)
            ids, inv = np.unique(self.mb[mine], return_inverse=True)
            self._loads[j] = (ids, np.bincount(inv, weights=self.work(j, mine), minlength=ids.size),
                              np.bincount(inv, weights=self.lengths[mine], minlength=ids.size))
        return self._loads[j]

    def prop(self, j: int) -> float:
        _, load, _ = self.loads(j)
        if load.size == 0:
            return 0.0
        return float(load.sum() + self.c[j] * load.size + self.p[j] * (load.max() + self.c[j]))

    def estimates(self) -> np.ndarray:
        """prop(j) of every pipeline at once (thousands of pipelines at cluster scale)."""
        D, n = len(self.schemes), len(self.mb_pipe)
        pipe = np.asarray(self.mb_pipe, dtype=np.int64)
        seqs = np.flatnonzero(self.owner >= 0)
        load = np.bincount(self.mb[seqs], weights=self.work(self.owner[seqs], seqs), minlength=n)
        count = np.bincount(pipe, minlength=D)
        top = np.zeros(D)
        np.maximum.at(top, pipe, load)
        return np.where(count > 0, np.bincount(pipe, weights=load, minlength=D) + self.c * count
                        + self.p * (top + self.c), 0.0)


def _time(W: np.ndarray, V: np.ndarray, top: np.ndarray, c: float, p: float) -> np.ndarray:
    """Canonical time from the total work, micro-batch count and largest micro-batch (0 when empty)."""
    return np.where(V > 0, W + c * V + p * (top + c), 0.0)


@numba.njit(cache=True)
def _objective(t: float, prop: float) -> float:  # pragma: no cover - compiled
    """end_to_end_s of one pipeline, in its order of operations."""
    return max(2.0 * t, max(prop, t + BACKWARD_SHARE * prop)) if prop > 0 else 0.0


@numba.njit(cache=True)
def _rough_pairs(mine, others, owner, a, kind, kind_work, est, t, lengths, max_len, top):  # pragma: no cover
    """The swaps (i of a, k of another pipeline b) whose work exchange alone leaves both pipelines below `top`,
    tokens permitting, with the larger of the two rough times; i-major, as the pairs are ranked. Compiled: the
    critical pipeline's members times every other sequence, 10^5 pairs at a thousand GPUs, of which few pass."""
    n = 0
    ri, rk, rv = (np.empty(mine.size * others.size, dtype=np.int64), np.empty(mine.size * others.size, dtype=np.int64),
                  np.empty(mine.size * others.size))
    for i in mine:
        for k in others:
            b = owner[k]
            if lengths[k] > max_len[a] or lengths[i] > max_len[b]:
                continue
            va = _objective(t[a], est[a] - kind_work[kind[a], i] + kind_work[kind[a], k])
            vb = _objective(t[b], est[b] - kind_work[kind[b], k] + kind_work[kind[b], i])
            v = max(va, vb)
            if v < top:
                ri[n], rk[n], rv[n] = i, k, v
                n += 1
    return ri[:n], rk[:n], rv[:n]


class _Search:
    def __init__(self, st: _State, max_steps: int, seed: int) -> None:
        self.st, self.max_steps, self.seed = st, max_steps, seed
        self.est = st.estimates()
        self.out = Refined([], self.est)

    def without(self, a: int) -> tuple[np.ndarray, np.ndarray]:
        """Members of a and a's time with each removed from its micro-batch."""
        st = self.st
        ids, load, _ = st.loads(a)
        mine = st.members(a)
        pos = np.searchsorted(ids, st.mb[mine])
        w = st.work(a, mine)
        order = np.sort(load)
        first, second = order[-1], (order[-2] if order.size > 1 else 0.0)
        left = load[pos] - w
        alone = np.isclose(left, 0.0, atol=1e-15) & (np.bincount(pos, minlength=ids.size)[pos] == 1)
        top = np.where(load[pos] >= first, np.maximum(np.where(alone, 0.0, left), second), first)
        V = ids.size - alone
        return mine, st.objective(a, _time(load.sum() - w, V, top, st.c[a], st.p[a]))

    def with_added(self, b: int, i: np.ndarray) -> np.ndarray:
        """b's time with each of sequences i added where it raises it least (a micro-batch with room, or a new one)."""
        st = self.st
        ids, load, tok = st.loads(b)
        w = st.work(b, i)
        c, p, M = st.c[b], st.p[b], st.max_len[b]
        cur = load.max(initial=0.0)
        room = tok[None, :] + st.lengths[i][:, None] <= M
        best_in = np.where(room, load[None, :], np.inf).min(axis=1, initial=np.inf)  # least-loaded with room
        ok = np.isfinite(best_in)
        top_in = np.maximum(cur, np.where(ok, best_in, 0.0) + w)
        t_in = _time(load.sum() + w, np.full(i.size, ids.size), top_in, c, p)
        t_new = _time(load.sum() + w, np.full(i.size, ids.size + 1), np.maximum(cur, w), c, p)
        out = np.minimum(np.where(ok, t_in, np.inf), t_new)
        out[st.lengths[i] > M] = np.inf
        return st.objective(b, out)

    def add(self, j: int, i: int) -> None:
        """Sequence i into pipeline j where it raises j's time least."""
        st = self.st
        ids, load, tok = st.loads(j)
        room = tok + st.lengths[i] <= st.max_len[j]
        if room.any():
            cur = load.max(initial=0.0)
            cand = np.where(room, np.maximum(cur, load + st.work(j, i)), np.inf)
            v = int(cand.argmin())
            new_cost = st.c[j] + st.p[j] * max(0.0, st.work(j, i) - cur)
            in_cost = st.p[j] * (cand[v] - cur)
            if in_cost <= new_cost:
                st.owner[i], st.mb[i] = j, ids[v]
                return
        st.owner[i], st.mb[i] = j, len(st.mb_pipe)
        st.mb_pipe.append(j)

    def commit(self, changes: list[tuple[int, int]]) -> None:
        """Move sequences (i, to pipeline j), then re-pack every touched pipeline and keep the better packing."""
        st = self.st
        touched = {int(st.owner[i]) for i, _ in changes} | {j for _, j in changes}
        for i, _ in changes:
            st.owner[i] = -1
        st.changed(*touched)
        for i, j in changes:
            self.add(j, i)
            st.changed(j)
        for j in touched:
            mine = st.members(j)
            now = st.prop(j)
            if mine.size:
                r = pack(st.lengths[mine], st.schemes[j], time_limit_s=0.0, seed=self.seed)
                groups = [mine[np.asarray(mb, dtype=np.int64)] for mb in r.micro_batches]
                if pipeline_estimate(st.schemes[j], st.lengths, groups) < now * (1 - _TOL):
                    st.set_pipeline(j, groups)
            self.est[j] = st.prop(j)
            self.out.touched.add(j)
        self.out.moves += 1

    def step(self) -> bool:
        obj = self.st.objective(np.arange(self.est.size), self.est)
        a = int(obj.argmax())
        top = float(obj[a]) * (1 - _TOL)
        mine, rest = self.without(a)
        if mine.size == 0:
            return False
        return self._move(a, mine, rest, top) or self._swap(a, mine, top) or self._exchange(a, mine, rest, top)

    def lower(self, i: np.ndarray) -> np.ndarray:
        """(len(i), pipelines) a lower bound on each pipeline's time with each sequence added: its work on top of
        the pipeline's (the packing cannot make it cheaper); inf where it does not fit MaxLen."""
        st = self.st
        every = np.arange(self.est.size)
        out = st.objective(every, self.est[None, :] + st.kind_work[:, i][st.kind].T)
        out[st.lengths[i][:, None] > st.max_len[None, :]] = np.inf
        return out

    def _move(self, a: int, mine: np.ndarray, rest: np.ndarray, top: float) -> bool:
        """The move of a sequence off the critical pipeline a that leaves both pipelines lowest."""
        lb = np.maximum(self.lower(mine), rest[:, None])
        lb[:, a] = np.inf
        best, pick = top, None
        for b in np.unique(np.nonzero(lb < top)[1]).tolist():
            sel = np.flatnonzero(lb[:, b] < best)
            if sel.size == 0:
                continue
            val = np.maximum(rest[sel], self.with_added(b, mine[sel]))
            k = int(val.argmin())
            if val[k] < best:
                best, pick = float(val[k]), (int(mine[sel[k]]), b)
        if pick is None:
            return False
        self.commit([pick])
        return True

    def _swap(self, a: int, mine: np.ndarray, top: float) -> bool:
        """i of the critical pipeline takes the place of k in k's micro-batch and k takes i's (tokens permitting),
        among the pairs whose work exchange alone leaves both below the critical time, on the SWAP_TARGETS
        pipelines whose best such pair is lowest."""
        st = self.st
        others = np.flatnonzero((st.owner != a) & (st.owner >= 0))
        if others.size == 0:
            return False
        i, k, rough = _rough_pairs(mine, others, st.owner, a, st.kind, st.kind_work, self.est, st.t, st.lengths,
                                   st.max_len, top)
        if i.size == 0:
            return False
        b = st.owner[k]
        ranked = b[np.argsort(rough, kind="stable")]
        _, first = np.unique(ranked, return_index=True)
        near = np.isin(b, ranked[np.sort(first)[:SWAP_TARGETS]])  # thousands of GPUs: hundreds of receivers
        i, k, b = i[near], k[near], b[near]
        new_a = self._swapped(a, i, k)
        new_b = np.full(i.size, np.inf)
        for bb in np.unique(b).tolist():
            sel = b == bb
            new_b[sel] = self._swapped(bb, k[sel], i[sel])
        val = np.maximum(new_a, new_b)
        p = int(val.argmin())
        if not val[p] < top:
            return False
        self.commit([(int(i[p]), int(b[p])), (int(k[p]), a)])
        return True

    def _swapped(self, j: int, out: np.ndarray, into: np.ndarray) -> np.ndarray:
        """j's time with each sequence `out` (of j) replaced, in its micro-batch, by the matching `into`."""
        st = self.st
        ids, load, tok = st.loads(j)
        pos = np.searchsorted(ids, st.mb[out])
        order = np.sort(load)
        first, second = order[-1], (order[-2] if order.size > 1 else 0.0)
        new = load[pos] - st.work(j, out) + st.work(j, into)
        top = np.maximum(np.where(load[pos] >= first, second, first), new)
        fits = (tok[pos] - st.lengths[out] + st.lengths[into] <= st.max_len[j])
        t = _time(load.sum() - st.work(j, out) + st.work(j, into), np.full(out.size, ids.size), top, st.c[j], st.p[j])
        return np.where(fits, st.objective(j, t), np.inf)

    def _exchange(self, a: int, mine: np.ndarray, rest: np.ndarray, top: float) -> bool:
        """i of the critical pipeline to another pipeline b, and back from b the fewest of its sequences (largest
        first) whose work frees the room i takes there and fits in the room i leaves: where a move overfills every
        receiver and a swap of two cannot balance (a critical pipeline with a micro-batch too many)."""
        st = self.st
        for n in np.argsort(rest, kind="stable")[:EXCHANGES].tolist():
            i = int(mine[n])
            room_a = top - float(rest[n])
            if room_a <= 0:
                break
            rough = self.lower(np.array([i]))[0]
            rough[a] = np.inf
            for b in np.argsort(rough, kind="stable")[:TARGETS].tolist():
                if not np.isfinite(rough[b]):
                    break
                over = float(self.with_added(b, np.array([i]))[0]) - top
                theirs = st.members(b)
                theirs = theirs[st.lengths[theirs] <= st.max_len[a]]
                give = theirs[np.argsort(-st.work(b, theirs), kind="stable")]
                fits = np.cumsum(st.work(a, give)) <= room_a
                got = np.cumsum(np.where(fits, st.work(b, give), 0.0))
                enough = np.flatnonzero(fits & (got >= over))
                if enough.size == 0:
                    continue
                back = give[:enough[0] + 1][fits[:enough[0] + 1]]
                before = (st.owner.copy(), st.mb.copy(), len(st.mb_pipe), self.est.copy())
                self.commit([(i, b), *((int(k), a) for k in back)])
                if max(float(st.objective(a, self.est[a])), float(st.objective(b, self.est[b]))) < top:
                    return True
                st.owner, st.mb, self.est = before[0], before[1], before[3]  # not better: undo
                del st.mb_pipe[before[2]:]
                st.changed(a, b)
                self.out.moves -= 1
        return False


def refine(lengths: np.ndarray, schemes: list[Scheme], micro_batches: list[list[np.ndarray]], *,
           transfer: np.ndarray | None = None, max_steps: int = MAX_STEPS, seed: int = 0) -> Refined:
    """The local search from a packed dispatch: `schemes` one per pipeline, `micro_batches` its micro-batches as
    index arrays into `lengths`, `transfer` what the objective charges per pipeline (None: propagation)."""
    st = _State(np.asarray(lengths, dtype=np.int64), schemes, transfer, micro_batches)
    s = _Search(st, max_steps, seed)
    every = np.arange(len(schemes))
    start = st.objective(every, s.est)
    if tied_at_top(start):  # a kept change, like a dispatch step, takes only the critical pipeline out of the tie
        return Refined([list(m) for m in micro_batches], s.est.copy())
    stall = Stall(float(start.max()))
    for _ in range(max_steps):
        if not s.step() or stall.stalled(float(st.objective(every, s.est).max())):
            break
    touched = s.out.touched
    mbs = [st.micro_batches(j) if j in touched else list(micro_batches[j]) for j in range(len(schemes))]
    est = np.array([pipeline_estimate(schemes[j], st.lengths, mbs[j]) if j in touched else s.est[j]
                    for j in range(len(schemes))])
    return Refined(mbs, est, touched, s.out.moves)
