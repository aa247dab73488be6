"""What an executor can run and what it costs: the one place the planner's targets are described.

- hydraplan's own runtime: heterogeneous pipelines, several sequences per micro-batch (core.cost, core.cluster);
- Megatron-LM hybrid context parallelism (`--hybrid-context-parallel`, megatron-core >= 0.17): PP=1, one TP for
  every rank, N = DP x CP ranks. A global batch runs as rounds separated by a DPxCP barrier; in a round every
  rank runs its list of sequences in order, each sequence as its own forward and backward (the constant c of the
  cost model is paid per sequence). The ranks that list a sequence in a round are its CP group: an aligned block
  of a power-of-two size (Megatron builds communicators for aligned slices of 2..N/2 ranks and for all N), all
  listing their shared sequences in one order; L / cp must stay within `max_seqlen_per_dp_cp_rank`, and every
  rank needs work in the last round (it runs its last sequence outside the no-sync context);
- Megatron-LM sequence packing (`--sequence-packing-scheduler`, Megatron-LM main and dev): a fixed <tp,pp,cp> x dp
  layout, packs of at most `max_seqlen_per_dp_cp_rank * cp` tokens (and at most `max_num_seqs` documents where
  set), the same pack count for every replica, a multiple of the VPP micro-batch group;
- Megatron-LM dynamic context parallelism (`--dynamic-context-parallel`, Megatron-LM dev): PP=1, one TP for every
  rank, N = DP x CP ranks (even). A global batch runs as micro-batches, one after another on every rank; in each,
  the N ranks split into blocks, a block being an aligned slice of a size Megatron has communicators for (powers
  of two from `min_dynamic_context_parallel_size` below N, and N) whose ranks all list one ordered pack of
  sequences, run as one packed (THD) forward and backward at CP size k = the block's size (the constant c once
  per pack). Its tokens per rank (sum L / k) stay within `max_seqlen_per_dp_cp_rank`, its sequences within
  `max_num_seqs` where set (the dummy sequence a padding tail appends included), no rank is without a pack, and
  the micro-batch count is a multiple of the VPP micro-batch group. A block starts when every rank of it has
  finished its previous micro-batch (nothing else synchronizes the ranks before the gradient reduction).

Costs are the canonical model's (core.cost on the profile's <tp,1,cp> schemes, with the recompute variant of
Megatron's `recompute_granularity`; a pack of the dynamic-CP executor also pays for the padding Megatron adds to
it, `PackPadding`), and so is memory: a sequence (a pack) of L tokens on cp ranks fits when L <= MaxLen of
<tp,1,cp> in the job (Megatron does not check it: a schedule breaking it runs out of memory, and
`max_seqlen_per_dp_cp_rank` alone, L / cp, does not keep it). A hybrid-CP round lasts until its last rank finishes,
a sequence starting when every rank of its group is free (the CP collectives make the group wait for its slowest
member).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from hydraplan.core.cluster import for_gpus
from hydraplan.core.cost import pipeline_time
from hydraplan.core.errors import UserError
from hydraplan.core.schema import Profile, Scheme

# [round][DPxCP rank] -> positions (into the batch's lengths) that rank runs, in order
HybridSchedule = list[list[list[int]]]
# a batch's sequence lengths where a function reads them one by one (the others take any ArrayLike)
Lengths = Sequence[int] | np.ndarray
RECOMPUTE_OF_GRANULARITY = {None: "none", "none": "none", "selective": "selective", "full": "full"}


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


@dataclass(frozen=True)
class HybridCP:
    """Megatron's hybrid CP executor on one job: `dpcp` ranks of TP `tp`, the per-rank length limit, and the
    cost coefficients (a, b, c) of the <tp,1,cp> scheme for every CP size a sequence may take."""

    tp: int
    dpcp: int
    max_seqlen_per_rank: int
    recompute: str
    cps: tuple[int, ...]  # the CP sizes the profile prices, ascending: powers of two up to dpcp
    coef: np.ndarray  # (len(cps), 3): a, b, c of <tp,1,cp>
    max_lens: tuple[int, ...]  # MaxLen of <tp,1,cp> in the job: the longest sequence that fits on cp ranks

    @classmethod
    def of(cls, profile: Profile, *, tp: int, dpcp: int, max_seqlen_per_rank: int, recompute: str = "none") -> HybridCP:
        if not is_power_of_two(dpcp):
            raise UserError(f"hybrid CP: DPxCP size must be a power of two (got {dpcp})")
        if max_seqlen_per_rank < 1:
            raise UserError(f"hybrid CP: max_seqlen_per_dp_cp_rank must be positive (got {max_seqlen_per_rank})")
        view = for_gpus(profile, tp * dpcp)
        cps, coef, max_lens = [], [], []
        for s in sorted(view.schemes, key=lambda s: s.cp):
            if s.tp == tp and s.pp == 1 and s.recompute == recompute and s.cp <= dpcp and is_power_of_two(s.cp):
                cps.append(s.cp)
                coef.append((s.time.a, s.time.b, s.time.c))
                max_lens.append(s.max_len)
        if 1 not in cps:
            raise UserError(f"profile {profile.name}: no scheme <{tp},1,1> with recompute {recompute} in {tp * dpcp} GPUs")
        return cls(tp, dpcp, int(max_seqlen_per_rank), recompute, tuple(cps), np.asarray(coef, dtype=np.float64),
                   tuple(max_lens))

    def cp_index(self, cp: int) -> int:
        try:
            return self.cps.index(cp)
        except ValueError:
            raise UserError(f"hybrid CP: the profile has no <{self.tp},1,{cp}> scheme to price CP size {cp}") from None

    def times(self, lengths: ArrayLike) -> np.ndarray:
        """(len(cps), n): seconds one rank spends on each sequence at each CP size (a*l^2 + b*l + c)."""
        l = np.asarray(lengths, dtype=np.float64)[None, :]
        a, b, c = self.coef[:, 0:1], self.coef[:, 1:2], self.coef[:, 2:3]
        return (a * l + b) * l + c

    def time(self, length: int, cp: int) -> float:
        a, b, c = self.coef[self.cp_index(cp)]
        return float((a * length + b) * length + c)

    def fits(self, lengths: ArrayLike) -> np.ndarray:
        """(len(cps), n): whether each sequence may run at each CP size (L / cp within the per-rank limit, and
        L within MaxLen of <tp,1,cp>)."""
        l = np.asarray(lengths, dtype=np.int64)[None, :]
        cps = np.asarray(self.cps, dtype=np.int64)[:, None]
        return (l <= cps * self.max_seqlen_per_rank) & (l <= np.asarray(self.max_lens, dtype=np.int64)[:, None])

    def min_cp_index(self, lengths: ArrayLike) -> np.ndarray:
        """Per sequence, the index into `cps` of the smallest CP size it fits on; len(cps) where none."""
        ok = self.fits(lengths)
        return np.where(ok.any(axis=0), ok.argmax(axis=0), len(self.cps))

    def out_of_memory(self, schedule: HybridSchedule, lengths: Lengths) -> list[int]:
        """The positions `schedule` runs on fewer ranks than their memory needs (MaxLen of <tp,1,cp>)."""
        out = set()
        for rnd in schedule:
            cp: dict[int, int] = {}
            for items in rnd:
                for i in items:
                    cp[i] = cp.get(i, 0) + 1
            for i, c in cp.items():
                if c not in self.cps or lengths[i] > self.max_lens[self.cps.index(c)]:
                    out.add(i)
        return sorted(out)


def hybrid_cp_violations(schedule: HybridSchedule, lengths: Lengths, dpcp: int, max_seqlen_per_rank: int) -> list[str]:
    """Every way `schedule` breaks the executor's rules (empty: Megatron runs it)."""
    out: list[str] = []
    n = len(lengths)
    seen = np.zeros(n, dtype=np.int64)
    if not schedule:
        return ["no round"]
    for k, rnd in enumerate(schedule):
        if len(rnd) != dpcp:
            out.append(f"round {k}: {len(rnd)} rank lists, not {dpcp}")
            continue
        members: dict[int, list[int]] = {}
        for r, items in enumerate(rnd):
            if len(set(items)) != len(items):
                out.append(f"round {k} rank {r}: a sequence listed twice")
            for i in items:
                members.setdefault(i, []).append(r)
        for i, ranks in members.items():
            if not 0 <= i < n:
                out.append(f"round {k}: position {i} outside the batch")
                continue
            seen[i] += 1
            cp = len(ranks)
            if not is_power_of_two(cp) or ranks[0] % cp or ranks[-1] != ranks[0] + cp - 1:
                out.append(f"round {k}: sequence {i} on ranks {ranks}, not an aligned power-of-two block")
            if lengths[i] > max_seqlen_per_rank * cp:
                out.append(f"round {k}: sequence {i} of {lengths[i]} tokens on {cp} ranks exceeds the per-rank limit")
        if _round_order(rnd, members) is None:
            out.append(f"round {k}: the ranks of a CP group list their shared sequences in orders that deadlock")
    if any(not items for items in schedule[-1]):
        out.append("last round: a rank without work")
    missing, twice = np.flatnonzero(seen == 0), np.flatnonzero(seen > 1)
    if missing.size:
        out.append(f"sequences never scheduled: {missing[:5].tolist()}")
    if twice.size:
        out.append(f"sequences scheduled in several rounds: {twice[:5].tolist()}")
    return out


