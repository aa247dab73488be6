"""A plan for Megatron's dynamic-CP executor as hydraplan builds it: every rank a column of micro-batch slots, filled
sequence by sequence (solve.megatron.dynamic_cp searches the micro-batch count and the level it fills to).

Ranks are grouped in units of the narrowest block size s0 (1 unless `min_cp_size` raises it); a pack takes one slot
on every unit of an aligned slice of its size, in one micro-batch. A unit's load is the time of its packs, a slot
not yet taken counted as a unit pack of the batch's shortest sequence (every slot ends up holding a pack of at least
one). A pack wider than a unit opens only where every earlier micro-batch of its slice is one pack covering the whole
slice, or free (then an empty pack of its size is reserved there), so all its ranks finish those micro-batches
together and nothing waits: the plan's time as the executor runs it is its highest load.

The fill takes the sequences longest first. Each goes where it adds the fewest rank-seconds among the places that
keep their ranks' load within the level (or do not raise it: with padding a sequence may shorten a pack's padding
by more than it adds), the lowest load on ties; where none does, where it ends lowest. A place is a pack it fits on
(its size, tokens per rank, MaxLen with Megatron's padding, `max_num_seqs`), a free slot of a unit (a new unit pack)
or, for a sequence too long for a unit or when nothing else keeps the level, a new wider pack on a slice whose
earlier micro-batches allow it, the narrowest first. When the sequences left are no more than the slots and packs
still empty, each goes to one of those, and when they are fewer than the free slots, to a new pack at least as wide
as the free slots per sequence left. Where nothing keeps the level, a pack twice as wide may take the sequence: a
pack and the free half of its slice, or two packs of one size side by side, merged. Slots left free at the end are
taken by widening the pack beside them (the one repair that may make ranks wait: the plan then says so and its time
is the executor's).
"""

from __future__ import annotations

import math

import numpy as np

from hydraplan.core.executors import DynamicCP, DynamicCPSchedule, dynamic_cp_time

TIE = 1e-9  # relative: rank-seconds this close are a tie (then the lower load wins)


