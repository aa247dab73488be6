"""hydraplan's schedule for Megatron's dynamic-CP executor (core.executors.DynamicCP), priced on the profile.

For a micro-batch count M (from the fewest the batch allows up), a layout is a number of blocks of each size
filling the M x N rank slots. A layout is scored by filling it: sequences, longest first, each go to the block of a
size they fit (tokens per rank, MaxLen, `max_num_seqs`) that finishes earliest with them (LPT on the canonical cost
model: per-rank work a*L^2 + b*L at the block's size, its constant c once, the padding Megatron adds), an empty
block then taking a sequence from the slowest one; blocks go to micro-batches widest first (so every block lands on
an aligned slice), slowest together, and the layout's score is the sum of the micro-batches' slowest blocks. The
first layouts: all blocks of one size, and one budgeted from the cost model (at the level the batch's work allows
per micro-batch, every sequence on the size where it takes the fewest rank slots, its GPU-seconds over what a
block of that size has left of the level after c; each size then as many blocks as its work, tokens and sequence
count need). From the best, a descent changes the size of the slowest block's blocks (two into one twice as wide,
or one into two half as wide) while that lowers the score; then a local search moves sequences out of each
micro-batch's slowest block while that lowers the sum. The fastest schedule, as the executor runs it, is compared
with Megatron's own (solve.megatron.default_dynamic_cp) and the faster taken, so the plugin is never slower on a
batch than Megatron's scheduler.

Pure and deterministic: a function of the lengths and the executor only (ties go to the lower index; no clock, no
randomness). Imports numpy and the core only, so it loads in a training process without the planner's solvers.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from hydraplan.core.errors import UserError
from hydraplan.core.executors import (
    DynamicCP,
    DynamicCPSchedule,
    dynamic_cp_fewest_microbatches,
    dynamic_cp_lower_bound,
    dynamic_cp_time,
    dynamic_cp_violations,
)
from hydraplan.solve.megatron.default_dynamic_cp import default_dynamic_cp_schedule

EXTRA_MICROBATCHES = 4  # micro-batch counts tried past the fewest
MISSES = 2  # ... stopping after this many in a row do not improve
ROUNDS = 4  # rounds of choosing sizes at a level and the level of those sizes (the budgeted layout)
LAYOUT_STEPS = 12  # descent steps over layouts
SCAN = 8  # blocks of a size looked at, earliest-finishing first, for one with room
SEARCH_STEPS = 4  # local-search moves per block, at most


class _Batch:
    """One batch on one executor: the block sizes that tile the ranks (priced, dividing N) and, per size index k,
    the per-rank work of every sequence, the constant, the token and memory limits; per sequence its narrowest
    size index; the sequences longest first."""

    def __init__(self, lengths: np.ndarray, target: DynamicCP) -> None:
        t = self.t = target
        self.lengths, self.n, self.N = lengths, int(lengths.size), target.dpcp
        self.sizes = [k for k in t.cps if t.dpcp % k == 0]
        j = [t.cps.index(k) for k in self.sizes]
        self.K = len(self.sizes)
        self.a, self.b, self.c = (t.coef[j, x].tolist() for x in range(3))
        self.work = t.seq_costs(lengths)[j]  # (K, n) per-rank seconds
        self.work_l = [row.tolist() for row in self.work]
        self.len_l = lengths.tolist()
        self.cap = [k * t.max_seqlen_per_rank for k in self.sizes]
        self.max_len = [t.max_lens[x] for x in j]
        ok = t.fits(lengths)[j] if j else np.zeros((0, lengths.size), dtype=bool)
        self.least = np.where(ok.any(axis=0), ok.argmax(axis=0), self.K) if j else np.zeros(self.n, dtype=np.int64)
        self.least_l = self.least.tolist()
        self.order = np.lexsort((np.arange(self.n), -lengths)).tolist()
        self.pad = t.padding.alignment is not None

    def tail(self, k: int, tokens: int) -> int:
        return int(self.t.padding.tail_tokens(tokens, self.sizes[k], self.t.max_seqlen_per_rank)) if self.pad else 0

    def time(self, k: int, tokens: int, work: float) -> float:
        """A block's time: its work, its constant, the padding's work."""
        if not self.pad:
            return work + self.c[k]
        d = self.tail(k, tokens)
        extra = (self.a[k] * d + self.b[k]) * d if self.t.padding.tail == "append_dummy_seq" else self.b[k] * d
        return work + self.c[k] + extra

    def holds(self, k: int, tokens: int, count: int) -> bool:
        """Whether a pack of `count` sequences and `tokens` tokens may run on a block of size index k."""
        if tokens > self.cap[k]:
            return False
        d = self.tail(k, tokens)
        if self.t.max_num_seqs is not None and count + int(self.t.padding.dummy and d > 0) > self.t.max_num_seqs:
            return False
        return tokens + d <= self.max_len[k]


class _Plan:
    """Blocks across all micro-batches: size index, sequences, tokens, per-rank work, time and micro-batch."""

    def __init__(self, batch: _Batch, counts: list[int]) -> None:
        self.B = batch
        self.k = [k for k, count in enumerate(counts) for _ in range(count)]
        self.items: list[list[int]] = [[] for _ in self.k]
        self.tokens = [0] * len(self.k)
        self.work = [0.0] * len(self.k)
        self.time = [batch.time(k, 0, 0.0) for k in self.k]
        self.mb = [-1] * len(self.k)

    def room(self, b: int, i: int) -> bool:
        return self.B.holds(self.k[b], self.tokens[b] + self.B.len_l[i], len(self.items[b]) + 1)

    def after(self, b: int, i: int, sign: int = 1) -> float:
        """Block b's time once sequence i joins it (sign 1) or leaves it (-1)."""
        k = self.k[b]
        return self.B.time(k, self.tokens[b] + sign * self.B.len_l[i], self.work[b] + sign * self.B.work_l[k][i])

    def move(self, b: int, i: int, sign: int = 1) -> None:
        k = self.k[b]
        self.tokens[b] += sign * self.B.len_l[i]
        self.work[b] += sign * self.B.work_l[k][i]
        if sign > 0:
            self.items[b].append(i)
        else:
            self.items[b].remove(i)
        self.time[b] = self.B.time(k, self.tokens[b], self.work[b])

    def resize(self, b: int, k: int) -> None:
        self.k[b] = k
        self.work[b] = float(self.B.work[k, self.items[b]].sum())
        self.time[b] = self.B.time(k, self.tokens[b], self.work[b])

    def live(self) -> list[int]:
        return [b for b in range(len(self.k)) if self.k[b] >= 0]


