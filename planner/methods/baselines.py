"""What users run today, planned per iteration on the canonical cost model so every method is comparable.

- megatron: one homogeneous scheme replicated over the cluster, first-fit-decreasing packing to the
  context length (Megatron's --seq-length; at most MaxLen), packed micro-batches dealt round-robin to the
  pipelines (Hydraulis §8 baseline).
- hotspa: one homogeneous strategy per length range (<4K, 4K-16K, 16K+; Hydraulis appendix G), run one
  after another inside the iteration, each range FFD-packed, plus a modeled hot-switching cost.
- wlb-llm: one homogeneous scheme, variable-length greedy packing with the multi-level outlier delay
  queues (WLB-LLM §4, Algorithm 1), reporting its Table 2 imbalance degree and per-token delay.
- flexsp: sequences sorted by length, split into consecutive micro-batch steps by the memory-balanced
  chunking DP (FlexSP Eq. 23-24); each step runs on heterogeneous pp=1 groups (FlexSP's flexible SP).

Every function is pure: lengths in, an IterationPlan out (indices into the trained lengths).

End to end (`plan_iteration_s`): every method pays the docs/formats.md sync formula with its own schemes. A plan
of one phase is exactly docs/formats.md's max_j (prop_j + exposed_j). Phases run one after another inside the
iteration (HotSPa's length ranges, FlexSP's steps), so the parameters are pulled once, hidden behind the
forward of the first phase's pipelines, and the gradients pushed once, behind the backward of the last
phase's: each phase takes max_j (prop_j + its exposed pull if first + its exposed push if last), and the
phases add up. What moves between phases is not in the formula: for HotSPa it is its modeled switching
cost (`overhead_s`, kept on top); FlexSP's steps keep every GPU's parameters (ZeRO shards gathered once per
iteration), which is exact for its tp = 1 groups and favours it slightly when a step regroups tp > 1.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.core.cluster import Cluster
from hydraplan.core.cost import attention_weights, micro_batch_times, pipeline_time_from_mb, seq_cost
from hydraplan.core.errors import UserError
from hydraplan.core.schema import ModelInfo, Scheme
from hydraplan.core.sync import exposed_pull_s, exposed_push_s
from hydraplan.solve.delay import outlier_delay, stream_batches, wlb_rule
from hydraplan.solve.ffd import first_fit_bins

HOTSPA_BOUNDS = (4096, 16384)
BF16_BYTES = 2


# ------------------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class PipelineRun:
    """One pipeline of a phase: its scheme and micro-batches (index arrays into the plan's lengths)."""

    scheme: Scheme
    micro_batches: tuple[np.ndarray, ...]
    mb_times: np.ndarray
    latency_s: float


@dataclass(frozen=True)
class Phase:
    """Pipelines that run concurrently; `idle_gpus` of the job hold no pipeline during the phase."""

    label: str
    pipelines: tuple[PipelineRun, ...]
    idle_gpus: int

    @property
    def latency_s(self) -> float:
        return max((p.latency_s for p in self.pipelines), default=0.0)


@dataclass(frozen=True)
class IterationPlan:
    """One method's plan of one iteration. Phases run one after another; `overhead_s` is not compute
    (HotSPa switching). `lengths` are the sequences trained this iteration (WLB-LLM's delay changes them)."""

    method: str
    strategy: str
    lengths: np.ndarray
    phases: tuple[Phase, ...]
    overhead_s: float = 0.0
    imbalance: float | None = None
    delayed_token_iters: float = 0.0

    @property
    def estimate_s(self) -> float:
        return sum(p.latency_s for p in self.phases) + self.overhead_s


def run_pipeline(scheme: Scheme, lengths: np.ndarray, micro_batches: Sequence[np.ndarray]) -> PipelineRun:
    """Score a pipeline with the canonical estimate (sum + (pp-1)*max of micro-batch times)."""
    mbs = tuple(np.asarray(mb, dtype=np.int64) for mb in micro_batches)
    times = micro_batch_times(scheme, lengths, mbs)
    return PipelineRun(scheme, mbs, times, pipeline_time_from_mb(times, scheme.pp))


def plan_iteration_s(plan: IterationPlan, cluster: Cluster) -> float:
    """The plan's end-to-end estimate (module docstring): its propagation estimate plus exposed sync."""
    phases = [ph for ph in plan.phases if ph.pipelines]
    total = plan.overhead_s
    for n, ph in enumerate(phases):
        prop = np.array([p.latency_s for p in ph.pipelines])
        t = np.asarray(cluster.transfer_s(np.array([p.scheme.tp for p in ph.pipelines]),
                                          np.array([p.scheme.pp for p in ph.pipelines])), dtype=np.float64)
        exposed = np.zeros_like(prop)
        if n == 0:
            exposed += exposed_pull_s(t, prop)
        if n == len(phases) - 1:
            exposed += exposed_push_s(t, prop)
        total += float((prop + np.where(prop > 0, exposed, 0.0)).max())
    return total


def objective_score(cluster: Cluster) -> Callable[[IterationPlan], float]:
    """What static choices are tuned on: the plan's score in the cluster's objective."""
    return lambda plan: cluster.score(plan.estimate_s, plan_iteration_s(plan, cluster))


def _check_fits(lengths: np.ndarray, capacity: int, who: str) -> None:
    if lengths.size and int(lengths.max()) > capacity:
        raise ValueError(f"{who}: a sequence of {int(lengths.max())} tokens exceeds its MaxLen {capacity}")


# ------------------------------------------------------------------------------------------- packing
def ffd(lengths: np.ndarray, capacity: int) -> list[np.ndarray]:
    """First-fit decreasing bin packing: bins of at most `capacity` tokens, as index arrays (each in the
    order its items were placed; read-only)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    _check_fits(lengths, capacity, "ffd")
    if lengths.size == 0:
        return []
    return list(_ffd(lengths.tobytes(), int(capacity)))


@functools.lru_cache(maxsize=16)
def _ffd(key: bytes, capacity: int) -> tuple[np.ndarray, ...]:
    """ffd by content: choosing a static layout packs the same batch for every scheme that holds the context
    (Megatron packs to the context length whatever the scheme), 42 identical FFDs of 25K sequences per batch
    at 8192 GPUs."""
    lengths = np.frombuffer(key, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    bins = first_fit_bins(lengths[order], capacity)
    by_bin = np.argsort(bins, kind="stable")
    out = tuple(np.split(order[by_bin], np.flatnonzero(np.diff(bins[by_bin])) + 1))
    for b in out:
        b.setflags(write=False)
    return out


def deal_round_robin(n_items: int, n_pipelines: int) -> list[list[int]]:
    """Item k to pipeline k mod D: the even split by count that data loaders do."""
    return [list(range(d, n_items, n_pipelines)) for d in range(n_pipelines)]


# ------------------------------------------------------------------------------------------ megatron
def holding(schemes: Sequence[Scheme], length: int, gpus: int) -> list[Scheme]:
    return [s for s in schemes if s.max_len >= length and s.gpus <= gpus]


def best_static(schemes: Sequence[Scheme], run: Callable[[Scheme], list[IterationPlan]], who: str,
                score: Callable[[IterationPlan], float] | None = None) -> tuple[Scheme, list[IterationPlan]]:
    """The scheme whose plans have the lowest mean `score` (default: propagation estimate) over the batches."""
    if not schemes:
        raise UserError(f"context_len too long for {who}: no scheme of the profile holds it", "context_len")
    score = score or (lambda p: p.estimate_s)
    runs = [(s, run(s)) for s in schemes]
    return min(runs, key=lambda r: (np.mean([score(p) for p in r[1]]), r[0].gpus))


def megatron_phase(lengths: np.ndarray, scheme: Scheme, gpus: int, subset: np.ndarray | None = None,
                   label: str = "", capacity: int | None = None) -> Phase:
    """`subset` of the sequences FFD-packed to `capacity` tokens (default and at most MaxLen), micro-batches
    dealt round-robin to N // gpus pipelines."""
    idx = np.arange(lengths.size) if subset is None else np.asarray(subset, dtype=np.int64)
    cap = scheme.max_len if capacity is None else min(capacity, scheme.max_len)
    bins = [idx[b] for b in ffd(lengths[idx], cap)]
    d = gpus // scheme.gpus
    if d < 1:
        raise ValueError(f"scheme {scheme.label} needs {scheme.gpus} GPUs, more than {gpus}")
    times = micro_batch_times(scheme, lengths, bins)  # every bin at once, then dealt
    pipes = tuple(PipelineRun(scheme, tuple(bins[k] for k in ks), times[ks], pipeline_time_from_mb(times[ks], scheme.pp))
                  for ks in deal_round_robin(len(bins), d))
    return Phase(label or scheme.label, pipes, gpus - d * scheme.gpus)


def megatron(lengths: np.ndarray, scheme: Scheme, gpus: int, capacity: int | None = None) -> IterationPlan:
    """Megatron-LM packs to its --seq-length (`capacity`, the context length), not to the memory limit."""
    lengths = np.asarray(lengths, dtype=np.int64)
    label = f"{scheme.label}x{gpus // scheme.gpus}"
    return IterationPlan("megatron", label, lengths, (megatron_phase(lengths, scheme, gpus, label=label, capacity=capacity),))


# -------------------------------------------------------------------------------------------- hotspa
def hotspa_ranges(context_len: int, bounds: Sequence[int] = HOTSPA_BOUNDS) -> list[tuple[int, int]]:
    """Length ranges (lo, hi], longest first as HotSPa runs them; 2 ranges when context <= 16K."""
    edges = [0, *[b for b in bounds if b < context_len], context_len]
    return [(edges[i], edges[i + 1]) for i in range(len(edges) - 2, -1, -1)]


@dataclass(frozen=True)
class SwitchModel:
    """HotSPa hot switching: every GPU reduce-scatters the bf16 gradients of its old stage and gathers
    the bf16 weights of its new stage, so one switch moves param_bytes/pp_old + param_bytes/pp_new bytes
    per GPU at `bandwidth_Bps` (effective per-GPU collective bandwidth); the default is chosen to give switch
    times of the order of Hydraulis appendix H, Table 4."""

    param_bytes: float
    bandwidth_Bps: float = 50e9

    def switch_s(self, old: Scheme, new: Scheme) -> float:
        if old.key[:3] == new.key[:3]:  # another recomputation mode moves no parameter
            return 0.0
        return (self.param_bytes / old.pp + self.param_bytes / new.pp) / self.bandwidth_Bps


def model_param_bytes(model: ModelInfo) -> float:
    """bf16 bytes of a LLaMA-style model: attention 4h^2 (less with grouped-query attention) and SwiGLU 3*h*ffn
    per layer, input and output embeddings (one if tied); ffn = 8h/3 and vocab = 32000 when the profile does not say."""
    h = model.hidden
    ffn = model.ffn if model.ffn is not None else 8 * h / 3
    vocab = model.vocab if model.vocab is not None else 32000
    embeddings = 1 if model.tied_embeddings else 2
    return BF16_BYTES * (model.layers * (attention_weights(model) + 3 * h * ffn) + embeddings * vocab * h)


def switch_overhead(schemes: Sequence[Scheme], switch: SwitchModel) -> float:
    """Switching time of one iteration running `schemes` in order, cyclically (the next iteration starts
    with the first strategy again); none when they are all the same."""
    if len({s.key[:3] for s in schemes}) <= 1:
        return 0.0
    return sum(switch.switch_s(schemes[i - 1], schemes[i]) for i in range(len(schemes)))


def hotspa(lengths: np.ndarray, range_schemes: Sequence[tuple[tuple[int, int], Scheme]], gpus: int,
           switch: SwitchModel) -> IterationPlan:
    """One phase per non-empty length range, packed to the range's upper bound (the strategy's sequence
    length); switching cost between consecutive distinct schemes, cyclically (the next iteration starts
    with the first strategy again)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    phases = []
    for (lo, hi), scheme in range_schemes:
        subset = np.flatnonzero((lengths > lo) & (lengths <= hi))
        if subset.size:
            phases.append(megatron_phase(lengths, scheme, gpus, subset, f"{scheme.label}x{gpus // scheme.gpus} ({lo},{hi}]", hi))
    overhead = switch_overhead([p.pipelines[0].scheme for p in phases], switch)
    strategy = "+".join(dict.fromkeys(f"{s.label}x{gpus // s.gpus}" for _, s in range_schemes))
    return IterationPlan("hotspa", strategy, lengths, tuple(phases), overhead_s=overhead)


# ------------------------------------------------------------------------------------------- wlb-llm
def wlb_thresholds(tokens_per_iter: int, micro_batches: int, queues: int) -> list[int]:
    """Outlier thresholds L_1 < ... < L_q: a document longer than half a micro-batch's fair token share
    cannot be balanced inside one iteration, so the first queue starts there; each next queue doubles."""
    share = tokens_per_iter / micro_batches
    return [int(share * 2.0 ** (i - queues)) for i in range(1, queues + 1)]


def wlb_pack(lengths: np.ndarray, scheme: Scheme, micro_batches: int, max_tokens: int) -> tuple[list[list[int]], list[int]]:
    """WLB-LLM Algorithm 1 packing: documents in descending length go to the least-loaded micro-batch if
    they fit, else to the shortest one; the rest wait for the next iteration. Returns (mbs, left over)."""
    load = np.full(micro_batches, scheme.time.c)
    tokens = np.zeros(micro_batches, dtype=np.int64)
    mbs: list[list[int]] = [[] for _ in range(micro_batches)]
    left: list[int] = []
    costs = seq_cost(scheme, lengths)
    for i in np.argsort(-lengths, kind="stable"):
        for m in (int(np.argmin(load)), int(np.argmin(tokens))):
            if tokens[m] + lengths[i] <= max_tokens:
                mbs[m].append(int(i))
                load[m] += costs[i]
                tokens[m] += lengths[i]
                break
        else:
            left.append(int(i))
    return mbs, left


def imbalance_degree(mb_times: np.ndarray) -> float:
    """WLB-LLM Table 2: slowest micro-batch over the mean micro-batch of the global batch."""
    return float(mb_times.max() * mb_times.size / mb_times.sum())


def _snake(order: np.ndarray, n_pipelines: int) -> list[list[int]]:
    """Deal items (heaviest first) 0,1,..,D-1,D-1,..,0,...: equal counts, balanced loads."""
    out: list[list[int]] = [[] for _ in range(n_pipelines)]
    for k, item in enumerate(order):
        r, q = divmod(k, n_pipelines)
        out[q if r % 2 == 0 else n_pipelines - 1 - q].append(int(item))
    return out


def wlb_llm(batches: Sequence[np.ndarray], scheme: Scheme, gpus: int, micro_batches_per_pipeline: int,
            thresholds: Sequence[int], drain: bool = True) -> list[IterationPlan]:
    """Run the outlier queues (hydraplan.solve.delay, `wlb_rule`) over the iterations in order (stateful).

    Documents longer than thresholds[0] wait in queue q (the last threshold they exceed) until it holds
    one per micro-batch, then all are released so each micro-batch gets exactly one outlier. With
    `drain`, the last iteration also trains everything still queued or carried (in extra rounds of
    micro-batches if needed), so the run trains exactly the sampled tokens, like every other method.
    """
    d = gpus // scheme.gpus
    m_total = d * micro_batches_per_pipeline
    for batch in batches:
        _check_fits(np.asarray(batch, dtype=np.int64), scheme.max_len, f"wlb-llm {scheme.label}")
    carry: list[tuple[int, int]] = []
    plans = []
    stream = outlier_delay(stream_batches(batches), wlb_rule(thresholds, m_total), len(batches) if drain else None)
    for it, released in enumerate(stream):
        assert released.sampled is not None  # outlier_delay says when each sequence was sampled
        pending = carry + list(zip(released.lengths.tolist(), released.sampled.tolist()))
        last = drain and it == len(batches) - 1
        lens = np.array([l for l, _ in pending], dtype=np.int64)
        born = np.array([s for _, s in pending], dtype=np.int64)
        mbs, left = wlb_pack(lens, scheme, m_total, scheme.max_len)
        while last and left:
            extra, rest = wlb_pack(lens[left], scheme, m_total, scheme.max_len)
            mbs += [[left[i] for i in mb] for mb in extra if mb]
            left = [left[i] for i in rest]
        carry = [pending[i] for i in left]
        kept = np.setdiff1d(np.arange(lens.size), np.asarray(left, dtype=np.int64))
        remap = np.full(lens.size, -1, dtype=np.int64)
        remap[kept] = np.arange(kept.size)
        trained = lens[kept]
        mb_idx = [remap[np.asarray(mb, dtype=np.int64)] for mb in mbs]
        mb_times = micro_batch_times(scheme, trained, mb_idx)
        pipes = tuple(run_pipeline(scheme, trained, [mb_idx[k] for k in ks if mb_idx[k].size])
                      for ks in _snake(np.argsort(-mb_times, kind="stable"), d))
        label = f"{scheme.label}x{d}"
        plans.append(IterationPlan(
            "wlb-llm", label, trained, (Phase(label, pipes, gpus - d * scheme.gpus),),
            imbalance=imbalance_degree(mb_times),
            delayed_token_iters=float((trained * (it - born[kept])).sum()),
        ))
    return plans


# -------------------------------------------------------------------------------------------- flexsp
def chunk_dp(sizes: np.ndarray, parts: int) -> list[np.ndarray]:
    """FlexSP Eq. 23-24: split `sizes` (in order) into `parts` consecutive non-empty chunks minimizing
    the largest chunk sum. DP[k][i] = min_j max(DP[j][i-1], S[k]-S[j]); DP[.][i-1] is non-decreasing
    and S[k]-S[j] decreasing in j, so the inner min sits where they cross: a searchsorted, exact."""
    sizes = np.asarray(sizes, dtype=np.int64)
    k_all = sizes.size
    if not 1 <= parts <= k_all:
        raise ValueError(f"cannot split {k_all} sequences into {parts} non-empty micro-batches")
    s = np.concatenate([[0], np.cumsum(sizes)])
    prev = np.where(np.arange(k_all + 1) == 0, 0, np.iinfo(np.int64).max // 4)
    choice = np.zeros((parts + 1, k_all + 1), dtype=np.int64)
    ks = np.arange(k_all + 1)
    for i in range(1, parts + 1):
        key = prev + s
        key[: i - 1] = -1  # states j < i-1 are unreachable; keeps the key sorted for searchsorted
        j = np.searchsorted(key, s, side="left")
        lo, hi = i - 1, np.maximum(ks - 1, i - 1)
        cands = np.stack([np.clip(j, lo, hi), np.clip(j - 1, lo, hi)])
        vals = np.maximum(prev[cands], s[None, :] - s[cands])
        best = np.argmin(vals, axis=0)
        cur = vals[best, ks]
        cur[ks < i] = np.iinfo(np.int64).max // 4
        choice[i] = cands[best, ks]
        prev = cur
    bounds = [k_all]
    for i in range(parts, 0, -1):
        bounds.append(int(choice[i, bounds[-1]]))
    bounds.reverse()
    return [np.arange(bounds[i], bounds[i + 1]) for i in range(parts)]


def _fastest_per_size(schemes: Sequence[Scheme], length: int) -> list[int]:
    """For each group size, the scheme that runs a sequence of `length` fastest (FlexSP's SP degrees)."""
    best: dict[int, int] = {}
    for k, s in enumerate(schemes):
        if s.max_len >= length:
            t = float(seq_cost(s, length))
            if s.gpus not in best or t < float(seq_cost(schemes[best[s.gpus]], length)):
                best[s.gpus] = k
    return sorted(best.values(), key=lambda k: schemes[k].gpus)


@dataclass(frozen=True)
class _StepGroups:
    """A step's groups: scheme index, member positions (into the step's sequences) and latency per group."""

    groups: tuple[tuple[int, np.ndarray], ...]
    latencies: np.ndarray
    free: int

    @property
    def latency_s(self) -> float:
        return float(self.latencies.max())


def _step_groups(sub: np.ndarray, schemes: Sequence[Scheme], gpus: int, kind: np.ndarray) -> _StepGroups | None:
    """Groups for a given scheme per sequence (`kind`): one group per used scheme, then more groups for
    the scheme with the most work per group while GPUs last; sequences longest first to the least-loaded
    group of their scheme (LPT). None if the groups do not fit in the cluster."""
    used = sorted(set(kind.tolist()))
    free = gpus - sum(schemes[k].gpus for k in used)
    if free < 0:
        return None
    members = {k: np.flatnonzero(kind == k) for k in used}
    costs = {k: seq_cost(schemes[k], sub[members[k]]) for k in used}
    work = {k: float(costs[k].sum()) for k in used}
    count = dict.fromkeys(used, 1)
    size = {k: schemes[k].gpus for k in used}
    while True:
        fits = [k for k in used if size[k] <= free]
        if not fits:
            break
        k = max(fits, key=lambda k: (work[k] / count[k], -k))
        count[k] += 1
        free -= size[k]
    groups, lats = [], []
    for k in used:
        s, mem = schemes[k], members[k]
        order = np.argsort(-sub[mem], kind="stable")
        heap = [(0.0, g) for g in range(count[k])]
        slot = np.empty(mem.size, dtype=np.int64)
        for i, c in zip(order.tolist(), costs[k][order].tolist()):
            load, g = heapq.heappop(heap)
            slot[i] = g
            heapq.heappush(heap, (load + c, g))
        loads = np.bincount(slot, weights=costs[k], minlength=count[k])
        tokens = np.bincount(slot, weights=sub[mem], minlength=count[k])
        for g in range(count[k]):
            if tokens[g] == 0:
                n_mb = 0
            elif tokens[g] <= s.max_len:
                n_mb = 1
            else:
                n_mb = len(ffd(sub[mem[slot == g]], s.max_len))
            groups.append((k, mem[slot == g]))
            lats.append(loads[g] + n_mb * s.time.c)
    return _StepGroups(tuple(groups), np.array(lats), free)


def flexsp_step(lengths: np.ndarray, subset: np.ndarray, schemes: Sequence[Scheme], gpus: int, label: str,
                rounds: int = 16) -> Phase:
    """One FlexSP step on heterogeneous pp=1 groups, a greedy stand-in for FlexSP's MILP: start from
    each sequence's cheapest scheme in GPU-seconds (merging the smallest schemes upward until one group of
    each fits), then repeatedly move the slowest group's sequences to a faster, larger scheme while that
    lowers the step time. Groups run their sequences FFD-packed to MaxLen."""
    sub = lengths[subset]
    gpu_s = np.stack([np.where(s.max_len >= sub, seq_cost(s, sub) * s.gpus, np.inf) for s in schemes], axis=1)
    kind = np.argmin(gpu_s, axis=1)
    while sum(schemes[k].gpus for k in set(kind.tolist())) > gpus:
        smallest = min(set(kind.tolist()), key=lambda k: (schemes[k].gpus, schemes[k].max_len))
        moved = kind == smallest
        gpu_s[:, smallest] = np.inf
        kind[moved] = np.argmin(gpu_s[moved], axis=1)
    best = _step_groups(sub, schemes, gpus, kind)
    if best is None:
        raise ValueError(f"flexsp: cannot form groups for {sub.size} sequences on {gpus} GPUs")
    for _ in range(rounds):
        k_slow, members = best.groups[int(np.argmax(best.latencies))]
        longest = int(sub[members].max())
        here = float(seq_cost(schemes[k_slow], longest))
        improved = None
        for k in _fastest_per_size(schemes, longest):
            if float(seq_cost(schemes[k], longest)) >= here:
                continue
            trial = kind.copy()
            trial[members] = k
            cand = _step_groups(sub, schemes, gpus, trial)
            if cand is not None and cand.latency_s < (improved or best).latency_s:
                improved, new_kind = cand, trial
        if improved is None:
            break
        best, kind = improved, new_kind
    pipes = []
    for k, mem in best.groups:
        idx = subset[mem]
        bins = [idx[b] for b in ffd(lengths[idx], schemes[k].max_len)] if idx.size else []
        pipes.append(run_pipeline(schemes[k], lengths, bins))
    return Phase(label, tuple(pipes), best.free)


def flexsp(lengths: np.ndarray, schemes: Sequence[Scheme], gpus: int, extra_steps: int = 3,
           score: Callable[[IterationPlan], float] | None = None) -> IterationPlan:
    """Sort sequences by length, chunk them into M memory-balanced steps (Eq. 23-24) and run each step
    on flexible pp=1 groups. M is enumerated from the fewest steps whose token sums fit the cluster,
    keeping the fastest (by `score`, default the propagation estimate), as FlexSP's solver does. End to end
    (plan_iteration_s) the steps are phases: parameters pulled before the first, pushed after the last."""
    score = score or (lambda p: p.estimate_s)
    lengths = np.asarray(lengths, dtype=np.int64)
    sp = [s for s in schemes if s.pp == 1 and s.gpus <= gpus]
    if not sp:
        raise ValueError("flexsp: the profile has no pp=1 scheme that fits the cluster")
    _check_fits(lengths, max(s.max_len for s in sp), "flexsp")
    capacity = max((gpus // s.gpus) * s.max_len for s in sp)
    order = np.argsort(-lengths, kind="stable")
    m_min = max(1, math.ceil(int(lengths.sum()) / capacity))
    best: IterationPlan | None = None
    m, tried = m_min, 0
    while m <= lengths.size and tried <= extra_steps:
        chunks = chunk_dp(lengths[order], m)
        if max(int(lengths[order[c]].sum()) for c in chunks) <= capacity:
            tried += 1
            phases = tuple(flexsp_step(lengths, order[c], sp, gpus, f"step {i}") for i, c in enumerate(chunks))
            plan = IterationPlan("flexsp", f"{m} step{'s' if m > 1 else ''}", lengths, phases)
            if best is None or score(plan) < score(best):
                best = plan
        m += 1
    if best is None:
        raise ValueError("flexsp: no step count fits the cluster memory")
    return best
