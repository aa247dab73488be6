"""The proposal's entry: `propose` collects the rounded relaxed optimum for every L', the integer optimum for L
and the homogeneous fallback, keeps the most useful, and places their ranks."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hydraplan.core.cluster import Cluster
from hydraplan.core.errors import UserError
from hydraplan.core.schema import Candidate, PipelineSpec, Strategies, scheme_label
from hydraplan.solve.placement import place_ranks
from hydraplan.solve.proposal.cells import LENGTH_STEP, CellCosts, best_homogeneous, build_cells
from hydraplan.solve.proposal.integer import solve_integer
from hydraplan.solve.proposal.relaxed import solve_relaxed
from hydraplan.solve.proposal.rounding import round_relaxed

TOKENS_PER_GPU = 4096
# Every iteration bounds every candidate before solving the promising ones (engine/planner.py), O(sequences)
# work per candidate: by default candidates are kept while candidates x expected sequences per iteration stays
# within this (every candidate up to a few thousand sequences per iteration, the most useful ones beyond)
CANDIDATE_SEQUENCES = 1_000_000


class _HasHistogram(Protocol):
    @property
    def name(self) -> str: ...

    def histogram(self) -> tuple[np.ndarray, np.ndarray]: ...


def _histogram(data: np.ndarray | _HasHistogram, context_len: int) -> tuple[np.ndarray, np.ndarray, str | None]:
    if isinstance(data, (np.ndarray, list, tuple)):
        values, counts = np.unique(np.asarray(data, dtype=np.int64), return_counts=True)
        name = None
    else:
        values, counts = data.histogram()
        name = getattr(data, "name", None)
    values = np.minimum(np.asarray(values, dtype=np.int64), context_len)
    keep = (values > 0) & (np.asarray(counts) > 0)
    if not keep.any():
        raise UserError(f"dataset {name or '(lengths)'}: no sequence of positive length")
    return values[keep], np.asarray(counts, dtype=np.float64)[keep], name


@dataclass
class _Entry:
    counts: tuple[tuple[int, int], ...]
    latency: float
    tokens: float
    lo: int
    hi: int
    sources: list[str]
    cells: set[int]
    p_longest: float = 0.0


class _Entries:
    """The distinct strategies found (by pipeline counts), each with the L' range it is optimal for and the
    latency and tokens of the longest L' among them."""

    def __init__(self, cells: CellCosts) -> None:
        self.cells = cells
        self.tokens_cum = np.cumsum(cells.tokens)
        self.by_counts: dict[tuple[tuple[int, int], ...], _Entry] = {}

    def add(self, counts: tuple[tuple[int, int], ...], latency: float, j: int, source: str) -> None:
        hi = self.cells.hi
        lo = 1 if j == 0 else int(hi[j - 1]) + 1
        e = self.by_counts.get(counts)
        if e is None:
            self.by_counts[counts] = _Entry(counts, latency, float(self.tokens_cum[j]), lo, int(hi[j]), [source], {j})
            return
        e.cells.add(j)
        if source not in e.sources:
            e.sources.append(source)
        e.lo = min(e.lo, lo)
        if hi[j] >= e.hi:
            e.hi, e.latency, e.tokens = int(hi[j]), latency, float(self.tokens_cum[j])


def _check_args(cluster: Cluster, context_len: int, max_candidates: int | None, tokens_per_iter: int | None) -> None:
    longest = max(cluster.schemes, key=lambda s: (s.max_len, -s.gpus))
    if context_len > longest.max_len:
        raise UserError(f"context_len {context_len}: no scheme of profile {cluster.name} within {cluster.gpus} GPUs holds "
                        f"it; the longest supported length is {longest.max_len} ({longest.label})", "context_len")
    if context_len < 1:
        raise UserError(f"context_len must be positive (got {context_len})", "context_len")
    if max_candidates is not None and max_candidates < 0:
        raise UserError(f"max_candidates must be 0 (keep all) or a positive count (got {max_candidates})", "max_candidates")
    if tokens_per_iter is not None and tokens_per_iter < 1:
        raise UserError(f"tokens_per_iter must be positive (got {tokens_per_iter})", "tokens_per_iter")


def _solve(cells: CellCosts, gpus: int) -> _Entries:
    """Every strategy the proposal offers: the rounded relaxed optimum per L', the integer optimum for L, and
    the homogeneous fallback."""
    entries = _Entries(cells)
    relaxed = solve_relaxed(cells, gpus)
    r = None
    for j in range(cells.n_cells):
        r = round_relaxed(cells, relaxed, j, gpus)
        if r is not None:
            entries.add(r.counts, r.latency, j, "relaxed-dp")
    M = cells.n_cells
    homo = best_homogeneous(cells, gpus)
    assert homo is not None  # context_len <= the longest scheme's MaxLen was checked
    # bisection bracket: the relaxed optimum below; above, the rounded one for L when the interval DP
    # reaches it (it usually does, and it is much tighter than the homogeneous latency), else homogeneous
    exact = None
    if r is not None and r.latency < homo[2]:
        exact = solve_integer(cells, gpus, lower=float(relaxed.latency[-1]), upper=r.latency, rel_tol=1e-3)
    exact = exact or solve_integer(cells, gpus, lower=float(relaxed.latency[-1]), upper=homo[2], rel_tol=1e-3)
    if exact is not None:
        entries.add(tuple(sorted(exact.pipelines().items())), exact.latency, M - 1, "integer-dp")
    entries.add(((homo[0], homo[1]),), homo[2], M - 1, "homogeneous")
    return entries