def schedule_dynamic_cp(lengths: np.ndarray, target: DynamicCP) -> DynamicCPSchedule:
    """sample_id_groups for Megatron's dynamic-CP executor: [micro-batch][DPxCP rank] -> positions into `lengths`."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        raise UserError("dynamic CP: an empty global batch")
    fits = target.fits(lengths)
    if not fits.any(axis=0).all():
        worst = int(lengths[np.argmin(fits.any(axis=0))])
        raise UserError(f"dynamic CP: a sequence of {worst} tokens fits on no block of <{target.tp},1,k> up to "
                        f"{target.cps[-1]} ranks at {target.max_seqlen_per_rank} tokens per rank")
    theirs: DynamicCPSchedule | None = None
    their_s = math.inf
    try:
        theirs = default_dynamic_cp_schedule(lengths, dpcp=target.dpcp, max_seqlen_per_rank=target.max_seqlen_per_rank,
                                             min_cp_size=target.min_cp_size, vpp_group=target.vpp_group)
        if not dynamic_cp_violations(theirs, lengths, target):
            their_s = dynamic_cp_time(target, theirs, lengths)
    except UserError:  # Megatron's scheduler fails on this batch
        pass
    batch = _Batch(lengths, target)
    best: tuple[float, int, _Plan] | None = None  # (score, micro-batches, plan)
    step = target.vpp_group or 1
    fewest = m = dynamic_cp_fewest_microbatches(target, lengths)
    bound, misses = dynamic_cp_lower_bound(target, lengths), 0
    while m <= min(lengths.size, fewest + EXTRA_MICROBATCHES * step) and not (batch.least >= batch.K).any():
        if best is not None and bound + (m - fewest) * min(batch.c) >= best[0]:
            break  # every further micro-batch adds at least the cheapest constant to what the batch needs
        plan = _best_plan(batch, m)
        if plan is not None and (best is None or plan[0] < best[0] * (1 - 1e-12)):
            best, misses = (plan[0], m, plan[1]), 0
        elif best is not None:
            misses += 1
            if misses >= MISSES:
                break
        m += step
    ours, our_s = None, math.inf
    if best is not None:
        _search(best[2], best[1])
        ours = _lists(best[2], best[1])
        our_s = dynamic_cp_time(target, ours, lengths)
    if ours is not None and our_s <= their_s:
        return ours
    if theirs is not None and their_s < math.inf:
        return theirs
    raise UserError(f"dynamic CP: {lengths.size} sequences cannot be scheduled on {target.dpcp} ranks of "
                    f"{target.max_seqlen_per_rank} tokens (no micro-batch count up to {m} gives every rank a pack)")


# --------------------------------------------------------------------------------------------- layouts
def _best_plan(batch: _Batch, m: int) -> tuple[float, _Plan] | None:
    """The best plan in m micro-batches the layout descent finds, with its score; None if none fills them."""
    slots = m * batch.N
    starts = [[slots // s if k == x else 0 for k in range(batch.K)] for x, s in enumerate(batch.sizes)
              if slots // s <= batch.n]
    budgeted = _budget(batch, slots)
    if budgeted is not None:
        starts.append(budgeted)
    best: tuple[float, list[int], _Plan] | None = None
    for counts in starts:
        plan = _fill(batch, counts, m)
        if plan is not None and (best is None or _score(plan, m) < best[0]):
            best = (_score(plan, m), counts, plan)
    if best is None:
        return None
    for _ in range(LAYOUT_STEPS):
        score, counts, plan = best
        slow = max(plan.live(), key=lambda b: (plan.time[b], -b))
        k = plan.k[slow]
        moves = []
        if counts[k] >= 2 and k + 1 < batch.K:
            moves.append((k, -2, k + 1, 1))  # two blocks of the slow size become one twice as wide
        if k + 1 < batch.K and counts[k + 1] >= 1:
            moves.append((k + 1, -1, k, 2))  # one wider block becomes two of the slow size
        if k > 0 and counts[k] >= 1:
            moves.append((k, -1, k - 1, 2))  # a block of the slow size becomes two half as wide
        found = None
        for x, dx, y, dy in moves:
            trial = list(counts)
            trial[x] += dx
            trial[y] += dy
            plan2 = _fill(batch, trial, m)
            if plan2 is not None and _score(plan2, m) < (found[0] if found else score) * (1 - 1e-12):
                found = (_score(plan2, m), trial, plan2)
        if found is None:
            break
        best = found
    return best[0], best[2]


def _fill(batch: _Batch, counts: list[int], m: int) -> _Plan | None:
    """The layout's blocks in micro-batches (widest first), filled longest sequence first, each to the block that
    raises the sum of the micro-batches' slowest blocks least, then finishes earliest (LPT within a micro-batch: a
    micro-batch slower than another is filled to its slowest block before the other grows); no block left empty.
    None if a sequence finds no room."""
    plan = _Plan(batch, counts)
    _to_microbatches(plan, m)
    top = [0.0] * m  # every block gets a sequence: its constant is paid whatever it holds
    for b, x in enumerate(plan.mb):
        top[x] = max(top[x], plan.time[b])
    lists: list[list[tuple[float, int]]] = [[] for _ in range(batch.K * m)]  # per (size, micro-batch), by time
    for b, k in enumerate(plan.k):
        lists[k * m + plan.mb[b]].append((plan.time[b], b))
    for i in batch.order:
        pick, key = -1, (math.inf, math.inf)
        for k in range(batch.least_l[i], batch.K):
            for x in range(m):
                for t, b in lists[k * m + x][:SCAN]:
                    if (max(t - top[x], 0.0), t) >= key:
                        break
                    if plan.room(b, i):
                        after = plan.after(b, i)
                        key_b = (max(after - top[x], 0.0), after)
                        if key_b < key:
                            pick, key = b, key_b
                        break
        if pick < 0:
            fits = [b for b in range(len(plan.k)) if plan.k[b] >= batch.least_l[i] and plan.room(b, i)]
            if not fits:
                return None
            pick = min(fits, key=lambda b: (max(plan.after(b, i) - top[plan.mb[b]], 0.0), plan.after(b, i), b))
        lst = lists[plan.k[pick] * m + plan.mb[pick]]
        lst.pop(bisect.bisect_left(lst, (plan.time[pick], pick)))
        plan.move(pick, i)
        bisect.insort(lst, (plan.time[pick], pick))
        top[plan.mb[pick]] = max(top[plan.mb[pick]], plan.time[pick])
    return plan if _no_empty(plan) else None


def _no_empty(plan: _Plan) -> bool:
    """Every block holds a sequence: an empty one takes one from the slowest block that can spare one (the one
    leaving the pair most even); failing that, it is dropped and the slowest block of its size in its micro-batch
    widens over its ranks."""
    B = plan.B
    for e in range(len(plan.k)):
        if plan.items[e] or plan.k[e] < 0:
            continue
        donors = sorted((b for b in plan.live() if len(plan.items[b]) > 1), key=lambda b: (-plan.time[b], b))
        for b in donors:
            movable = [i for i in plan.items[b] if plan.k[e] >= B.least_l[i] and plan.room(e, i)]
            if movable:
                i = min(movable, key=lambda i: (abs(plan.after(b, i, -1) - plan.after(e, i)), i))
                plan.move(b, i, -1)
                plan.move(e, i)
                break
        else:
            same = [b for b in plan.live() if b != e and plan.k[b] == plan.k[e] and plan.mb[b] == plan.mb[e]
                    and plan.items[b]]
            if not same or plan.k[e] + 1 >= B.K or B.sizes[plan.k[e] + 1] != 2 * B.sizes[plan.k[e]]:
                return False
            plan.resize(max(same, key=lambda b: (plan.time[b], -b)), plan.k[e] + 1)
            plan.k[e] = -1  # dropped: its ranks went to the widened block
    return True


def _to_microbatches(plan: _Plan, m: int) -> None:
    """Blocks to micro-batches, widest first (each micro-batch's free ranks stay a multiple of the next width, so all
    fill exactly), slowest first within a width, each to the micro-batch with room whose slowest block is slowest."""
    free = [plan.B.N] * m
    top = [0.0] * m
    for b in sorted(plan.live(), key=lambda b: (-plan.k[b], -plan.time[b], b)):
        w = plan.B.sizes[plan.k[b]]
        x = max((x for x in range(m) if free[x] >= w), key=lambda x: (top[x], -x))
        plan.mb[b] = x
        free[x] -= w
        top[x] = max(top[x], plan.time[b])


def _score(plan: _Plan, m: int) -> float:
    """The sum over micro-batches of their slowest block."""
    top = [0.0] * m
    for b in plan.live():
        top[plan.mb[b]] = max(top[plan.mb[b]], plan.time[b])
    return sum(top)


def _search(plan: _Plan, m: int) -> None:
    """Moves of a sequence out of a micro-batch's slowest block into another block, and swaps of it with a sequence
    of another block, lowering the sum over micro-batches of their slowest block; the best each step, among the few
    sequences of each slowest block nearest half its lead over the next block of its micro-batch."""
    B = plan.B
    live = np.array(plan.live())
    k = np.array([plan.k[b] for b in live])
    mbs = np.array([plan.mb[b] for b in live])
    lens = np.asarray(B.len_l)
    for _ in range(SEARCH_STEPS * live.size):
        times = np.array([plan.time[b] for b in live])
        tokens = np.array([plan.tokens[b] for b in live])
        work = np.array([plan.work[b] for b in live])
        count = np.array([len(plan.items[b]) for b in live])
        owner = np.full(B.n, -1)
        for q, b in enumerate(live.tolist()):
            owner[plan.items[b]] = q
        top = np.full(m, -np.inf)
        np.maximum.at(top, mbs, times)
        best = None
        for x in range(m):
            here = np.flatnonzero(mbs == x)
            order = here[np.argsort(-times[here], kind="stable")]
            slow = int(order[0])
            second = float(times[order[1]]) if order.size > 1 else -np.inf
            items = plan.items[int(live[slow])]
            w_slow = B.work[k[slow], items]
            near = np.argsort(np.abs(w_slow - (times[slow] - second) / 2), kind="stable")[:2 * SEARCH_STEPS]
            for i in (items[q] for q in near.tolist()):
                # a move: i to block q (the slow block must keep a sequence)
                if len(items) > 1:
                    new_x = max(plan.after(int(live[slow]), i, -1), second)
                    t_q = _times(B, k, tokens + lens[i], work + B.work[k, i])
                    ok = (k >= B.least_l[i]) & _holds(B, k, tokens + lens[i], count + 1)
                    ok[slow] = False
                    gain = _gains(top, mbs, x, new_x, t_q, ok)
                    q = int(np.argmax(gain))
                    if gain[q] > 1e-12 and (best is None or gain[q] > best[0]):
                        best = (float(gain[q]), i, int(live[slow]), int(live[q]), -1)
                # a swap: i for a sequence j of block owner[j]
                q = owner
                dl = lens - lens[i]
                t_x = _times(B, np.full(B.n, k[slow]), tokens[slow] + dl, work[slow] - B.work[k[slow], i] + B.work[k[slow]])
                t_q = _times(B, k[q], tokens[q] - dl, work[q] - B.work[k[q], np.arange(B.n)] + B.work[k[q], i])
                ok = ((q != slow) & (B.least <= k[slow]) & (k[q] >= B.least_l[i])
                      & _holds(B, np.full(B.n, k[slow]), tokens[slow] + dl, count[slow])
                      & _holds(B, k[q], tokens[q] - dl, count[q]))
                same = mbs[q] == x
                new_x = np.maximum(t_x, second)
                gain = np.where(same, top[x] - np.maximum(new_x, np.where(same, t_q, -np.inf)),
                                top[x] - new_x - (np.maximum(top[mbs[q]], t_q) - top[mbs[q]]))
                gain = np.where(ok, gain, -np.inf)
                j = int(np.argmax(gain))
                if gain[j] > 1e-12 and (best is None or gain[j] > best[0]):
                    best = (float(gain[j]), i, int(live[slow]), int(live[q[j]]), j)
        if best is None:
            return
        _, i, src, dst, j = best
        plan.move(src, i, -1)
        plan.move(dst, i)
        if j >= 0:
            plan.move(dst, j, -1)
            plan.move(src, j)


def _times(B: _Batch, k: np.ndarray, tokens: np.ndarray, work: np.ndarray) -> np.ndarray:
    """Block times (size indices k, tokens, per-rank work), vectorized: work, constant, padding."""
    t = work + np.asarray(B.c)[k]
    if B.pad:
        d = B.t.padding.tail_tokens(tokens, np.asarray(B.sizes)[k], B.t.max_seqlen_per_rank).astype(np.float64)
        a, b = np.asarray(B.a)[k], np.asarray(B.b)[k]
        t = t + ((a * d + b) * d if B.t.padding.tail == "append_dummy_seq" else b * d)
    return t


def _holds(B: _Batch, k: np.ndarray, tokens: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Whether packs (size indices k, tokens, sequence counts) may run, vectorized."""
    width = np.asarray(B.sizes)[k]
    d = (B.t.padding.tail_tokens(tokens, width, B.t.max_seqlen_per_rank) if B.pad else np.zeros_like(tokens))
    ok = (tokens <= np.asarray(B.cap)[k]) & (tokens + d <= np.asarray(B.max_len)[k])
    if B.t.max_num_seqs is not None:
        ok &= count + (B.t.padding.dummy & (d > 0)) <= B.t.max_num_seqs
    return ok


