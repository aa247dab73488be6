"""Per-batch strategy synthesis: integer strategies for the batch at hand, shaped by the any-strategy relaxation
(solve/relaxation.py), which the engine dispatches and packs next to the proposed candidates.

LNK pulls every parameter every iteration anyway, so any iteration may run any strategy: the candidate
list only saves solver time. The relaxation prices a pipeline as the cost model does (c per micro-batch, the
bubble (pp-1) times its largest micro-batch, the longest sequences whole), so its integer pipeline counts at
its least feasible latency X are a strategy that can carry the batch close to X. To keep it fast it runs on
a shortlist of schemes, coarse length groups and levels, and a node limit; it first asks whether anything
beats the best candidate by SKIP_RTOL at all (one probe), then bisects to SYNTH_REL_TOL. The counts with the
fewest GPUs at X and a little above (SLACK: room for the integral dispatch) are the strategies, deduplicated.

The engine (engine/synthesized.py) places them reusing rank sets already in use and solves them like
candidates.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from hydraplan.core.schema import PipelineSpec, Scheme
from hydraplan.core.sync import charges, propagation_budget_s
from hydraplan.solve.bound import Bisection, bisect
from hydraplan.solve.relaxation import Relaxation, probe, relaxation

LONG = 8  # the LP's relaxation: longest sequences kept whole,
GROUP_RATIO = 1.25  # the other sequences in length groups this wide,
LEVEL_RATIO = 1.5  # and pp > 1 pipelines by their longest sequence in levels this wide
MIP_LONG, MIP_GROUP_RATIO, MIP_LEVEL_RATIO = 24, 1.1, 1.5  # the MILP's, on the few schemes the LP uses
SYNTH_REL_TOL = 0.01
LP_FROM = 0.85  # the LP's bisection starts this far below the best candidate
SLACK = (0.02,)  # besides the least feasible latency's, the fewest-GPU strategies this far above it;
NEAR_SLACK = (0.0, 0.01, 0.02)  # these for a strategy of at most NEAR_PIPELINES pipelines
MIP_STEPS = (0.0, 0.01, 0.02, 0.04, 0.08)  # latencies above the LP's where the MILP is asked, in turn
MAX_NODES = 100  # branch-and-bound nodes per MILP (deterministic); the rare hard probe counts as infeasible
FEWEST_GAP = 0.01  # the fewest-GPU strategies within this of the fewest (leftover GPUs become pipelines anyway)
TOP = 2  # per length, the schemes carrying the most of its tokens per GPU
V_MAX = 64  # micro-batches per pipeline the shortlist considers
RETARGET = (1.0, 0.98, 0.96)  # synthesis aims at the best candidate's score times each, in turn,
RETARGET_PIPELINES = 96  # while its first strategy has at most this many pipelines
NEAR_PIPELINES = 48  # a strategy this small is searched closer: the MILP on the whole shortlist too, the fewest-GPU
# points at NEAR_SLACK, the strategies one pipeline away from the winner (engine.synthesized.around); one pipeline
# more or less moves such a plan, and its MILPs are quick
SKIP_RTOL = 0.01  # only strategies that beat the best candidate by more than this are worth dispatching
GROUPS = 1.25  # the shortlist ranks schemes per geometric length bin this wide


def _narrowest(schemes: Sequence[Scheme], among: Iterable[int]) -> list[int]:
    return sorted(among, key=lambda j: (schemes[j].gpus, j))


def _fill(counts: dict[int, int], schemes: Sequence[Scheme], gpus: int, pool: list[int]) -> dict[int, int] | None:
    """Leftover GPUs as pipelines of the schemes of `pool` in turn (narrowest first): an idle pipeline costs
    nothing, and dispatch moves short sequences to it. None when GPUs a scheme would use stay idle (the same
    strategy with them busy is at least as fast); never when `pool` ends with every scheme."""
    counts = {j: n for j, n in counts.items() if n > 0}
    left = gpus - sum(schemes[j].gpus * n for j, n in counts.items())
    for j in pool:
        if schemes[j].gpus <= left:
            counts[j] = counts.get(j, 0) + left // schemes[j].gpus
            left -= schemes[j].gpus * (left // schemes[j].gpus)
    return None if left >= min(s.gpus for s in schemes) else counts


def _shortlist(lengths: np.ndarray, schemes: Sequence[Scheme], gpus: int, budget: np.ndarray,
               prefer: Iterable[int]) -> list[int]:
    """The schemes worth a variable: `prefer` (the candidates'); for the longest of each length bin the TOP that
    carry the most of its tokens per GPU within `budget` (the propagation budget per scheme), sequences of that
    length only (k of them in V micro-batches take k w (1 + (pp-1)/V) + c (V + pp - 1), V M tokens at most, for
    the best V); and for each of the LONG longest sequences the TOP that carry the most tokens per GPU in a
    pipeline hosting it, the rest of the budget after it and its bubble filled with median-length sequences."""
    ls = np.sort(lengths)[::-1]
    bins = np.unique(-np.floor(np.log(np.maximum(ls, 1)) / np.log(GROUPS)), return_index=True)[1]
    a, b, c, p, M, g = (np.array([f(s) for s in schemes], dtype=np.float64) for f in (
        lambda s: s.time.a, lambda s: s.time.b, lambda s: s.time.c, lambda s: s.pp - 1, lambda s: s.max_len,
        lambda s: s.gpus))
    Y = budget

    def ranked(per_gpu: np.ndarray) -> set[int]:
        top = np.argsort(-per_gpu, axis=1, kind="stable")[:, :TOP]
        return {int(j) for j in top[np.take_along_axis(per_gpu, top, 1) > 0]}

    l = ls[bins].astype(np.float64)[:, None, None]
    V = np.arange(1, V_MAX + 1, dtype=np.float64)
    w = (a[:, None] * l + b[:, None]) * l
    k = np.minimum((Y[:, None] - c[:, None] * (V + p[:, None])) / (w * (1 + p[:, None] / V)), np.floor(V * M[:, None] / l))
    fits = (l <= M[:, None]) & (g[:, None] <= gpus) & (Y[:, None] >= (p[:, None] + 1) * (w + c[:, None]))
    filler = (np.floor(np.where(fits, np.maximum(k, 1.0), 0.0)) * l / g[:, None]).max(axis=2)
    lh = ls[:LONG].astype(np.float64)[:, None]
    wh = (a * lh + b) * lh
    rest = Y - (p + 1) * (wh + c)
    rho = a * float(np.median(ls)) + b + c / M
    host = np.where((lh <= M) & (g <= gpus) & (rest >= 0), (lh + rest / rho) / g, 0.0)
    return sorted(set(prefer) | ranked(filler) | ranked(host))


def _lp_least(rel: Relaxation, target: float | None, hint: Bisection | None = None) -> Bisection | None:
    """The LP's least feasible latency (within SYNTH_REL_TOL), None when it is above `target` (nothing in the
    relaxation's schemes beats the best candidate by SKIP_RTOL). The bracket starts LP_FROM below the target;
    with `hint`, the answer on another shortlist of the same batch, one probe at its latency when feasible there
    (the shortlists differ by a scheme or two, their least latencies by well under the tolerance)."""
    def relaxed(X: float) -> np.ndarray | None:
        return probe(rel, X, relax=True)

    if hint is not None and target is not None and hint.hi < target:
        at_hint = relaxed(hint.hi)
        if at_hint is not None:
            return Bisection(hint.lo, hint.hi, at_hint, 1)
    floor = max(rel.floor(), rel.volume())
    if target is None:
        return bisect(relaxed, floor, None, SYNTH_REL_TOL)
    at_top = relaxed(target) if target >= floor else None
    if at_top is None:
        return None
    below = LP_FROM * target  # most batches: the best candidate is within 15% of what the LP allows
    if below <= floor:
        return bisect(relaxed, floor, target, SYNTH_REL_TOL, at_top)
    at_below = relaxed(below)
    if at_below is None:
        return bisect(relaxed, below, target, SYNTH_REL_TOL, at_top, lo_infeasible=True)
    return bisect(relaxed, floor, below, SYNTH_REL_TOL, at_below)


def synthesize(lengths: np.ndarray, schemes: Sequence[Scheme], gpus: int, *, upper: float | None = None,
               transfer: np.ndarray | Sequence[float] | None = None, prefer: Iterable[int] = ()) -> list[dict[int, int]]:
    """Strategies for this batch as {scheme index: pipelines}, best-shaped first; none when `upper` (a latency some
    plan reaches) is already within SKIP_RTOL of what the relaxation allows. `transfer` (seconds per scheme,
    core/sync.py) shapes them for the end-to-end estimate; `prefer` lists schemes to offer besides the shortlist
    (the candidates'). With `upper`, also aimed RETARGET below it: a lower aim ranks the schemes for a tighter
    budget, so the MILP sees other schemes and stops at other latencies, and the relaxation's cheapest strategy
    is not always the one that dispatches best (measured: 1.4-3.6% faster plans on the 32B 256-GPU batches).
    Only for strategies of at most RETARGET_PIPELINES pipelines: with more, one pipeline more or less of a scheme is
    a small share of the job (measured at 1024 GPUs: the same mean estimate at 1.6x the CPU)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return []
    t = charges(transfer, len(schemes))
    prefer = list(prefer)
    if upper is None:
        return _aimed(lengths, schemes, gpus, None, t, prefer, None)[0]
    out: list[dict[int, int]] = []
    hint = None
    for aim in RETARGET:
        got, hint = _aimed(lengths, schemes, gpus, upper * aim, t, prefer, hint)
        if hint is None:  # nothing beats this aim, so nothing beats a lower one
            break
        out += [c for c in got if c not in out]
        if not out or sum(out[0].values()) > RETARGET_PIPELINES:
            break
    return out


def _aimed(lengths: np.ndarray, schemes: Sequence[Scheme], gpus: int, upper: float | None, t: np.ndarray,
           prefer: list[int], hint: Bisection | None) -> tuple[list[dict[int, int]], Bisection | None]:
    """synthesize at one aim, and the LP's least latency (None: nothing beats the aim)."""
    if upper is None:  # rank the schemes at a latency somewhat above what any strategy reaches
        full = relaxation(lengths, list(schemes), gpus, t, long=LONG, group_ratio=GROUP_RATIO)
        upper_rank = 1.25 * max(full.floor(), full.volume())
    else:
        upper_rank = upper
    short = _shortlist(lengths, schemes, gpus, np.asarray(propagation_budget_s(t, upper_rank)), prefer)
    rel = relaxation(lengths, [schemes[k] for k in short], gpus, t[short], long=LONG, group_ratio=GROUP_RATIO,
                     level_ratio=LEVEL_RATIO)
    target = None if upper is None else upper * (1 - SKIP_RTOL)
    lp = _lp_least(rel, target, hint)
    if lp is None:
        return [], None
    # the MILP, finer (more sequences whole), from the LP's latency up: on the schemes the LP uses, and for a small
    # strategy on the whole shortlist when those reach no aim (the LP's vertex is one of many, and may use too few)
    steps = [lp.hi * (1 + s) for s in MIP_STEPS]
    if target is not None:
        steps = [X for X in steps if X < target] + [target]
    small = float(lp.best.sum()) <= NEAR_PIPELINES
    support = [short[int(rel.keep[k])] for k in np.flatnonzero(lp.best > 1e-6)]
    out: list[dict[int, int]] = []
    for used in [support, [short[int(k)] for k in rel.keep]][:2 if small else 1]:
        out = _integral(lengths, schemes, gpus, t, used, steps, small)
        if out:
            break
    return out, lp


def _integral(lengths: np.ndarray, schemes: Sequence[Scheme], gpus: int, t: np.ndarray, used: list[int],
              steps: list[float], small: bool) -> list[dict[int, int]]:
    """The MILP's strategies on the schemes `used`: its first point over `steps`, then the fewest-GPU ones a
    SLACK above that latency (NEAR_SLACK while small)."""
    fine = relaxation(lengths, [schemes[k] for k in used], gpus, t[used], long=MIP_LONG, group_ratio=MIP_GROUP_RATIO,
                      level_ratio=MIP_LEVEL_RATIO, prune=False)
    found = ((X, probe(fine, X, max_nodes=MAX_NODES)) for X in steps)
    hit = next(((X, n) for X, n in found if n is not None), None)
    if hit is None:
        return []
    hi, first = hit
    out: list[dict[int, int]] = []
    slacks = NEAR_SLACK if small and first.sum() <= NEAR_PIPELINES else SLACK
    for n in (first, *(probe(fine, hi * (1 + slack), fewest_gpus=True, gap=FEWEST_GAP,
                                                    max_nodes=MAX_NODES) for slack in slacks)):
        if n is None:
            continue
        made = {used[int(fine.keep[k])]: int(v) for k, v in enumerate(n) if v > 0}
        counts = _fill(made, schemes, gpus, _narrowest(schemes, made) + _narrowest(schemes, range(len(schemes))))
        assert counts is not None  # the pool ends with every scheme
        if counts not in out:
            out.append(counts)
    return out


def neighbors(counts: dict[int, int], schemes: Sequence[Scheme], gpus: int) -> list[dict[int, int]]:
    """The strategies one pipeline away from `counts`: per scheme, one pipeline fewer, its GPUs refilled with the
    narrowest other scheme the strategy uses or the narrowest at all, or one more, its GPUs taken from the
    narrowest pipelines. The MILP's strategies are the fewest GPUs at a latency of the relaxation, which prices
    the trade between room for the long sequences and throughput for the short ones only approximately; one
    pipeline either way is the step it rounds over."""
    out: list[dict[int, int]] = []
    narrow = _narrowest(schemes, range(len(schemes)))
    for k in sorted(counts):
        others = [j for j in narrow if j != k]
        for pool in ([j for j in others if j in counts], others):
            c = _fill({**counts, k: counts[k] - 1}, schemes, gpus, pool)
            if c is not None and c not in out:
                out.append(c)
        more = {**counts, k: counts[k] + 1}
        need = sum(schemes[j].gpus * n for j, n in more.items()) - gpus
        for j in others:  # GPUs from the narrowest pipelines
            while need > 0 and more.get(j, 0) > 0:
                more[j] -= 1
                need -= schemes[j].gpus
        if need <= 0:
            c = _fill(more, schemes, gpus, [j for j in others if j in counts])
            if c is not None and c not in out:
                out.append(c)
    return [c for c in out if c != counts]


def specs_of(counts: dict[int, int], schemes: Sequence[Scheme]) -> list[PipelineSpec]:
    """Pipelines widest first (the order proposals use), ranks not yet placed."""
    keys = sorted(counts, key=lambda k: (-schemes[k].gpus, schemes[k].key))
    return [PipelineSpec(tp=schemes[k].tp, pp=schemes[k].pp, cp=schemes[k].cp, recompute=schemes[k].recompute)
            for k in keys for _ in range(counts[k])]


NAME = "batch:"  # synthesized strategies are named batch:0, batch:1, ... in a plan and its summary
