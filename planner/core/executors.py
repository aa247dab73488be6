"""What an executor can run and what it costs: the one place the planner's targets are described.

- hydraplan's own runtime: heterogeneous pipelines, several sequences per micro-batch (core.cost, core.cluster);
- Megatron-LM hybrid context parallelism (`--hybrid-context-parallel`, megatron-core >= 0.17): PP=1, one TP for
  every rank, N = DP x CP ranks. A global batch runs as rounds separated by a DPxCP barrier; in a round every
  rank runs its list of sequences in order, each sequence as its own forward and backward (the constant c of the
  cost model is paid per sequence). The ranks that list a sequence in a round are its CP group: an aligned block
  of a power-of-two size (Megatron builds communicators for aligned slices of 2..N/2 ranks and for all N), all
  listing their shared sequences in one order; L / cp must stay within `max_seqlen_per_dp_cp_rank`, and every
  rank needs work in the last round (it runs its last sequence outside the no-sync context);
- Megatron-LM sequence packing (`--sequence-packing-scheduler`, Megatron-LM main): a fixed <tp,pp,cp> x dp
  layout, packs of at most `max_seqlen_per_dp_cp_rank * cp` tokens, the same pack count for every replica,
  a multiple of the VPP micro-batch group.

Costs are the canonical model's (core.cost.seq_time on the profile's <tp,1,cp> schemes, with the recompute
variant of Megatron's `recompute_granularity`), and so is memory: a sequence of L tokens on cp ranks fits when
L <= MaxLen of <tp,1,cp> in the job (Megatron does not check it: a schedule breaking it runs out of memory, and
`max_seqlen_per_dp_cp_rank` alone, L / cp, does not keep it). A round lasts until its last rank finishes, a sequence starting
when every rank of its group is free (the CP collectives make the group wait for its slowest member).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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

    @classmethod
    def of(cls, profile: Profile, *, tp: int, pp: int, cp: int, dp: int, capacity: int, multiple: int = 1,
           recompute: str = "none") -> MegatronPacking:
        view = for_gpus(profile, tp * pp * cp * dp)
        scheme = next((s for s in view.schemes if s.key == (tp, pp, cp, recompute)), None)
        if scheme is None:
            raise UserError(f"profile {profile.name}: no scheme <{tp},{pp},{cp}> with recompute {recompute} "
                            f"in {tp * pp * cp * dp} GPUs")
        if capacity < 1 or multiple < 1 or multiple % dp:
            raise UserError(f"packing: capacity {capacity} and multiple {multiple} must be positive, the multiple "
                            f"one of dp = {dp}")
        return cls(scheme, dp, int(capacity), int(multiple))

    def replicas(self, schedule: PackingSchedule) -> list[list[list[int]]]:
        """[replica][micro-batch] -> positions (the first cp rank's lists)."""
        cp = self.scheme.cp
        return [[mb[d * cp] for mb in schedule] for d in range(self.dp)]

    def propagation_s(self, schedule: PackingSchedule, lengths: ArrayLike) -> list[float]:
        """Per replica: the canonical pipeline time of its packs, in order."""
        lengths = np.asarray(lengths, dtype=np.int64)
        return [pipeline_time(self.scheme, [lengths[mb] for mb in rep]) for rep in self.replicas(schedule)]


def packing_violations(schedule: PackingSchedule, lengths: Lengths, dp: int, cp: int, capacity: int,
                       multiple: int) -> list[str]:
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
            for j in pack:
                seen[j] += 1
    if (seen != 1).any():
        out.append(f"positions not packed exactly once: {np.flatnonzero(seen != 1)[:5].tolist()}")
    return out