def _round_order(rnd: list[list[int]], members: dict[int, list[int]]) -> list[int] | None:
    """The order the round's sequences start in (each starts when it heads every member's list); None: deadlock."""
    head = [0] * len(rnd)
    order: list[int] = []
    pending = [r for r in range(len(rnd)) if rnd[r]]
    while pending:
        progressed = False
        for r in pending:
            if head[r] >= len(rnd[r]):
                continue
            i = rnd[r][head[r]]
            ranks = members[i]
            if all(head[m] < len(rnd[m]) and rnd[m][head[m]] == i for m in ranks):
                order.append(i)
                for m in ranks:
                    head[m] += 1
                progressed = True
        pending = [r for r in pending if head[r] < len(rnd[r])]
        if pending and not progressed:
            return None
    return order


def hybrid_cp_rank_times(target: HybridCP, schedule: HybridSchedule, lengths: ArrayLike
                         ) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    """Per round, as the executor runs it: when each rank finishes (a sequence starts when all its ranks are free
    and takes T(L) of <tp,1,cp> on each), and the seconds each rank computes each of its sequences."""
    lengths = np.asarray(lengths, dtype=np.int64)
    out = []
    for k, rnd in enumerate(schedule):
        members: dict[int, list[int]] = {}
        for r, items in enumerate(rnd):
            for i in items:
                members.setdefault(i, []).append(r)
        order = _round_order(rnd, members)
        if order is None:
            raise ValueError(f"round {k} deadlocks")
        took = {i: target.time(int(lengths[i]), len(ranks)) for i, ranks in members.items()}
        ready = np.zeros(len(rnd))
        for i in order:
            ranks = members[i]
            ready[ranks] = ready[ranks].max() + took[i]
        out.append((ready, [np.array([took[i] for i in items], dtype=np.float64) for items in rnd]))
    return out


