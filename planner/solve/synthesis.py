"""Per-batch strategy synthesis: integer strategies shaped by the any-strategy MILP (solve/bound.py) for
the batch at hand, which the engine dispatches and packs next to the proposed candidates.

LNK pulls every parameter every iteration anyway, so any iteration may run any strategy: the candidate
list only saves solver time. The bound's MILP already picks integer pipeline counts n_P that can carry the
batch within a latency X; a strategy with those pipelines (leftover GPUs given to the narrowest scheme it
uses) is the natural candidate for this batch. To keep it fast the MILP runs on grouped sequences: the
longest SINGLE sequences alone (where integrality bites), the rest in length groups GROUP_RATIO wide,
costed at their mean; the bisection stops at SYNTH_REL_TOL, starting from the best candidate's estimate.
The pipeline counts at the least feasible X and at a few slacker X (SLACK: more room for the integral
dispatch) give the strategies, deduplicated.

The engine (engine/synthesized.py) places them reusing rank sets already in use and solves them like
candidates.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from hydraplan.core.schema import PipelineSpec, Scheme
from hydraplan.solve.bound import _instance, _probe, least_feasible

SINGLE = 12  # longest sequences that are items of their own
GROUP_RATIO = 1.25  # the other sequences are grouped by length in geometric bins this wide
SYNTH_REL_TOL = 0.01
SLACK = (0.0, 0.03, 0.08)
MAX_NODES = 50  # branch-and-bound nodes per MILP (deterministic); the rare hard probe counts as infeasible
TOP = 2  # per group of sequences, schemes kept by each of two rankings


def _groups(lengths: np.ndarray) -> np.ndarray:
    """A group label per sequence: the SINGLE longest alone, the rest by geometric length bin."""
    order = np.argsort(-lengths, kind="stable")
    label = np.floor(np.log(np.maximum(lengths, 1)) / np.log(GROUP_RATIO)).astype(np.int64)
    label[order[:SINGLE]] = -1 - np.arange(min(SINGLE, len(lengths)))
    return label


def _fill(counts: dict[int, int], schemes: Sequence[Scheme], gpus: int) -> dict[int, int]:
    """Leftover GPUs become pipelines of the narrowest scheme the strategy uses, then of the narrowest scheme
    at all: an idle pipeline costs nothing, and dispatch moves short sequences to it."""
    counts = dict(counts)
    left = gpus - sum(schemes[k].gpus * n for k, n in counts.items())
    for pool in (sorted(counts), range(len(schemes))):
        fits = [k for k in pool if schemes[k].gpus <= left]
        if not fits:
            continue
        k = min(fits, key=lambda k: (schemes[k].gpus, k))
        counts[k] = counts.get(k, 0) + left // schemes[k].gpus
        left -= schemes[k].gpus * (left // schemes[k].gpus)
    return counts


def _shortlist(lengths: np.ndarray, schemes: Sequence[Scheme], gpus: int, transfer: np.ndarray,
               prefer: Iterable[int]) -> list[int]:
    """The schemes worth a variable: `prefer` (the candidates'), and per group of sequences the TOP cheapest in
    GPU-seconds and the TOP fastest alone (pp * T(l) + 2 t), among those that hold it."""
    label = _groups(lengths)
    _, first = np.unique(label, return_index=True)
    l = lengths[first].astype(np.float64)[:, None]
    ok = (l <= np.array([s.max_len for s in schemes])) & (np.array([s.gpus for s in schemes]) <= gpus)
    T = np.array([[s.time.a, s.time.b, s.time.c, s.gpus, s.pp] for s in schemes]).T
    t_l = (T[0] * l + T[1]) * l + T[2]
    keep = set(prefer)
    for cost in (T[3] * t_l, T[4] * t_l + 2 * transfer):
        ranked = np.argsort(np.where(ok, cost, np.inf), axis=1, kind="stable")[:, :TOP]
        keep.update(int(k) for k in ranked[np.take_along_axis(ok, ranked, 1)])
    return sorted(keep)


def synthesize(lengths: np.ndarray, schemes: Sequence[Scheme], gpus: int, *, upper: float | None = None,
               transfer: np.ndarray | Sequence[float] | None = None, prefer: Iterable[int] = ()) -> list[dict[int, int]]:
    """Strategies for this batch as {scheme index: pipelines}, best-shaped first. `transfer` (seconds per
    scheme, core/sync.py) shapes them for the end-to-end estimate; `upper` is a latency some plan reaches;
    `prefer` lists schemes to offer the MILP besides the shortlist (the candidates')."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return []
    t = np.zeros(len(schemes)) if transfer is None else np.asarray(transfer, dtype=np.float64)
    short = _shortlist(lengths, schemes, gpus, t, prefer)
    sub = [schemes[k] for k in short]
    inst = _instance(lengths, sub, gpus, t[short], group=_groups(lengths))
    _, hi, _, _ = least_feasible(inst, upper, SYNTH_REL_TOL, MAX_NODES)
    out: list[dict[int, int]] = []
    for slack in SLACK:
        n = _probe(inst, hi * (1 + slack), minimize=True, max_nodes=MAX_NODES)
        if n is None:
            continue
        counts = _fill({short[int(inst.keep[k])]: int(v) for k, v in enumerate(n) if v > 0}, schemes, gpus)
        if counts not in out:
            out.append(counts)
    return out


def specs_of(counts: dict[int, int], schemes: Sequence[Scheme]) -> list[PipelineSpec]:
    """Pipelines widest first (the order proposals use), ranks not yet placed."""
    keys = sorted(counts, key=lambda k: (-schemes[k].gpus, schemes[k].key))
    return [PipelineSpec(tp=schemes[k].tp, pp=schemes[k].pp, cp=schemes[k].cp, recompute=schemes[k].recompute)
            for k in keys for _ in range(counts[k])]


SKIP_RTOL = 0.01  # no synthesis when the best candidate is already this close to the cheap any-strategy floor
NAME = "batch:"  # synthesized strategies are named batch:0, batch:1, ... in a plan and its summary


def worth_trying(lengths: np.ndarray, schemes: Sequence[Scheme], gpus: int, best_s: float,
                 transfer: np.ndarray | None = None) -> bool:
    """Whether a strategy made for the batch could beat `best_s` by more than SKIP_RTOL: the MILP's closed-form
    floor (a sequence alone, the GPU-seconds over N) already proves it cannot on some batches."""
    inst = _instance(np.asarray(lengths, dtype=np.int64), schemes, gpus, transfer)
    return best_s > (1 + SKIP_RTOL) * max(inst.floor(), inst.volume())  # volume: a valid floor end to end too
