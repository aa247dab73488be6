"""Seq1F1B planning: computation-wise splits of packed micro-batches (seq1f1b.txt §3.4), the Seq1F1B
latency estimate, the raised MaxLen, and the choice of K.

Cost of a split. Under the profile a document of length l costs a*l^2 + b*l per stage. With causal
attention a token at position p (1-based) of its document attends to p keys, so it costs a*(2p - 1) + b:
the per-token costs of a document sum to exactly a*l^2 + b*l, so the K split costs of a micro-batch sum
to its canonical cost minus c. Split points come from a binary search (np.searchsorted) over the
cumulative cost sampled at every admissible boundary (multiples of tp, and of 2*cp when cp > 1).

Time of a split. Each sub-sequence pays the full per-pass overhead c (kernel launches, p2p, fixed
per-layer work): split time = split cost + c. So K = 1 reproduces the canonical micro-batch time T(m),
and large K pays K*c per micro-batch, the utilization loss seq1f1b.txt Table 6 shows as k grows.

Seq1F1B estimate. The Seq1F1B schedule (hydraplan.core.schedules) is simulated with those split times,
F = 1/3, B = 2/3 of each; for K = 1 that is the schedule-exact 1F1B time. It equals the canonical
estimate for uniform micro-batches; with uneven ones it may be above it (a long micro-batch stalls the
1F1B pairs of its neighbours, which sum + (P-1)*max does not see) or below.

Memory and MaxLen. A scheme's memory constant act_bytes_per_token (SchemeMemory) is the peak activation
bytes per packed token under 1F1B, where the first stage holds P micro-batches; one stashed token costs
act_bytes_per_token / P there. Under Seq1F1B the first stage holds P - 1 + K sub-sequences (Eq. (4)
warm-up + 1, pipeline.forwards_before_first_backward), so a sub-sequence may hold up to
    split_cap = max_len * P / (P - 1 + K)                tokens (rounded down to the split quantum),
and with equal-token splits a micro-batch may hold
    seq1f1b_max_len = K * split_cap = max_len * K*P / (P - 1 + K)   tokens
(the memory factor (P - 1 + K) / (K*P) tends to 1/K when P >> K). A split also attends to a copy of its
key window, the K/V of its document's tokens in the earlier splits and its own (runtime/seq1f1b.py): with
K equal splits of one document, split s copies s + 1 splits' K/V, (K(K+1)/2 - 1) / K per query token over
the micro-batch beyond what plain 1F1B keeps; a profile that gives K/V bytes per token
(SchemeMemory.kv_bytes_per_token, `kv`) charges them, so each stashed token costs (act + w(K)*kv) / P and
split_cap shrinks by act / (act + w(K)*kv). Computation-wise splits put more tokens in early splits (their
tokens are cheaper), so splits are clamped to split_cap tokens; a clamped micro-batch trades a little
balance for fitting in memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.core.cost import pipeline_time
from hydraplan.core.errors import UserError
from hydraplan.core.schedules import fb_split, schedule_seq1f1b, simulate
from hydraplan.core.schema import Plan, PlanPipeline, Scheme
from hydraplan.solve.cpshard import annotate_cp

AUTO_SPLITS = (1, 2, 4, 8)
"""K values `auto` tries; the paper finds 4 best and throughput falling by 16 (Table 6)."""


@dataclass(frozen=True)
class SplitPlan:
    """bounds: K+1 token offsets into the packed micro-batch, sub-sequence j = [bounds[j], bounds[j+1]);
    costs: the K split costs (seconds, without the per-pass overhead c)."""

    bounds: np.ndarray
    costs: np.ndarray

    @property
    def tokens(self) -> np.ndarray:
        return np.diff(self.bounds)


@dataclass(frozen=True)
class Seq1F1BPlan:
    """Seq1F1B for one pipeline's micro-batches: K, per micro-batch split bounds, the simulated
    latency, the canonical (1F1B closed-form) estimate, and the MaxLen the splits allow."""

    K: int
    splits: list[np.ndarray]
    estimate_s: float
    canonical_s: float
    max_len: int
    bubble_ratio: float


def split_quantum(scheme: Scheme) -> int:
    """Split boundaries must be multiples of tp (sequence-parallel shards) and of 2*cp (CP chunks)."""
    return math.lcm(scheme.tp, 2 * scheme.cp) if scheme.cp > 1 else scheme.tp


def cumulative_cost(lengths: np.ndarray, a: float, b: float, at: np.ndarray) -> np.ndarray:
    """Cost of the first x packed tokens for each x in `at` (documents packed in the given order)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    doc_cost = np.concatenate([[0.0], np.cumsum((a * lengths + b) * lengths)])
    d = np.searchsorted(ends, at, side="right")  # documents fully before x
    p = (at - np.concatenate([[0], ends])[d]).astype(np.float64)
    return doc_cost[d] + (a * p + b) * p