def hybrid_cp_round_times(target: HybridCP, schedule: HybridSchedule, lengths: ArrayLike) -> np.ndarray:
    """Seconds of each round: until its last rank finishes (then the barrier)."""
    return np.array([ready.max(initial=0.0) for ready, _ in hybrid_cp_rank_times(target, schedule, lengths)])


def hybrid_cp_time(target: HybridCP, schedule: HybridSchedule, lengths: ArrayLike) -> float:
    return float(hybrid_cp_round_times(target, schedule, lengths).sum())


def hybrid_cp_lower_bound(target: HybridCP, lengths: ArrayLike) -> float:
    """No schedule runs the batch faster: every sequence on the CP size it fits with the fewest GPU-seconds,
    spread evenly over the ranks, and no less than the longest sequence on its fastest CP size."""
    t = np.where(target.fits(lengths), target.times(lengths), np.inf)
    cps = np.asarray(target.cps, dtype=np.float64)[:, None]
    return float(max((t * cps).min(axis=0).sum() / target.dpcp, t.min(axis=0).max()))


# [micro-batch][dp * cp rank] -> positions that rank's pack holds; the cp ranks of replica d are d*cp .. d*cp+cp-1
PackingSchedule = list[list[list[int]]]


@dataclass(frozen=True)
class MegatronPacking:
    """Megatron's sequence-packing executor on one job: dp replicas of one <tp,pp,cp> scheme (its MaxLen already
    for the job), packs of at most `capacity` tokens (max_seqlen_per_dp_cp_rank * cp), and the pack count a
    multiple of `multiple` (dp times the VPP micro-batch group)."""

    scheme: Scheme
    dp: int
    capacity: int
    multiple: int
    max_num_seqs: int | None = None  # documents per pack at most (dev's `max_num_seqs`), None: no cap

    @classmethod
    def of(cls, profile: Profile, *, tp: int, pp: int, cp: int, dp: int, capacity: int, multiple: int = 1,
           recompute: str = "none", max_num_seqs: int | None = None) -> MegatronPacking:
        view = for_gpus(profile, tp * pp * cp * dp)
        scheme = next((s for s in view.schemes if s.key == (tp, pp, cp, recompute)), None)
        if scheme is None:
            raise UserError(f"profile {profile.name}: no scheme <{tp},{pp},{cp}> with recompute {recompute} "
                            f"in {tp * pp * cp * dp} GPUs")
        if capacity < 1 or multiple < 1 or multiple % dp:
            raise UserError(f"packing: capacity {capacity} and multiple {multiple} must be positive, the multiple "
                            f"one of dp = {dp}")
        if max_num_seqs is not None and max_num_seqs < 1:
            raise UserError(f"packing: max_num_seqs must be positive (got {max_num_seqs})")
        return cls(scheme, dp, int(capacity), int(multiple), None if max_num_seqs is None else int(max_num_seqs))

    def replicas(self, schedule: PackingSchedule) -> list[list[list[int]]]:
        """[replica][micro-batch] -> positions (the first cp rank's lists)."""
        cp = self.scheme.cp
        return [[mb[d * cp] for mb in schedule] for d in range(self.dp)]

    def propagation_s(self, schedule: PackingSchedule, lengths: ArrayLike) -> list[float]:
        """Per replica: the canonical pipeline time of its packs, in order."""
        lengths = np.asarray(lengths, dtype=np.int64)
        return [pipeline_time(self.scheme, [lengths[mb] for mb in rep]) for rep in self.replicas(schedule)]