def _most_useful(entries: Iterable[_Entry], cells: CellCosts, max_candidates: int | None,
                 per_iteration: float) -> list[_Entry]:
    """The integer optimum and the homogeneous fallback, and the relaxed optima by p_longest up to
    max_candidates in all (0: every one; None: CANDIDATE_SEQUENCES / per_iteration), in L' order."""
    entries = list(entries)
    # P(an iteration's longest sequence falls in cell j), for a batch of the nominal size
    cdf = np.cumsum(cells.count) / cells.count.sum()
    p_top = np.diff(np.r_[0.0, cdf ** cells.count.sum()])
    for e in entries:
        e.p_longest = float(p_top[sorted(e.cells)].sum())
    kept = [e for e in entries if e.sources != ["relaxed-dp"]]
    rest = sorted((e for e in entries if e.sources == ["relaxed-dp"]), key=lambda e: (-e.p_longest, e.hi))
    if max_candidates is None:
        max_candidates = max(1, int(CANDIDATE_SEQUENCES / per_iteration))
    if max_candidates:
        rest = rest[: max(0, max_candidates - len(kept))]
    return sorted(kept + rest, key=lambda e: (e.hi, e.lo, e.latency, e.counts))


def _candidate(n: int, e: _Entry, cells: CellCosts, gpus: int, gpus_per_node: int) -> Candidate:
    """Candidate S{n}: its pipelines widest first, ranks placed."""
    specs = [spec for k, d in sorted(e.counts, key=lambda kd: (-cells.schemes[kd[0]].gpus, cells.schemes[kd[0]].key))
             for spec in [PipelineSpec(tp=cells.schemes[k].tp, pp=cells.schemes[k].pp, cp=cells.schemes[k].cp,
                                     recompute=cells.schemes[k].recompute)] * d]
    return Candidate(
        name=f"S{n}", pipelines=place_ranks(specs, gpus, gpus_per_node),
        max_len=max(cells.schemes[k].max_len for k, _ in e.counts),
        expected_s_per_token=e.latency / e.tokens, optimal_for=(e.lo, e.hi),
        sources=e.sources, kind="homogeneous" if len(e.counts) == 1 else "heterogeneous",
        p_longest=round(e.p_longest, 6))


def propose(cluster: Cluster, lengths_or_dataset: np.ndarray | _HasHistogram, context_len: int,
            gpus_per_node: int | None = None, tokens_per_iter: int | None = None,
            max_candidates: int | None = None) -> Strategies:
    """Candidate strategies for the cluster's N GPUs: the rounded relaxed optimum for every L' <= context_len,
    the integer optimum of Eq. (4) for L, and the best homogeneous strategy; ranks placed. Latencies are in the
    cluster's objective: end to end (the profile's sync model) or propagation.

    Every candidate is bounded on every iteration, so when the union over L' is larger than max_candidates
    (0: keep all; None: as many as CANDIDATE_SEQUENCES allows for the nominal batch) only the relaxed optima
    most likely to be needed are kept: those whose L' range most often holds an iteration's longest sequence
    (p_longest, for a nominal batch of independently drawn sequences). The integer optimum and the
    homogeneous fallback are always kept."""
    gpus = cluster.gpus
    _check_args(cluster, context_len, max_candidates, tokens_per_iter)
    tokens_per_iter = tokens_per_iter or TOKENS_PER_GPU * gpus
    values, counts, name = _histogram(lengths_or_dataset, context_len)
    transfer = cluster.scheme_charges_s
    cells = build_cells(list(cluster.schemes), values, counts, context_len, tokens_per_iter, transfer=transfer)
    entries = _solve(cells, gpus)
    per_iteration = tokens_per_iter * counts.sum() / float((values * counts).sum())
    ordered = _most_useful(entries.by_counts.values(), cells, max_candidates, per_iteration)
    gpn = gpus_per_node or cluster.gpus_per_node
    return Strategies(profile=cluster.name, gpus=gpus, context_len=context_len,
                      candidates=[_candidate(n, e, cells, gpus, gpn) for n, e in enumerate(ordered)],
                      dataset=name, tokens_per_iter=int(tokens_per_iter), length_step=LENGTH_STEP,
                      length_cells=int(cells.n_cells), gpus_per_node=gpn, proposed=len(entries.by_counts))


def strategy_label(candidate: Candidate) -> str:
    """'2x<8,1,1> + 4x<2,2,1>' in pipeline order."""
    groups: dict[tuple[int, int, int, str], int] = {}
    for p in candidate.pipelines:
        groups[p.key] = groups.get(p.key, 0) + 1
    return " + ".join(f"{n}x{scheme_label(k)}" for k, n in groups.items())
