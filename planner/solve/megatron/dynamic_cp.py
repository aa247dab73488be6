"""hydraplan's schedule for Megatron's dynamic-CP executor (core.executors.DynamicCP), priced on the profile.

For a micro-batch count M (from the fewest the batch allows up), a layout is a number of blocks of each size
filling the M x N rank slots. Its blocks go to micro-batches widest first (the slowest together) and, in each, to
ranks widest first from rank 0, so every block is an aligned slice. The sequences, longest first, then each go to
the block of a size they fit (tokens per rank, MaxLen, `max_num_seqs`, the padding Megatron adds) that ends its
ranks' work earliest, their blocks' times summed over all micro-batches (LPT over ranks: the executor chains
micro-batches per rank with no barrier between them, so a rank held long by a wide block in one micro-batch gets
less in the others), then that finishes earliest itself; an empty block then takes a sequence from the slowest one.
A layout is scored as the executor runs it. The first layouts: every sequence on at least its narrowest size, or
the next one (every size with padding), and one budgeted from the cost model (at the level the batch's work
allows per micro-batch, every sequence on the size where it takes the fewest rank slots, its GPU-seconds over
what a block of that size has left of the level after its constant c; each size then as many blocks as its work,
tokens and sequence count need). From the best, a descent changes the width of the block finishing last (it twice
as wide with ranks from the most numerous size, two into one twice as wide, one into two) while that lowers the
time. The layouts filled per batch are counted (FILL_WORK), not timed. The result is compared with Megatron's own
schedule (solve.megatron.default_dynamic_cp), as the executor runs both, and the faster taken, so the plugin is
never slower on a batch than Megatron's scheduler.

Pure and deterministic: a function of the lengths and the executor only (ties go to the lower index; no clock, no
randomness). Imports numpy and the core only, so it loads in a training process without the planner's solvers.
"""