def packing_violations(schedule: PackingSchedule, lengths: Lengths, dp: int, cp: int, capacity: int,
                       multiple: int, max_num_seqs: int | None = None) -> list[str]:
    """Every way `schedule` breaks the packing executor's rules (empty: Megatron runs it)."""
    out: list[str] = []
    if (len(schedule) * dp) % multiple:
        out.append(f"{len(schedule)} micro-batches x dp {dp} is not a multiple of {multiple}")
    seen = np.zeros(len(lengths), dtype=np.int64)
    for i, mb in enumerate(schedule):
        if len(mb) != dp * cp:
            out.append(f"micro-batch {i}: {len(mb)} rank lists, not dp x cp = {dp * cp}")
            continue
        for d in range(dp):
            pack = mb[d * cp]
            if any(mb[d * cp + k] != pack for k in range(cp)):
                out.append(f"micro-batch {i} replica {d}: its cp ranks hold different packs")
            if not pack:
                out.append(f"micro-batch {i} replica {d}: an empty pack")
            if sum(int(lengths[j]) for j in pack) > capacity:
                out.append(f"micro-batch {i} replica {d}: a pack over {capacity} tokens")
            if max_num_seqs is not None and len(pack) > max_num_seqs:
                out.append(f"micro-batch {i} replica {d}: {len(pack)} documents, more than max_num_seqs {max_num_seqs}")
            for j in pack:
                seen[j] += 1
    if (seen != 1).any():
        out.append(f"positions not packed exactly once: {np.flatnonzero(seen != 1)[:5].tolist()}")
    return out


# ------------------------------------------------------------------------------ dynamic context parallelism
# [micro-batch][DPxCP rank] -> positions (into the batch's lengths) of the pack that rank runs, in pack order
DynamicCPSchedule = list[list[list[int]]]
TAIL_POLICIES = ("append_dummy_seq", "extend_last")