class Batch:
    """One batch on one executor: the block sizes that tile the ranks (priced, dividing N), per size its width in
    units, coefficients, the tokens a pack holds; per sequence its per-rank work on each size and its narrowest
    size; the sequences longest first."""

    def __init__(self, lengths: np.ndarray, target: DynamicCP) -> None:
        t = self.t = target
        self.lengths, self.n, self.N = lengths, int(lengths.size), target.dpcp
        self.sizes = [k for k in t.cps if t.dpcp % k == 0]
        j = [t.cps.index(k) for k in self.sizes]
        self.K = len(self.sizes)
        self.s0 = self.sizes[0] if self.sizes else 1
        self.U = self.N // self.s0
        self.wu = np.asarray([k // self.s0 for k in self.sizes], dtype=np.int64)  # width in units
        self.a, self.b, self.c = (t.coef[j, x] for x in range(3))
        self.work = t.seq_costs(lengths)[j]  # (K, n) per-rank seconds, no constant
        self.len_l = lengths.tolist()
        self.cap = np.asarray([k * t.max_seqlen_per_rank for k in self.sizes], dtype=np.int64)
        self.max_len = np.asarray([t.max_lens[x] for x in j], dtype=np.int64)
        ok = t.fits(lengths)[j] if j else np.zeros((0, lengths.size), dtype=bool)
        self.least = np.where(ok.any(axis=0), ok.argmax(axis=0), self.K) if j else np.zeros(self.n, np.int64)
        self.order = np.lexsort((np.arange(self.n), -lengths)).tolist()
        self.pad = t.padding.alignment is not None
        self.plain = not self.pad and t.max_num_seqs is None  # room is tokens against cap and MaxLen only
        self.hold = np.minimum(self.cap, self.max_len)

    def times(self, k: np.ndarray, tokens: np.ndarray, work: np.ndarray) -> np.ndarray:
        """Pack times (size indices, tokens, per-rank work): the work, the constant, the padding's work."""
        t = work + self.c[k]
        if self.pad:
            d = self.t.padding.tail_tokens(tokens, np.asarray(self.sizes)[k], self.t.max_seqlen_per_rank)
            d = d.astype(np.float64)
            a, b = self.a[k], self.b[k]
            t = t + ((a * d + b) * d if self.t.padding.tail == "append_dummy_seq" else b * d)
        return t

    def holds(self, k: np.ndarray, tokens: np.ndarray, count: np.ndarray) -> np.ndarray:
        """Whether packs (size indices, tokens, sequence counts) may run."""
        if self.plain:
            return tokens <= self.hold[k]
        width = np.asarray(self.sizes)[k]
        d = (self.t.padding.tail_tokens(tokens, width, self.t.max_seqlen_per_rank) if self.pad
             else np.zeros_like(tokens))
        ok = (tokens <= self.cap[k]) & (tokens + d <= self.max_len[k])
        if self.t.max_num_seqs is not None:
            ok &= count + (self.t.padding.dummy & (d > 0)) <= self.t.max_num_seqs
        return ok

    def time1(self, k: int, tokens: int, work: float) -> float:
        if not self.pad:
            return work + float(self.c[k])
        return float(self.times(np.asarray([k]), np.asarray([tokens]), np.asarray([work]))[0])

    def holds1(self, k: int, tokens: int, count: int) -> bool:
        if self.plain:
            return tokens <= int(self.hold[k])
        return bool(self.holds(np.asarray([k]), np.asarray([tokens]), np.asarray([count]))[0])


class Plan:
    """Packs over M micro-batches of the batch's units: per pack its size index, first unit, micro-batch, tokens,
    sequence count, per-rank work, time and sequences; per slot its pack (-1: free); per unit its load."""

    def __init__(self, batch: Batch, m: int) -> None:
        B = self.B = batch
        self.M = m
        cap = m * B.U
        self.pk, self.lo, self.mb = (np.zeros(cap, dtype=np.int64) for _ in range(3))
        self.tok, self.cnt = np.zeros(cap, dtype=np.int64), np.zeros(cap, dtype=np.int64)
        self.work, self.time = np.zeros(cap), np.zeros(cap)
        self.wall = np.zeros((cap, B.K))  # per pack, its sequences' per-rank work at every size
        self.items: list[list[int]] = []
        self.P = 0
        self.slot = np.full((m, B.U), -1, dtype=np.int64)
        self.free = np.full(B.U, m, dtype=np.int64)
        self.empty_time = B.times(np.arange(B.K), np.zeros(B.K, dtype=np.int64), np.zeros(B.K))  # per size
        # a free slot ends up holding a unit pack of at least one sequence: counted as one of the shortest
        shortest = B.order[-1] if B.n else 0
        self.prepaid = B.time1(0, B.len_l[shortest], float(B.work[0, shortest])) if B.K and B.n else 0.0
        self.load = np.full(B.U, m * self.prepaid)
        self.off = np.concatenate([[0], np.cumsum(B.U // B.wu)]).astype(np.int64)
        self._seg: np.ndarray | None = None  # per size, each aligned slice's highest load (None: loads changed)
        self.at = np.zeros(cap, dtype=np.int64)  # each pack's slice in `seg`
        self.empties = m * B.U  # free slots and empty packs: what the sequences left must still fill
        self._slices: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray] | None] = {}  # per size, until a slot changes
        self.waits = False  # a repair widened a pack over ranks not all free at once: its time is the executor's

    # ------------------------------------------------------------------------------------------ changes
    def _loaded(self, lo: int, hi: int, delta: float) -> None:
        self.load[lo:hi] += delta
        self._seg = None

    @property
    def seg(self) -> np.ndarray:
        """Each size's aligned slices' highest loads, one size after another (`off`)."""
        if self._seg is None:
            seg, off, wu = np.empty(int(self.off[-1])), self.off.tolist(), self.B.wu.tolist()
            for k, w in enumerate(wu):
                out = seg[off[k]:off[k + 1]]
                if k and w == 2 * wu[k - 1]:  # pairs of the slices one size narrower
                    prev = seg[off[k - 1]:off[k]]
                    np.maximum(prev[0::2], prev[1::2], out=out)
                else:
                    out[:] = self.load.reshape(-1, w).max(axis=1)
            self._seg = seg
        return self._seg

    def open(self, k: int, lo: int, m: int) -> int:
        """A new empty pack of size index k on units lo.. in micro-batch m."""
        p, w = self.P, int(self.B.wu[k])
        self.P += 1
        self.pk[p], self.lo[p], self.mb[p] = k, lo, m
        self.tok[p] = self.cnt[p] = 0
        self.work[p], self.time[p] = 0.0, self.empty_time[k]
        self.wall[p] = 0.0
        self.at[p] = self.off[k] + lo // w
        self.items.append([])
        self.slot[m, lo:lo + w] = p
        self.free[lo:lo + w] -= 1
        self.empties -= w - 1
        self._slices.clear()
        self._loaded(lo, lo + w, self.time[p] - self.prepaid)
        return p

    def add(self, p: int, i: int) -> None:
        B, k = self.B, int(self.pk[p])
        if self.cnt[p] == 0:
            self.empties -= 1
        self.items[p].append(i)
        self.tok[p] += B.len_l[i]
        self.cnt[p] += 1
        self.work[p] += B.work[k, i]
        self.wall[p] += B.work[:, i]
        self._retime(p)

    def _retime(self, p: int) -> None:
        k, lo = int(self.pk[p]), int(self.lo[p])
        t = self.B.time1(k, int(self.tok[p]), float(self.work[p]))
        self._loaded(lo, lo + int(self.B.wu[k]), t - self.time[p])
        self.time[p] = t

    def widen(self, p: int) -> None:
        """Pack p twice as wide over the free slots of the other half of its aligned slice."""
        B, k, lo, m = self.B, int(self.pk[p]), int(self.lo[p]), int(self.mb[p])
        w = int(B.wu[k])
        base = lo - lo % (2 * w)
        other = base + w if base == lo else base
        self.slot[m, other:other + w] = p
        self.free[other:other + w] -= 1
        self.empties -= w
        self._slices.clear()
        self._loaded(other, other + w, self.time[p] - self.prepaid)  # as its old half, then both retimed
        self.pk[p], self.lo[p] = k + 1, base
        self.at[p] = self.off[k + 1] + base // (2 * w)
        self.work[p] = float(self.wall[p, k + 1])
        self._retime(p)

    def merge(self, p: int, q: int) -> None:
        """Packs p and q, the halves of an aligned slice in one micro-batch, as one pack twice as wide (p)."""
        B, k, m = self.B, int(self.pk[p]), int(self.mb[p])
        w, lo = int(B.wu[k]), min(int(self.lo[p]), int(self.lo[q]))
        self.empties -= int(self.cnt[p] == 0) + int(self.cnt[q] == 0) - int(self.cnt[p] + self.cnt[q] == 0)
        self.slot[m, lo:lo + 2 * w] = p
        self._slices.clear()
        self._loaded(int(self.lo[q]), int(self.lo[q]) + w, self.time[p] - self.time[q])
        self.items[p] += self.items[q]
        self.tok[p] += self.tok[q]
        self.cnt[p] += self.cnt[q]
        self.wall[p] += self.wall[q]
        self.items[q], self.tok[q], self.cnt[q], self.pk[q] = [], 0, 0, -1  # gone
        self.pk[p], self.lo[p] = k + 1, lo
        self.at[p] = self.off[k + 1] + lo // (2 * w)
        self.work[p] = float(self.wall[p, k + 1])
        self._retime(p)

    def synced(self, m: int, lo: int, w: int) -> bool:
        """Whether every micro-batch before m is one pack over units lo..lo+w-1, so they are all free at once."""
        sl = self.slot[:m, lo:lo + w]
        return bool(((sl == sl[:, :1]) & (sl >= 0)).all())

    @property
    def makespan(self) -> float:
        """When the last rank finishes: its load, or as the executor runs the plan where a repair made ranks wait."""
        if self.waits:
            return dynamic_cp_time(self.B.t, self.lists(), self.B.lengths)
        return float(self.load.max())

    # ------------------------------------------------------------------------------------------ placing
    def place(self, i: int, level: float, remaining: int) -> bool:
        """Sequence i to the place that keeps the level with the fewest rank-seconds (the lowest load on ties), or
        else ends lowest; False when it fits nowhere."""
        B = self.B
        L, least = B.len_l[i], int(B.least[i])
        must = remaining <= self.empties
        spare = int(self.free.sum())
        # too few sequences left for a pack on every free slot: this one opens a pack at least as wide as the free
        # slots per sequence left
        wide = int(B.wu[-1]) if spare > remaining and B.K else 1
        if spare > remaining and B.K:
            wide = min(int(B.wu[-1]), 1 << max(0, math.ceil(math.log2(spare / remaining))))
        best: tuple[bool, float, float] | None = None
        act: tuple = ()
        P = self.P
        if P:
            kp = self.pk[:P]
            if B.plain:
                delta = B.work[kp, i]
                ok = (kp >= least) & (self.tok[:P] + L <= B.hold[kp])
            else:
                tok = self.tok[:P] + L
                delta = B.times(kp, tok, self.work[:P] + B.work[kp, i]) - self.time[:P]
                ok = (kp >= least) & B.holds(kp, tok, self.cnt[:P] + 1)
            if must:
                ok &= self.cnt[:P] == 0
            if ok.any():
                res = self.seg[self.at[:P]] + delta
                cand = _pick(ok, res, B.wu[kp] * delta, level)
                if cand is not None:
                    best, act = cand[:3], ("join", cand[3])
        unit = least == 0 and wide <= 1 and spare > 0 and B.holds1(0, L, 1)
        if unit:
            d = B.time1(0, L, float(B.work[0, i])) - self.prepaid
            u = int(np.argmin(np.where(self.free > 0, self.load, np.inf)))
            res_u = float(self.load[u] + d)
            cand_u = (res_u > level and d > 0, d if res_u <= level or d <= 0 else res_u, res_u)
            if best is None or _better(cand_u, best):
                best, act = cand_u, ("unit", u)
        if least > 0 or wide > 1 or ((best is None or best[0]) and spare >= 2):
            for k in range(max(1, least), B.K):
                if B.wu[k] < wide or not B.holds1(k, L, 1):
                    continue
                found = self._wide(k, i, level)
                if found is not None and (best is None or _better(found[0], best)):
                    best, act = found
                if found is not None and not found[0][0]:
                    break  # within the level: a wider new pack would take more rank-seconds
        if best is None or best[0]:
            grown = self._growth(i)
            if grown is not None and (best is None or grown[0] <= level):
                _, p, q = grown
                if q < 0:
                    self.widen(p)
                else:
                    self.merge(p, q)
                self.add(p, i)
                return True
        if best is None:
            return False
        if act[0] == "join":
            self.add(int(act[1]), i)
        elif act[0] == "unit":
            u = act[1]
            self.add(self.open(0, u, int(np.flatnonzero(self.slot[:, u] == -1)[-1])), i)
        else:
            _, k, lo, m, fills = act
            for f in fills:
                self.open(k, lo, f)
            self.add(self.open(k, lo, m), i)
        return True

    def _wide(self, k: int, i: int, level: float) -> tuple[tuple[bool, float, float], tuple] | None:
        """The best new pack of size index k for sequence i (the slices that may take one: `_open_slices`)."""
        B = self.B
        if k not in self._slices:
            self._slices[k] = self._open_slices(k)
        slices = self._slices[k]
        if slices is None:
            return None
        js, first, fills = slices
        w = int(B.wu[k])
        t_new = B.time1(k, B.len_l[i], float(B.work[k, i]))
        add = t_new - self.prepaid + fills * (self.empty_time[k] - self.prepaid)
        res = self.seg[self.off[k] + js] + add
        cand = _pick(np.ones(js.size, dtype=bool), res, w * add, level)
        if cand is None:
            return None
        x = int(cand[3])
        j, m = int(js[x]), int(first[x])
        return cand[:3], ("wide", k, j * w, m, np.flatnonzero(self.slot[:m, j * w] == -1).tolist())

    def _open_slices(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Slices of size index k that may take a new pack: the first micro-batch free on all their units whose
        earlier micro-batches are each one pack over the slice or free (reserved then); (slices, micro-batch,
        reservations)."""
        B, M = self.B, self.M
        w = int(B.wu[k])
        sl = self.slot.reshape(M, B.U // w, w)
        free = (sl == -1).all(axis=2)
        whole = (sl == sl[:, :, :1]).all(axis=2) & (sl[:, :, 0] >= 0)
        earlier = np.cumprod(np.vstack([np.ones((1, free.shape[1]), dtype=bool), (free | whole)[:-1]]), axis=0)
        valid = free & earlier.astype(bool)
        js = np.flatnonzero(valid.any(axis=0))
        if not js.size:
            return None
        first = valid[:, js].argmax(axis=0)
        fills = (np.cumsum(free[:, js], axis=0) - free[:, js])[first, np.arange(js.size)]
        return js, first, fills

    def _growth(self, i: int) -> tuple[float, int, int] | None:
        """Where no place keeps sequence i within the level: a pack twice as wide for it, from a pack and the free
        half beside it or two packs of one size side by side, their slice free at once (res, pack, the other pack or
        -1); the one ending lowest."""
        B, P, L = self.B, self.P, self.B.len_l[i]
        if not P or B.K < 2:
            return None
        k = self.pk[:P]
        up = np.minimum(k + 1, B.K - 1)
        w = B.wu[np.maximum(k, 0)]
        lo, mb = self.lo[:P], self.mb[:P]
        ok = (k >= 0) & (k + 1 < B.K) & (B.wu[up] == 2 * w) & (up >= int(B.least[i]))
        buddy = np.where((lo // w) % 2 == 0, lo + w, lo - w)
        q = self.slot[mb, np.minimum(buddy, B.U - 1)]
        qs = np.maximum(q, 0)
        pair = ok & (lo < buddy) & (q >= 0) & (self.pk[qs] == k) & (self.lo[qs] == buddy)
        freecum = np.concatenate([np.zeros((self.M, 1), dtype=np.int64), np.cumsum(self.slot == -1, axis=1)], axis=1)
        end = np.minimum(buddy + w, B.U)
        spare = ok & (freecum[mb, end] - freecum[mb, np.minimum(buddy, B.U)] == w)
        if not (pair | spare).any():
            return None
        tok = self.tok[:P] + np.where(pair, self.tok[qs], 0) + L
        cnt = self.cnt[:P] + np.where(pair, self.cnt[qs], 0) + 1
        work = self.wall[np.arange(P), up] + np.where(pair, self.wall[qs, up], 0.0) + B.work[up, i]
        fine = (pair | spare) & B.holds(up, tok, cnt)
        if not fine.any():
            return None
        t = B.times(up, tok, work)
        seg = self.seg
        at_buddy = self.off[np.maximum(k, 0)] + np.minimum(buddy, B.U - 1) // w
        was = np.where(pair, self.time[qs], self.prepaid)
        res = np.maximum(seg[self.at[:P]] - self.time[:P], seg[at_buddy] - was) + t
        for p in np.flatnonzero(fine)[np.argsort(res[fine], kind="stable")][:4].tolist():
            wp = int(w[p])
            base = min(int(lo[p]), int(buddy[p]))
            if self.synced(int(mb[p]), base, 2 * wp):
                return float(res[p]), p, int(q[p]) if pair[p] else -1
        return None

    # ------------------------------------------------------------------------------------------ finishing
    def settle(self) -> bool:
        """Free slots and empty packs left (fewer sequences than slots) taken by widening the pack beside them;
        False when one cannot be."""
        if ((self.cnt[:self.P] == 0) & (self.pk[:self.P] >= 0)).any():
            return False
        while (self.free > 0).any():
            grown = False
            for m, u in zip(*np.nonzero(self.slot == -1), strict=True):
                p = self._beside(int(m), int(u))
                if p is not None:
                    w = 2 * int(self.B.wu[self.pk[p]])
                    self.waits |= not self.synced(int(m), int(self.lo[p]) - int(self.lo[p]) % w, w)
                    self.widen(p)
                    grown = True
                    break
            if not grown:
                return False
        return True

    def _beside(self, m: int, u: int) -> int | None:
        """A pack of micro-batch m that can widen over the free half holding unit u: the other half of an aligned
        slice is exactly that pack, of a size with a twice-as-wide size, and it still holds its sequences there."""
        B = self.B
        for k in range(B.K - 1):
            w = int(B.wu[k])
            if int(B.wu[k + 1]) != 2 * w:
                continue
            base = u - u % (2 * w)
            mine, other = (base, base + w) if u < base + w else (base + w, base)
            if not (self.slot[m, mine:mine + w] == -1).all():
                return None
            p = int(self.slot[m, other])
            if p >= 0 and int(self.pk[p]) == k and int(self.lo[p]) == other and \
                    B.holds1(k + 1, int(self.tok[p]), int(self.cnt[p])):
                return p
        return None

    def lists(self) -> DynamicCPSchedule:
        """Rank lists: each pack, longest sequence first, on its ranks."""
        B = self.B
        out: DynamicCPSchedule = [[[] for _ in range(B.N)] for _ in range(self.M)]
        for p in range(self.P):
            if self.pk[p] < 0:
                continue
            pack = sorted(self.items[p], key=lambda i: (-B.len_l[i], i))
            w = int(B.wu[self.pk[p]]) * B.s0
            for r in range(int(self.lo[p]) * B.s0, int(self.lo[p]) * B.s0 + w):
                out[int(self.mb[p])][r] = list(pack)
        return out


def _pick(ok: np.ndarray, res: np.ndarray, rank: np.ndarray, level: float
          ) -> tuple[bool, float, float, int] | None:
    """Among allowed places: the fewest rank-seconds of those within the level or not raising their ranks' load (with
    padding, a sequence can shorten a pack's padding by more than it adds), the lowest load on ties; else the lowest
    load: (over the level, its key, its load, index)."""
    within = ok & ((res <= level) | (rank <= 0))
    if within.any():
        r = np.where(within, rank, np.inf)
        least = r.min()
        tied = within & (r <= least + abs(least) * TIE + 1e-15)
        j = int(np.argmin(np.where(tied, res, np.inf)))
        return False, float(least), float(res[j]), j
    if not ok.any():
        return None
    j = int(np.argmin(np.where(ok, res, np.inf)))
    return True, float(res[j]), float(res[j]), j


def _better(a: tuple[bool, float, float], b: tuple[bool, float, float]) -> bool:
    if a[0] != b[0]:
        return not a[0]
    if abs(a[1] - b[1]) > max(abs(a[1]), abs(b[1])) * TIE + 1e-15:
        return a[1] < b[1]
    return a[2] < b[2]


def fill(batch: Batch, m: int, level: float) -> Plan | None:
    """The plan of m micro-batches filled at `level`; None when a sequence fits nowhere or slots stay free."""
    plan = Plan(batch, m)
    for left, i in enumerate(batch.order):
        if not plan.place(i, level, batch.n - left):
            return None
    return plan if plan.settle() else None


def level_start(batch: Batch, m: int) -> float:
    """No plan of m micro-batches ends before: every unit's m slots at the cheapest constant, and every sequence's
    rank-seconds at its cheapest size spread over the units."""
    if not batch.K:
        return math.inf
    widths = np.asarray(batch.sizes, dtype=np.float64)[:, None]
    fits = np.arange(batch.K)[:, None] >= batch.least[None, :]
    rank_s = np.where(fits, batch.work * widths, np.inf).min(axis=0).sum()
    return float(m * batch.c.min() + rank_s / batch.N)
