"""The any-strategy lower bound: no plan on N GPUs, whatever its strategy, runs a batch faster than this.

The least X at which the relaxation of solve/relaxation.py is feasible, found by bisection (feasibility is
monotone: every budget grows with X): first on its LP relaxation, fast and already a valid floor, then on the
MILP from there. A probe the MILP leaves open at its node or time limit counts as feasible, which can only
lower the bound, never make it invalid. With a given strategy's pipeline counts as upper limits, one LP of the
same relaxation proves every plan of that strategy slower than X when it is infeasible: the engine prunes
candidates with it before their dispatch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.core.schema import Scheme
from hydraplan.core.sync import charges
from hydraplan.solve.relaxation import probe, relaxation

REL_TOL = 1e-3  # bisection stops when the bracket is this tight (relative)
MAX_NODES = 500  # branch-and-bound nodes per MILP probe (deterministic); an open probe counts as feasible


@dataclass(frozen=True)
class BoundResult:
    """The bound and the integer pipeline counts of a feasible MILP solution at (just above) it."""

    latency_s: float  # least feasible X within rel_tol: a lower bound on every plan's time
    pipelines: dict[int, int]  # scheme index (into the schemes passed) -> pipelines n_P at `feasible_s`
    feasible_s: float  # the X the pipeline counts were found for (>= latency_s, within rel_tol)
    probes: int  # LPs and MILPs solved


@dataclass(frozen=True)
class Bisection:
    lo: float  # proven infeasible, or the floor the search started from
    hi: float  # feasible
    best: np.ndarray  # the probe's answer at hi
    probes: int


def bisect(feasible: Callable[[float], np.ndarray | None], lo: float, upper: float | None, rel_tol: float,
           at_upper: np.ndarray | None = None, lo_infeasible: bool = False) -> Bisection:
    """The least X (within rel_tol) at which the monotone `feasible` answers (not None), above `lo`, a floor
    at most the least feasible X (when `lo` itself is feasible, it is the answer) or, with `lo_infeasible`, known
    to be infeasible; `upper`, a latency believed feasible, only narrows the first bracket (`at_upper`: the
    answer there, when the caller has it)."""
    probes = 0
    best = None
    hi = upper if upper is not None and upper >= lo else None
    if hi is not None:
        best, probes = (feasible(hi), 1) if at_upper is None else (at_upper, 0)
        if best is None:
            lo, hi = hi, None
    if hi is None:  # grow the bracket until feasible
        step = max(lo * 0.05, 1e-12)
        while best is None:
            hi = lo + step
            best = feasible(hi)
            probes += 1
            if best is None:
                lo, step = hi, step * 2
    elif not lo_infeasible:
        found = feasible(lo)
        probes += 1
        if found is not None:
            hi, best = lo, found
    assert hi is not None and best is not None
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        found = feasible(mid)
        probes += 1
        if found is None:
            lo = mid
        else:
            hi, best = mid, found
    return Bisection(lo, hi, best, probes)


def any_strategy_bound(lengths: np.ndarray | Sequence[int], schemes: Sequence[Scheme], gpus: int, *,
                       transfer: np.ndarray | Sequence[float] | None = None, upper: float | None = None,
                       upper_reached: bool = False, floor: float = 0.0, rel_tol: float = REL_TOL,
                       max_nodes: int | None = MAX_NODES, time_limit_s: float | None = None) -> BoundResult:
    """The least latency X (within rel_tol) at which the relaxation is feasible: a lower bound on the propagation
    time (transfer None) or end-to-end time (transfer_s per scheme) of every plan of the batch on `gpus` GPUs.

    `schemes` are the profile's schemes with MaxLen for this N (core.cluster.for_gpus); `upper`, a latency believed
    feasible, only narrows the first bracket. With `upper_reached` it is a latency a plan of the batch reaches,
    feasible without a probe (every plan is a point of the relaxation); the probe there is the costliest of the
    MILP's (a feasible point, found by search), and without it `pipelines` stays empty when no X below `upper`
    is feasible. `max_nodes` (None: no limit) trades tightness for time, never validity; so does `time_limit_s`
    per probe (wall time: not deterministic). `floor`: a lower bound known already (another bound's answer); the
    bisections start there, so the answer is never below it (a MILP probe the node limit leaves open counts as
    feasible and may otherwise stop this one lower)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return BoundResult(0.0, {}, 0.0, 0)
    rel = relaxation(lengths, list(schemes), gpus, charges(transfer, len(schemes)))
    floor = max(rel.floor(), rel.volume(), floor)
    if not np.isfinite(floor):
        raise ValueError(f"any-strategy bound: a sequence of length {rel.top} fits no scheme")
    reached = np.zeros(rel.keep.size) if upper_reached and upper is not None else None
    lp = bisect(lambda X: probe(rel, X, relax=True, vertex=False), floor, upper, rel_tol, reached)
    mip = bisect(lambda X: probe(rel, X, max_nodes=max_nodes, time_limit_s=time_limit_s, unknown_feasible=True),
                 lp.lo, upper, rel_tol, reached)
    counts = {int(rel.keep[k]): int(n) for k, n in enumerate(mip.best) if n > 0}
    return BoundResult(latency_s=float(mip.lo), pipelines=counts, feasible_s=float(mip.hi),
                       probes=lp.probes + mip.probes)


def strategy_meets(lengths: np.ndarray, schemes: Sequence[Scheme], counts: np.ndarray, X: float,
                   transfer: np.ndarray | None = None) -> bool:
    """Whether the relaxation, for the given strategy (counts[k] pipelines of schemes[k]: at most that many
    busy), is feasible at latency X (end to end with `transfer` per scheme). False proves every plan of the
    strategy slower than X. One LP (pipeline counts continuous, which only loosens it)."""
    counts = np.asarray(counts, dtype=np.float64)
    gpus = int(sum(s.gpus * n for s, n in zip(schemes, counts, strict=True)))
    rel = relaxation(np.asarray(lengths, dtype=np.int64), list(schemes), gpus, transfer, prune=False)
    return probe(rel, X, most=counts[rel.keep], relax=True) is not None