@dataclass(frozen=True)
class PackPadding:
    """How Megatron pads a dynamic-CP pack after packing: `--pad-packed-seq-alignment` (None: not at all, Megatron's
    default and what its dynamic-CP benchmark runs; "max": every pack to max_seqlen_per_dp_cp_rank tokens per rank;
    A: the tokens per rank up to a multiple of A) and `thd_tail_padding_policy` (append_dummy_seq: the tail is a
    sequence of its own, attention included, taking a slot of `max_num_seqs`; extend_last: padding of the last
    sequence, linear work only)."""

    alignment: int | Literal["max"] | None = None
    tail: str = "append_dummy_seq"

    def tail_tokens(self, tokens: np.ndarray | int, cp: int, limit: int) -> np.ndarray:
        """Tokens Megatron appends to packs of `tokens` on `cp` ranks (its local target times cp, minus the pack)."""
        t = np.asarray(tokens, dtype=np.int64)
        if self.alignment is None:
            return np.zeros_like(t)
        per_rank = (np.full_like(t, limit) if self.alignment == "max"
                    else -(-(-(-t // cp)) // self.alignment) * self.alignment)
        return np.maximum(per_rank * cp - t, 0)

    @property
    def dummy(self) -> bool:
        return self.alignment is not None and self.tail == "append_dummy_seq"


def dynamic_cp_sizes(dpcp: int, min_cp_size: int = 1) -> tuple[int, ...]:
    """The block sizes Megatron makes communicators for (create_dynamic_dp_cp_groups): powers of two from
    `min_cp_size` up to, not including, the largest power of two within dpcp, and the whole DPxCP group."""
    return tuple(s for s in (2**i for i in range(dpcp.bit_length() - 1)) if s >= min_cp_size) + (dpcp,)


@dataclass(frozen=True)
class DynamicCP:
    """Megatron's dynamic-CP executor on one job: `dpcp` ranks of TP `tp`, its settings, and the cost coefficients
    (a, b, c) and MaxLen of <tp,1,k> for every block size k the profile prices."""

    tp: int
    dpcp: int
    max_seqlen_per_rank: int
    min_cp_size: int
    max_num_seqs: int | None
    vpp_group: int | None
    recompute: str
    padding: PackPadding
    sizes: tuple[int, ...]  # block sizes with communicators, ascending
    cps: tuple[int, ...]  # the sizes the profile prices, ascending
    coef: np.ndarray  # (len(cps), 3): a, b, c of <tp,1,k>
    max_lens: tuple[int, ...]  # MaxLen of <tp,1,k> in the job: the most tokens a pack on k ranks may hold

    @classmethod
    def of(cls, profile: Profile, *, tp: int, dpcp: int, max_seqlen_per_rank: int, min_cp_size: int = 1,
           max_num_seqs: int | None = None, vpp_group: int | None = None, recompute: str = "none",
           padding: PackPadding = PackPadding()) -> DynamicCP:
        if dpcp < 2 or dpcp % 2:
            raise UserError(f"dynamic CP: the DPxCP size must be even (got {dpcp})")
        if max_seqlen_per_rank < 1:
            raise UserError(f"dynamic CP: max_seqlen_per_dp_cp_rank must be positive (got {max_seqlen_per_rank})")
        if not 1 <= min_cp_size <= dpcp:
            raise UserError(f"dynamic CP: min_dynamic_context_parallel_size must be within 1..{dpcp} (got {min_cp_size})")
        if max_num_seqs is not None and max_num_seqs < (2 if padding.dummy else 1):
            raise UserError(f"dynamic CP: max_num_seqs must be at least {2 if padding.dummy else 1} (got {max_num_seqs})")
        if padding.tail not in TAIL_POLICIES or not (padding.alignment in (None, "max") or (
                isinstance(padding.alignment, int) and 0 < padding.alignment <= max_seqlen_per_rank)):
            raise UserError(f"dynamic CP: padding {padding} is not one Megatron takes (alignment None, 'max' or 1.."
                            f"{max_seqlen_per_rank}; tail one of {', '.join(TAIL_POLICIES)})")
        sizes = dynamic_cp_sizes(dpcp, min_cp_size)
        cps, coef, max_lens = [], [], []
        for s in sorted(for_gpus(profile, tp * dpcp).schemes, key=lambda s: s.cp):
            if s.tp == tp and s.pp == 1 and s.recompute == recompute and s.cp in sizes:
                cps.append(s.cp)
                coef.append((s.time.a, s.time.b, s.time.c))
                max_lens.append(s.max_len)
        if not cps:
            raise UserError(f"profile {profile.name}: no scheme <{tp},1,k> with recompute {recompute} for a block size "
                            f"k in {', '.join(map(str, sizes))} in {tp * dpcp} GPUs")
        return cls(tp, dpcp, int(max_seqlen_per_rank), min_cp_size, max_num_seqs, vpp_group, recompute, padding,
                   sizes, tuple(cps), np.asarray(coef, dtype=np.float64), tuple(max_lens))

    def cp_index(self, cp: int) -> int:
        try:
            return self.cps.index(cp)
        except ValueError:
            raise UserError(f"dynamic CP: the profile has no <{self.tp},1,{cp}> scheme to price a block of {cp} "
                            "ranks") from None

    def seq_costs(self, lengths: ArrayLike) -> np.ndarray:
        """(len(cps), n): seconds a pack on each block size spends on each sequence (a*l^2 + b*l, no constant)."""
        l = np.asarray(lengths, dtype=np.float64)[None, :]
        return (self.coef[:, 0:1] * l + self.coef[:, 1:2]) * l

    def tail_cost(self, k: int, tokens: np.ndarray | int) -> np.ndarray:
        """Seconds the padding of packs of `tokens` tokens on k ranks adds."""
        a, b, _ = self.coef[self.cp_index(k)]
        d = self.padding.tail_tokens(tokens, k, self.max_seqlen_per_rank).astype(np.float64)
        return (a * d + b) * d if self.padding.tail == "append_dummy_seq" else b * d

    def block_time(self, k: int, lengths: ArrayLike) -> float:
        """Seconds every rank of a block of k ranks spends on the pack of `lengths`: its sequences, the constant
        once, the padding."""
        l = np.asarray(lengths, dtype=np.float64)
        a, b, c = self.coef[self.cp_index(k)]
        return float(((a * l + b) * l).sum() + c + self.tail_cost(k, int(l.sum())))

    def pack_tokens(self, k: int, tokens: np.ndarray | int) -> np.ndarray:
        """Tokens a pack holds on k ranks once padded (what its memory holds)."""
        return np.asarray(tokens, dtype=np.int64) + self.padding.tail_tokens(tokens, k, self.max_seqlen_per_rank)

    def fits(self, lengths: ArrayLike) -> np.ndarray:
        """(len(cps), n): whether each sequence may run at each priced block size alone (L / k within the per-rank
        limit, its padded pack within MaxLen of <tp,1,k>)."""
        l = np.asarray(lengths, dtype=np.int64)
        return np.array([(l <= k * self.max_seqlen_per_rank) & (self.pack_tokens(k, l) <= m)
                         for k, m in zip(self.cps, self.max_lens, strict=True)]).reshape(len(self.cps), l.size)

    def seqs_allowed(self, k: int, tokens: int) -> int | None:
        """Real sequences a pack of `tokens` tokens on k ranks may hold (a dummy tail takes a slot); None: any."""
        if self.max_num_seqs is None:
            return None
        return self.max_num_seqs - int(self.padding.dummy and self.padding.tail_tokens(tokens, k, self.max_seqlen_per_rank) > 0)


def dynamic_cp_padded(lengths: ArrayLike, dpcp: int, tp: int = 1, sequence_parallel: bool = True) -> np.ndarray:
    """The lengths Megatron's varlen datasets hand dynamic CP: each sample padded to a multiple of 2 x DPxCP, times
    TP with sequence parallelism (SFTDataset._calculate_padding_divisor, dev at d48bd6b)."""
    g = 2 * dpcp * (tp if sequence_parallel and tp > 1 else 1)
    return -(-np.asarray(lengths, dtype=np.int64) // g) * g


def packing_padded(lengths: ArrayLike, cp: int, tp: int = 1, sequence_parallel: bool = True) -> np.ndarray:
    """The lengths Megatron's varlen datasets hand a packing scheduler at a fixed CP size: each sample padded to a
    multiple of 2 x CP (1 without CP), times TP with sequence parallelism (SFTDataset._calculate_padding_divisor, dev
    at d48bd6b)."""
    g = (2 * cp if cp > 1 else 1) * (tp if sequence_parallel and tp > 1 else 1)
    return -(-np.asarray(lengths, dtype=np.int64) // g) * g


def dynamic_cp_blocks(micro_batch: list[list[int]]) -> list[tuple[list[int], list[int]]]:
    """A micro-batch's blocks as (ranks, pack): the ranks listing one identical pack, by first rank."""
    by_pack: dict[tuple[int, ...], list[int]] = {}
    for r, items in enumerate(micro_batch):
        by_pack.setdefault(tuple(items), []).append(r)
    return sorted(((ranks, list(pack)) for pack, ranks in by_pack.items()), key=lambda b: b[0][0])


def dynamic_cp_violations(schedule: DynamicCPSchedule, lengths: Lengths, target: DynamicCP) -> list[str]:
    """Every way `schedule` breaks the dynamic-CP executor's rules (empty: Megatron runs it)."""
    out: list[str] = []
    n, N, limit = len(lengths), target.dpcp, target.max_seqlen_per_rank
    seen = np.zeros(n, dtype=np.int64)
    if not schedule:
        return ["no micro-batch"]
    if target.vpp_group and len(schedule) % target.vpp_group:
        out.append(f"{len(schedule)} micro-batches, not a multiple of the VPP micro-batch group {target.vpp_group}")
    for m, mb in enumerate(schedule):
        if len(mb) != N:
            out.append(f"micro-batch {m}: {len(mb)} rank lists, not {N}")
            continue
        owner: dict[int, int] = {}
        for ranks, pack in dynamic_cp_blocks(mb):
            k, lo = len(ranks), ranks[0]
            where = f"micro-batch {m} ranks {lo}..{ranks[-1]}"
            if not pack:
                out.append(f"micro-batch {m}: ranks {ranks} without work")
                continue
            if k not in target.sizes or ranks != list(range(lo, lo + k)) or lo % k or lo + k > N:
                out.append(f"micro-batch {m}: ranks {ranks} share a pack but are not an aligned block of a size with "
                           f"a communicator ({', '.join(map(str, target.sizes))})")
            if len(set(pack)) != len(pack):
                out.append(f"{where}: a sequence listed twice")
            if any(not 0 <= i < n for i in pack):
                out.append(f"{where}: a position outside the batch")
                continue
            for i in set(pack):
                if owner.setdefault(i, lo) != lo:
                    out.append(f"micro-batch {m}: sequence {i} in two blocks (ranks listing it hold different packs)")
                seen[i] += owner[i] == lo
            tokens = sum(int(lengths[i]) for i in pack)
            if tokens > k * limit:
                out.append(f"{where}: {tokens} tokens on {k} ranks exceed max_seqlen_per_dp_cp_rank {limit} per rank")
            allowed = target.seqs_allowed(k, tokens) if k in target.cps else target.max_num_seqs
            if allowed is not None and len(pack) > allowed:
                out.append(f"{where}: {len(pack)} sequences, more than max_num_seqs {target.max_num_seqs} allows")
            if k not in target.cps:
                out.append(f"{where}: the profile has no <{target.tp},1,{k}> scheme to price a block of {k} ranks")
            elif int(target.pack_tokens(k, tokens)) > target.max_lens[target.cps.index(k)]:
                out.append(f"{where}: a pack of {int(target.pack_tokens(k, tokens))} tokens on {k} ranks exceeds "
                           f"MaxLen {target.max_lens[target.cps.index(k)]} of <{target.tp},1,{k}> (out of memory)")
    missing, twice = np.flatnonzero(seen == 0), np.flatnonzero(seen > 1)
    if missing.size:
        out.append(f"sequences never scheduled: {missing[:5].tolist()}")
    if twice.size:
        out.append(f"sequences scheduled in several micro-batches: {twice[:5].tolist()}")
    return out


def dynamic_cp_rank_times(target: DynamicCP, schedule: DynamicCPSchedule, lengths: ArrayLike) -> np.ndarray:
    """(micro-batches, ranks): seconds each rank computes in each micro-batch (its block's pack)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.zeros((len(schedule), target.dpcp))
    for m, mb in enumerate(schedule):
        for ranks, pack in dynamic_cp_blocks(mb):
            out[m, ranks] = target.block_time(len(ranks), lengths[pack])
    return out


def dynamic_cp_microbatch_times(target: DynamicCP, schedule: DynamicCPSchedule, lengths: ArrayLike) -> np.ndarray:
    """Seconds of each micro-batch's slowest block."""
    return dynamic_cp_rank_times(target, schedule, lengths).max(axis=1, initial=0.0)


def dynamic_cp_finish(target: DynamicCP, schedule: DynamicCPSchedule, lengths: ArrayLike) -> np.ndarray:
    """(micro-batches, ranks): when each rank finishes each micro-batch, as the executor runs them: a block starts
    once all its ranks have finished their previous micro-batch."""
    times = dynamic_cp_rank_times(target, schedule, lengths)
    ready = np.zeros(target.dpcp)
    out = np.zeros_like(times)
    for m, mb in enumerate(schedule):
        for ranks, _ in dynamic_cp_blocks(mb):
            ready[ranks] = ready[ranks].max() + times[m, ranks[0]]
        out[m] = ready
    return out


def dynamic_cp_time(target: DynamicCP, schedule: DynamicCPSchedule, lengths: ArrayLike) -> float:
    """Seconds of the global batch (propagation): until the last rank finishes its last micro-batch."""
    return float(dynamic_cp_finish(target, schedule, lengths)[-1].max()) if schedule else 0.0


def dynamic_cp_fewest_microbatches(target: DynamicCP, lengths: ArrayLike) -> int:
    """No schedule has fewer micro-batches: each holds at most max_seqlen_per_dp_cp_rank tokens per rank and, with
    max_num_seqs, its blocks' widths add up to dpcp while a block of width w holds at most max_num_seqs sequences,
    each fitting alone on w ranks (so the widths of all blocks add up to at least the sum, over the sequences, of
    the narrowest size each fits alone, over max_num_seqs); a multiple of the VPP group."""
    l = np.asarray(lengths, dtype=np.int64)
    fewest = max(1, -(-int(l.sum()) // (target.dpcp * target.max_seqlen_per_rank)))
    if target.max_num_seqs is not None:
        ok = target.fits(l)
        narrowest = np.maximum(np.asarray(target.cps)[ok.argmax(axis=0)], target.sizes[0]) if ok.any(axis=0).all() \
            else np.full(l.size, target.sizes[0])
        fewest = max(fewest, -(-int(narrowest.sum()) // (target.dpcp * target.max_num_seqs)))
    g = target.vpp_group or 1
    return -(-fewest // g) * g


def dynamic_cp_lower_bound(target: DynamicCP, lengths: ArrayLike) -> float:
    """No schedule runs the batch faster (T: its time; M >= the fewest micro-batches; every rank runs a pack in
    each, so the N ranks' busy time, at most N x T, is at least the blocks' rank-seconds):
    - every sequence on the block size where its GPU-seconds are fewest, counting that a block of k ranks holds at
      most k x max_seqlen_per_dp_cp_rank tokens, so a sequence of L tokens on size k takes at least
      L / max_seqlen_per_dp_cp_rank rank slots paying c_k instead of the cheapest constant, which every other of the
      M x N rank slots pays;
    - the longest sequence on some size k: T is at least its block alone plus M - 1 cheapest constants, and the
      rank-seconds are at least its block's k x (its time) plus the others' GPU-seconds plus the cheapest constant
      on the other M x N - k rank slots; the best k for the schedule, the worst for the bound;
    - with 'max' padding, every pack is full: M times the cheapest full pack's linear work and constant."""
    l = np.asarray(lengths, dtype=np.int64)
    N, limit = target.dpcp, target.max_seqlen_per_rank
    cps = np.asarray(target.cps, dtype=np.float64)[:, None]
    fits = target.fits(l)
    w = np.where(fits, target.seq_costs(l), np.inf)  # per-rank seconds on each size
    c = target.coef[:, 2]
    M = dynamic_cp_fewest_microbatches(target, l)
    slots = M * N * c.min()
    spread = (w * cps + (c[:, None] - c.min()) * l[None, :] / limit).min(axis=0).sum() + slots
    s = int(np.argmax(l))
    others = float(np.delete((w * cps).min(axis=0), s).sum())
    alone = w[:, s] + c
    longest = np.maximum(alone + (M - 1) * c.min(), (others + cps[:, 0] * alone + slots - cps[:, 0] * c.min()) / N)
    bound = max(spread / N, float(longest.min()))
    if target.padding.alignment == "max":
        bound = max(bound, M * float((c + target.coef[:, 1] * cps[:, 0] * limit).min()))
    return float(bound)