from __future__ import annotations

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
MISSES = 1  # ... stopping at the first that does not improve
ROUNDS = 4  # rounds of choosing sizes at a level and the level of those sizes (the budgeted layout)
LAYOUT_STEPS = 12  # descent steps over layouts, at most
START_SIZES = 2  # first layouts with every sequence on at least the narrowest, the next narrowest, ... size
FILL_WORK = 14_000  # sequences placed per batch over all the layouts tried: fills = FILL_WORK / sequences ...
MIN_FILLS = 6  # ... and at least this many


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
        self.hold = [min(cap, mem) for cap, mem in zip(self.cap, self.max_len, strict=True)]  # tokens a block holds
        self.plain = not self.pad and t.max_num_seqs is None  # room is tokens against `hold` only

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
        self.lo = [-1] * len(self.k)  # first rank

    def room(self, b: int, i: int) -> bool:
        B = self.B
        if B.plain:
            return self.tokens[b] + B.len_l[i] <= B.hold[self.k[b]]
        return B.holds(self.k[b], self.tokens[b] + B.len_l[i], len(self.items[b]) + 1)

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
    budget = _Budget(max(MIN_FILLS, FILL_WORK // lengths.size))
    best: tuple[float, int, _Plan] | None = None  # (as run, micro-batches, plan)
    step = target.vpp_group or 1
    fewest = m = dynamic_cp_fewest_microbatches(target, lengths)
    bound, misses = dynamic_cp_lower_bound(target, lengths), 0
    while m <= min(lengths.size, fewest + EXTRA_MICROBATCHES * step) and not (batch.least >= batch.K).any():
        if best is not None and (bound + (m - fewest) * min(batch.c) >= best[0] or not budget.left):
            break  # every further micro-batch adds at least the cheapest constant to what the batch needs
        start = _start(batch, m, budget)
        found = _descend(batch, m, start[2], start[0], budget) if start is not None else None
        if found is not None and (best is None or found[0] < best[0] * (1 - 1e-12)):
            best, misses = (found[0], m, found[1]), 0
        elif best is not None:
            misses += 1
            if misses >= MISSES:
                break
        m += step
    ours, our_s = None, math.inf
    if best is not None:
        ours = _lists(best[2], best[1])
        our_s = dynamic_cp_time(target, ours, lengths)
    if ours is not None and our_s <= their_s:
        return ours
    if theirs is not None and their_s < math.inf:
        return theirs
    raise UserError(f"dynamic CP: {lengths.size} sequences cannot be scheduled on {target.dpcp} ranks of "
                    f"{target.max_seqlen_per_rank} tokens (no micro-batch count up to {m} gives every rank a pack)")


# --------------------------------------------------------------------------------------------- layouts
class _Budget:
    """Layout fills left for the batch: the work the scheduler may spend, counted, not timed."""

    def __init__(self, fills: int) -> None:
        self.left = fills

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0


def _start(batch: _Batch, m: int, budget: _Budget) -> tuple[float, list[int], _Plan] | None:
    """The best of the first layouts in m micro-batches: (time as run, layout, plan); None if none fills them."""
    slots = m * batch.N
    starts = [_budget(batch, slots)]
    starts += [_counts(batch, np.maximum(batch.least, x), slots, math.inf)
               for x in range(batch.K if batch.pad else min(START_SIZES, batch.K))]
    best: tuple[float, list[int], _Plan] | None = None
    for counts in dict.fromkeys(tuple(c) for c in starts if c is not None):
        if best is not None and not budget.take():
            break
        plan = _fill(batch, list(counts), m)
        if plan is not None and (best is None or _score(plan) < best[0]):
            best = (_score(plan), list(counts), plan)
    return best


def _descend(batch: _Batch, m: int, plan: _Plan, score: float, budget: _Budget) -> tuple[float, _Plan]:
    """From a layout, changes of the width of the block finishing last (two into one twice as wide, one into two of
    its width or half as wide, it twice as wide with ranks from the most numerous size), the first that lowers the
    time as run taken, while one does."""
    for _ in range(LAYOUT_STEPS):
        k = plan.k[_last(plan)]
        counts = np.bincount([plan.k[b] for b in plan.live()], minlength=batch.K).tolist()  # as filled
        moves: list[dict[int, int]] = []
        if k + 1 < batch.K and batch.sizes[k + 1] == 2 * batch.sizes[k]:
            j = max((j for j in range(k + 1) if counts[j] - (j == k) >= batch.sizes[k] // batch.sizes[j]),
                    key=lambda j: (counts[j], -j), default=None)
            if j is not None:
                widen = {k: -1, k + 1: 1}
                widen[j] = widen.get(j, 0) - batch.sizes[k] // batch.sizes[j]
                moves.append(widen)
            if counts[k] >= 2:
                moves.append({k: -2, k + 1: 1})
            if counts[k + 1] >= 1:
                moves.append({k + 1: -1, k: 2})
        if k > 0 and counts[k] >= 1 and batch.sizes[k] == 2 * batch.sizes[k - 1]:
            moves.append({k: -1, k - 1: 2})
        for move in moves:
            if not budget.take():
                return score, plan
            trial = list(counts)
            for x, d in move.items():
                trial[x] += d
            tried = _fill(batch, trial, m)
            if tried is not None and _score(tried) < score * (1 - 1e-12):
                plan, score = tried, _score(tried)
                break
        else:
            break
    return score, plan


def _fill(batch: _Batch, counts: list[int], m: int) -> _Plan | None:
    """The layout's blocks in micro-batches (widest first) at their ranks (widest first from rank 0, so aligned), filled
    longest sequence first, each to the block that ends its ranks' work (their blocks' times over all micro-batches:
    the executor chains micro-batches per rank, no barrier between them) earliest, then finishes earliest itself;
    no block left empty. None if a sequence finds no room."""
    plan = _Plan(batch, counts)
    _to_microbatches(plan, m)
    _place(plan, m)
    nb, B = len(plan.k), batch
    k = np.asarray(plan.k)
    width = np.asarray(B.sizes)[k]
    lo = np.asarray(plan.lo)
    present = sorted(set(width.tolist()))
    offset = np.cumsum([0] + [B.N // w for w in present])
    at = offset[np.searchsorted(present, width)] + lo // width  # each block's slot in the stacked per-width maxima
    col = np.zeros(B.N)
    for b in range(nb):
        col[lo[b]:lo[b] + width[b]] += plan.time[b]
    seg = np.concatenate([col.reshape(-1, w).max(axis=1) for w in present])  # max load over each aligned slice
    times = np.asarray(plan.time)
    tokens = np.zeros(nb, dtype=np.int64)
    count = np.zeros(nb, dtype=np.int64)
    work = np.zeros(nb)
    rows = B.work[k]  # (blocks, sequences): per-rank seconds of each sequence on each block
    hold = np.asarray(B.hold)[k]
    wide = [k >= x for x in range(B.K)]  # blocks a sequence of narrowest size index x may take
    for i in batch.order:
        length = B.len_l[i]
        if B.plain:
            after = times + rows[:, i]
            ok = wide[B.least_l[i]] & (tokens + length <= hold)
        else:
            after = _times(B, k, tokens + length, work + rows[:, i])
            ok = wide[B.least_l[i]] & _holds(B, k, tokens + length, count + 1)
        ends = np.where(ok, seg[at] + (after - times), np.inf)
        pick = int(np.argmin(ends))
        if ends[pick] == np.inf:
            return None
        tied = np.flatnonzero(ends <= ends[pick] * (1 + 1e-12))
        if tied.size > 1:
            pick = int(tied[np.argmin(after[tied])])
        plan.move(pick, i)
        a, z = lo[pick], lo[pick] + width[pick]
        col[a:z] += plan.time[pick] - times[pick]
        for w, off in zip(present, offset, strict=False):  # the slices over the changed ranks
            seg[off + a // w:off + (z - 1) // w + 1] = col[a // w * w:((z - 1) // w + 1) * w].reshape(-1, w).max(axis=1)
        times[pick], work[pick] = plan.time[pick], plan.work[pick]
        tokens[pick] += length
        count[pick] += 1
    if not _no_empty(plan):
        return None
    _place(plan, m)
    return plan


def _place(plan: _Plan, m: int) -> None:
    """Each micro-batch's blocks at their ranks: widest first from rank 0, so every block is an aligned slice."""
    at = [0] * m
    for b in sorted(plan.live(), key=lambda b: (plan.mb[b], -plan.k[b], b)):
        plan.lo[b] = at[plan.mb[b]]
        at[plan.mb[b]] += plan.B.sizes[plan.k[b]]


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


def _chain(plan: _Plan) -> tuple[list[float], int]:
    """Micro-batches in order, each block starting once all its ranks are free: when each rank finishes, and the
    block finishing last."""
    ready = [0.0] * plan.B.N
    last, last_end = -1, -math.inf
    for b in sorted(plan.live(), key=lambda b: (plan.mb[b], plan.lo[b])):
        lo, w = plan.lo[b], plan.B.sizes[plan.k[b]]
        end = max(ready[lo:lo + w]) + plan.time[b]
        ready[lo:lo + w] = [end] * w
        if end >= last_end:
            last, last_end = b, end
    return ready, last


def _score(plan: _Plan) -> float:
    """When the last rank finishes, as the executor runs the plan."""
    return max(_chain(plan)[0])


def _last(plan: _Plan) -> int:
    return _chain(plan)[1]


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


def _lists(plan: _Plan, m: int) -> DynamicCPSchedule:
    """Rank lists, the blocks at the ranks they were placed on, each pack longest first."""
    B = plan.B
    out: DynamicCPSchedule = [[[] for _ in range(B.N)] for _ in range(m)]
    for b in plan.live():
        pack = sorted(plan.items[b], key=lambda i: (-B.len_l[i], i))
        for r in range(plan.lo[b], plan.lo[b] + B.sizes[plan.k[b]]):
            out[plan.mb[b]][r] = list(pack)
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
    hold = batch.hold
    least = np.zeros(K, dtype=np.int64)  # what the tokens and sequence counts need: never given up
    for j in range(K - 1, -1, -1):  # the wider blocks' room first, then this size's own blocks
        need = max(math.ceil((tokens[j] - room_tokens) / hold[j] - 1e-9),
                   math.ceil((seqs[j] - room_seqs) / per_block - 1e-9) if per_block else 0)
        least[j] = max(need, 0)
        counts[j] = max(counts[j], need)
        room_tokens += counts[j] * hold[j] - tokens[j]
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