def computation_splits(
    lengths: Sequence[int] | np.ndarray,
    a: float,
    b: float,
    K: int,
    quantum: int = 1,
    max_split_tokens: int | None = None,
) -> SplitPlan:
    """Split a packed micro-batch (documents of `lengths`, in order) into K sub-sequences of equal cost.

    Boundaries are multiples of `quantum` (the last split ends at the packed length) and no split holds
    more than max_split_tokens tokens when given. Every split is non-empty when the length allows
    (n >= K * quantum).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = int(lengths.sum())
    grid = np.arange(0, n + 1, quantum, dtype=np.int64)
    if grid[-1] != n:
        grid = np.append(grid, n)
    cum = cumulative_cost(lengths, a, b, grid)
    targets = cum[-1] * np.arange(1, K) / K
    hi_idx = np.clip(np.searchsorted(cum, targets), 1, len(grid) - 1)
    nearer = np.where(targets - cum[hi_idx - 1] <= cum[hi_idx] - targets, hi_idx - 1, hi_idx)
    gap = quantum if n >= K * quantum else 0
    cap = n if max_split_tokens is None else max(int(max_split_tokens), gap)
    bounds = np.zeros(K + 1, dtype=np.int64)
    bounds[K] = n
    for j in range(1, K):
        lo = max(bounds[j - 1] + gap, n - (K - j) * cap)
        hi = min(bounds[j - 1] + cap, n - (K - j) * gap)
        lo_g = grid[min(np.searchsorted(grid, lo), len(grid) - 1)]
        hi_g = grid[max(np.searchsorted(grid, hi, side="right") - 1, 0)]
        bounds[j] = min(max(grid[nearer[j - 1]], lo_g), max(hi_g, lo_g))
    costs = np.diff(cumulative_cost(lengths, a, b, bounds))
    return SplitPlan(bounds=bounds, costs=costs)


def window_copies(K: int) -> float:
    """K/V tokens copied into key windows per query token of a micro-batch cut into K equal splits (module docstring)."""
    return (K * (K + 1) / 2 - 1) / K


def seq1f1b_split_cap(scheme: Scheme, K: int) -> int:
    """Most tokens one sub-sequence may hold (a multiple of the split quantum): the first stage stashes
    P - 1 + K of them, each with its share of the window copies when the profile gives K/V bytes."""
    P, q = scheme.pp, split_quantum(scheme)
    mem = scheme.memory
    keep = 1.0
    if mem is not None and mem.kv_bytes_per_token:
        keep = mem.act_bytes_per_token / (mem.act_bytes_per_token + window_copies(K) * mem.kv_bytes_per_token)
    return int(scheme.max_len * P * keep // (P - 1 + K)) // q * q


def seq1f1b_max_len(scheme: Scheme, K: int) -> int:
    """Usable MaxLen under Seq1F1B with K splits (equal-token splits; see the module docstring)."""
    return K * seq1f1b_split_cap(scheme, K)


def split_micro_batches(scheme: Scheme, micro_batches: Sequence[np.ndarray], K: int) -> list[SplitPlan]:
    q, cap, t = split_quantum(scheme), seq1f1b_split_cap(scheme, K), scheme.time
    return [computation_splits(mb, t.a, t.b, K, q, cap) for mb in micro_batches]


def seq1f1b_estimate(scheme: Scheme, splits: Sequence[SplitPlan]) -> tuple[float, float]:
    """(latency, bubble ratio) of Seq1F1B on one pipeline by simulating its schedule."""
    K = len(splits[0].costs)
    times = np.stack([sp.costs for sp in splits]) + scheme.time.c
    tl = simulate(schedule_seq1f1b(scheme.pp, len(splits), K), *fb_split(times))
    return tl.latency_s, tl.bubble_ratio


def plan_seq1f1b(scheme: Scheme, micro_batches: Sequence[np.ndarray], K: int) -> Seq1F1BPlan:
    """Seq1F1B with K splits for one pipeline whose micro-batches (arrays of document lengths, packed
    order) are given; the canonical estimate is the plain 1F1B closed form of the same micro-batches."""
    splits = split_micro_batches(scheme, micro_batches, K)
    est, bubble = seq1f1b_estimate(scheme, splits) if micro_batches else (0.0, 0.0)
    return Seq1F1BPlan(
        K=K,
        splits=[sp.bounds for sp in splits],
        estimate_s=est,
        canonical_s=pipeline_time(scheme, micro_batches),
        max_len=seq1f1b_max_len(scheme, K),
        bubble_ratio=bubble,
    )


def auto_seq1f1b(scheme: Scheme, micro_batches: Sequence[np.ndarray], candidates: Sequence[int] = AUTO_SPLITS) -> Seq1F1BPlan:
    """The K (among candidates whose MaxLen holds every micro-batch) with the lowest Seq1F1B estimate;
    ties go to the smaller K (fewer, larger kernels)."""
    longest = max((int(np.sum(mb)) for mb in micro_batches), default=0)
    fits = [k for k in candidates if seq1f1b_max_len(scheme, k) >= longest] or [max(candidates)]
    plans = [plan_seq1f1b(scheme, micro_batches, k) for k in sorted(fits)]
    return min(plans, key=lambda p: p.estimate_s)


# ------------------------------------------------------------------------------------------- for pack
def parse_seq1f1b(value: str) -> int | str:
    """--seq1f1b: a number of splits K >= 1, or 'auto' (K per pipeline by estimate, among AUTO_SPLITS)."""
    if value == "auto":
        return value
    try:
        k = int(value)
    except ValueError:
        k = 0
    if k < 1:
        raise UserError(f"seq1f1b must be a positive number of splits or auto (got {value!r})", "seq1f1b")
    return k


def seq1f1b_scheme(scheme: Scheme, spec: int | str) -> Scheme:
    """The scheme as Seq1F1B packing sees it: pp > 1 pipelines get the raised MaxLen (for auto, that of
    the largest K tried; auto then only considers the K whose MaxLen holds every micro-batch)."""
    if scheme.pp == 1:
        return scheme
    k = max(AUTO_SPLITS) if spec == "auto" else int(spec)
    return scheme.model_copy(update={"max_len": max(scheme.max_len, seq1f1b_max_len(scheme, k))})


def annotate_seq1f1b(pipe: PlanPipeline, scheme: Scheme, micro_batches: Sequence[np.ndarray], spec: int | str) -> float:
    """Record Seq1F1B on a plan pipeline (pp > 1): seq1f1b_splits K, seq1f1b_estimate_s,
    seq1f1b_max_len, and per micro-batch `splits` (K+1 token offsets into its packed sequence).
    Returns the pipeline's Seq1F1B-aware estimate (the canonical one for pp = 1 or no micro-batches)."""
    if scheme.pp == 1 or not micro_batches:
        return pipe.estimate_s
    plan = auto_seq1f1b(scheme, micro_batches) if spec == "auto" else plan_seq1f1b(scheme, micro_batches, int(spec))
    pipe.seq1f1b_splits = plan.K
    pipe.seq1f1b_estimate_s = plan.estimate_s
    pipe.seq1f1b_max_len = plan.max_len
    for mb, bounds in zip(pipe.micro_batches, plan.splits, strict=True):
        mb.splits = bounds.tolist()
    return plan.estimate_s


def refine_plan(
    plan: Plan,
    schemes: Sequence[Scheme],
    micro_batches: Sequence[Sequence[np.ndarray]],
    lengths: np.ndarray,
    seq1f1b: int | str | None,
    cp_shard: bool,
) -> None:
    """`pack --seq1f1b / --cp-shard`: add Seq1F1B splits and estimates and CP shard ranges to a plan in
    place (micro_batches: per pipeline, per micro-batch, indices into `lengths`; schemes: with their
    plain 1F1B max_len, from which the split cap and the raised MaxLen follow). The canonical estimate
    fields are left as they are."""
    seq_est = []
    for pipe, scheme, groups in zip(plan.pipelines, schemes, micro_batches, strict=True):
        mbs = [lengths[g] for g in groups]
        if cp_shard:
            annotate_cp(pipe, scheme, mbs)
        if seq1f1b is not None:
            seq_est.append(annotate_seq1f1b(pipe, scheme, mbs, seq1f1b))
    if seq1f1b is not None:
        plan.estimate.seq1f1b_estimate_s = max(seq_est, default=0.0)