def _gains(top: np.ndarray, mbs: np.ndarray, x: int, new_x: float, t_q: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """How much the sum of the micro-batches' slowest blocks falls when micro-batch x's slowest becomes new_x and
    block q's time t_q (one q at a time)."""
    gain = np.where(mbs == x, top[x] - np.maximum(new_x, t_q), top[x] - new_x - (np.maximum(top[mbs], t_q) - top[mbs]))
    return np.where(ok, gain, -np.inf)


def _lists(plan: _Plan, m: int) -> DynamicCPSchedule:
    """Rank lists: in each micro-batch the blocks widest first from rank 0 (aligned), each pack longest first."""
    B = plan.B
    out: DynamicCPSchedule = [[[] for _ in range(B.N)] for _ in range(m)]
    at = [0] * m
    for b in sorted(plan.live(), key=lambda b: (plan.mb[b], -plan.k[b], -plan.time[b], b)):
        x, lo, w = plan.mb[b], at[plan.mb[b]], B.sizes[plan.k[b]]
        pack = sorted(plan.items[b], key=lambda i: (-B.len_l[i], i))
        for r in range(lo, lo + w):
            out[x][r] = list(pack)
        at[x] = lo + w
    return out


# ------------------------------------------------------------------------------------- the budgeted layout
def _budget(batch: _Batch, slots: int) -> list[int] | None:
    """The budgeted layout (blocks per size): every sequence on the size where it takes the fewest rank slots at the
    level, wider where it alone would outlast the level, until sizes and level agree; then the blocks per size."""
    n, K = batch.n, batch.K
    per_rank, c = batch.work, np.asarray(batch.c)
    width = np.asarray(batch.sizes, dtype=np.float64)[:, None]
    allowed = np.arange(K)[:, None] >= batch.least[None, :]
    kidx = batch.least.copy()
    for _ in range(ROUNDS):
        level = _level(kidx, per_rank, c, batch.sizes, slots)
        price = np.where(allowed & (c[:, None] < level), width * per_rank / np.maximum(level - c[:, None], 1e-12), np.inf)
        new = price.argmin(axis=0)
        alone = per_rank[new, np.arange(n)] + c[new]
        for i in np.flatnonzero(alone > level).tolist():  # the narrowest wider size within the level, else the fastest
            t = np.where(allowed[:, i] & (np.arange(K) >= new[i]), per_rank[:, i] + c, np.inf)
            within = np.flatnonzero(t <= level)
            new[i] = int(within[0]) if within.size else int(np.argmin(t))
        if (new == kidx).all():
            break
        kidx = new
    return _counts(batch, kidx, slots, level)


def _level(kidx: np.ndarray, per_rank: np.ndarray, c: np.ndarray, sizes: list[int], slots: int) -> float:
    """The common block time at which the sequences' work, at their sizes, fills `slots` rank slots."""
    work = np.bincount(kidx, weights=per_rank[kidx, np.arange(kidx.size)], minlength=len(sizes))
    used = np.flatnonzero(work > 0)
    k = np.asarray(sizes, dtype=np.float64)[used]
    lo, hi = float(c[used].max()), float(c[used].max() + work.sum() + 1.0)
    for _ in range(60):  # slots(level) = sum_k k * work_k / (level - c_k) falls as the level rises
        mid = (lo + hi) / 2
        if (k * work[used] / (mid - c[used])).sum() > slots:
            lo = mid
        else:
            hi = mid
    return hi


def _counts(batch: _Batch, kidx: np.ndarray, slots: int, level: float) -> list[int] | None:
    """Blocks per size filling exactly `slots` rank slots, the sequences on the sizes `kidx`: one for each sequence
    taking more than half of what a block has of the level after c; widest first, as many as the tokens and
    sequence counts of the sequences of that size or wider need beyond the room of the wider blocks; never more
    blocks of a size or narrower than sequences to start them; slots left go one block at a time to the size whose
    blocks are most loaded (work per block plus c), or widen the most loaded blocks; slots missing come from the
    least loaded."""
    K, sizes, target, per_rank, c = batch.K, batch.sizes, batch.t, batch.work, np.asarray(batch.c)
    lengths = batch.lengths
    work = np.bincount(kidx, weights=per_rank[kidx, np.arange(kidx.size)], minlength=K)
    seqs = np.bincount(kidx, minlength=K)
    tokens = np.bincount(kidx, weights=lengths.astype(np.float64), minlength=K)
    width = np.asarray(sizes, dtype=np.int64)
    own = per_rank[kidx, np.arange(kidx.size)]
    # the least each size needs first (a sequence taking over half the level's room needs a block of its own)
    counts = np.bincount(kidx, weights=own > (level - c[kidx]) / 2, minlength=K).astype(np.int64)
    per_block = target.max_num_seqs - int(target.padding.dummy) if target.max_num_seqs is not None else None
    room_tokens = room_seqs = 0.0
    least = np.zeros(K, dtype=np.int64)  # what the tokens and sequence counts need: never given up
    for j in range(K - 1, -1, -1):  # the wider blocks' room first, then this size's own blocks
        need = max(math.ceil((tokens[j] - room_tokens) / (sizes[j] * target.max_seqlen_per_rank) - 1e-9),
                   math.ceil((seqs[j] - room_seqs) / per_block - 1e-9) if per_block else 0)
        least[j] = max(need, 0)
        counts[j] = max(counts[j], need)
        room_tokens += counts[j] * sizes[j] * target.max_seqlen_per_rank - tokens[j]
        room_seqs += counts[j] * per_block - seqs[j] if per_block else 0.0
    fill = np.cumsum(seqs)
    for j in range(K):  # blocks of this size or narrower need as many sequences that may take them
        over = int(np.cumsum(counts)[j] - fill[j])
        if over > 0:
            counts[j] -= over
            if counts[j] < 0:
                return None
    counts = np.maximum(counts, 0)
    least = np.minimum(least, counts)
    left = slots - int((counts * width).sum())
    while left < 0:  # too many slots: the size whose blocks are least loaded gives up one
        load = np.where(counts > least, work / np.maximum(counts, 1) + c, np.inf)
        j = int(np.argmin(load))
        if load[j] == np.inf:
            return None
        counts[j] -= 1
        left += sizes[j]
    while left > 0:  # the size whose blocks are most loaded takes one more block, if sequences can start it
        load = np.where(np.cumsum(counts) < fill, work / np.maximum(counts, 1) + c, -np.inf)
        load[width > left] = -np.inf
        j = int(np.argmax(load))
        if load[j] == -np.inf:
            break
        counts[j] += 1
        left -= sizes[j]
    while left > 0:  # more slots than sequences to start blocks: the most loaded blocks widen
        load = np.where((counts > 0) & (width <= left), work / np.maximum(counts, 1) + c, -np.inf)
        load[K - 1] = -np.inf  # the widest cannot widen
        j = int(np.argmax(load))
        if load[j] == -np.inf:
            return None
        counts[j] -= 1
        counts[j + 1] += 1
        left -= sizes[j]
    return counts.tolist()
