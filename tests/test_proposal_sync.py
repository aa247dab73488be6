"""The proposal under the end-to-end objective: the interval DP and the relaxation against exhaustive search
with each scheme's sync term, and the propagation objective reproducing the sync-free proposal exactly."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from test_proposal import cells_of, interval_latency, interval_terms, partitions, small_instance

from hydraplan.core.cluster import Cluster
from hydraplan.solve.proposal import build_cells, propose, round_relaxed, solve_integer, solve_relaxed
from hydraplan.store.datasets import load_dataset
from hydraplan.store.fileio import model_json
from hydraplan.store.profiles import load_profile


def f(t: float, p: float) -> float:
    """docs/formats.md: propagation + exposed pull/push of a busy pipeline, written out independently."""
    return p + max(0.0, t - p / 3) + max(0.0, t - 2 * p / 3)


def with_transfer(seed: int, max_cells: int = 6):
    """A small instance plus a per-scheme transfer on the scale of its latencies, larger for fewer tp*pp."""
    schemes, lengths, L, N = small_instance(seed, max_cells)
    rng = np.random.default_rng(1000 + seed)
    scale = float(np.mean([interval_latency(s, lengths, 1) for s in schemes if s.max_len >= lengths.max()] or [1.0]))
    transfer = np.array([scale * float(rng.uniform(0.05, 0.6)) / (s.tp * s.pp) for s in schemes])
    return schemes, lengths, L, N, transfer


def brute_integer_e2e(seqs, his, schemes, transfer, N) -> float:
    best = np.inf
    for parts in partitions(len(seqs)):
        options = []
        for i, j in parts:
            batch = np.concatenate(seqs[i:j])
            options.append([(s.gpus * d, f(transfer[k], interval_latency(s, batch, d)))
                            for k, s in enumerate(schemes) if s.max_len >= his[j - 1]
                            for d in range(1, N // s.gpus + 1)])

        def walk(n: int, budget: int, worst: float) -> float:
            if n == len(options):
                return worst
            return min((walk(n + 1, budget - g, max(worst, lat)) for g, lat in options[n] if g <= budget),
                       default=np.inf)

        best = min(best, walk(0, N, 0.0))
    return best


def brute_relaxed_e2e(seqs, his, schemes, transfer, N) -> float:
    """Fractional d per interval: the smallest tau with f_k(latency) <= tau for every interval within N GPUs,
    by bisection on tau directly in f (each interval takes the fewest fractional pipelines meeting it)."""
    best = np.inf
    for parts in partitions(len(seqs)):
        for ks in itertools.product(range(len(schemes)), repeat=len(parts)):
            terms = []
            for (i, j), k in zip(parts, ks):
                if schemes[k].max_len < his[j - 1]:
                    break
                W, B, F = interval_terms(schemes[k], np.concatenate(seqs[i:j]))
                terms.append((schemes[k].gpus, W, B, F, transfer[k]))
            else:
                def gpus_for(tau: float) -> float:
                    total = 0.0
                    for g, W, B, F, t in terms:
                        # largest propagation p with f(t, p) <= tau, by bisection on f itself
                        if f(t, max(B, F) * (1 + 1e-15) + 1e-300) > tau:
                            return np.inf
                        lo, hi = max(B, F), max(B, F) + tau + 1.0
                        for _ in range(70):
                            mid = 0.5 * (lo + hi)
                            lo, hi = (mid, hi) if f(t, mid) <= tau else (lo, mid)
                        if lo <= B:
                            return np.inf
                        total += g * W / (lo - B)
                    return total

                lo = 0.0
                hi = max(f(t, max(B, F)) for _, _, B, F, t in terms) + sum(g * W for g, W, *_ in terms) / N + 1.0
                for _ in range(60):
                    mid = 0.5 * (lo + hi)
                    lo, hi = (lo, mid) if gpus_for(mid) <= N else (mid, hi)
                best = min(best, hi)
    return best


@pytest.mark.parametrize("seed", range(16))
def test_integer_dp_with_sync_equals_exhaustive_search(seed):
    schemes, lengths, L, N, transfer = with_transfer(seed)
    seqs, his = cells_of(lengths, L)
    values, counts = np.unique(np.minimum(lengths, L), return_counts=True)
    cells = build_cells(schemes, values, counts, L, float(np.minimum(lengths, L).sum()), transfer=transfer)
    sol = solve_integer(cells, N, rel_tol=1e-13)
    want = brute_integer_e2e(seqs, his, schemes, transfer, N)
    assert sol.latency == pytest.approx(want, rel=1e-9)
    got = max(f(transfer[k], interval_latency(schemes[k], np.concatenate(seqs[i:j]), d)) for i, j, k, d in sol.intervals)
    assert got == pytest.approx(sol.latency, rel=1e-12)
    assert sum(schemes[k].gpus * d for _, _, k, d in sol.intervals) <= N


def test_sync_changes_the_optimum_in_some_instance():
    """The cases above are not all ones where sync leaves the propagation optimum optimal."""
    differs = 0
    for seed in range(16):
        schemes, lengths, L, N, transfer = with_transfer(seed)
        values, counts = np.unique(np.minimum(lengths, L), return_counts=True)
        tokens = float(np.minimum(lengths, L).sum())
        e2e = solve_integer(build_cells(schemes, values, counts, L, tokens, transfer=transfer), N, rel_tol=1e-13)
        prop = solve_integer(build_cells(schemes, values, counts, L, tokens), N, rel_tol=1e-13)
        differs += e2e.intervals != prop.intervals
    assert differs >= 2


@pytest.mark.parametrize("seed", range(6))
def test_relaxation_with_sync_equals_best_fractional_assignment(seed):
    schemes, lengths, L, N, transfer = with_transfer(100 + seed, max_cells=4)
    seqs, his = cells_of(lengths, L)
    values, counts = np.unique(np.minimum(lengths, L), return_counts=True)
    cells = build_cells(schemes, values, counts, L, float(np.minimum(lengths, L).sum()), transfer=transfer)
    relaxed = solve_relaxed(cells, N, rel_tol=1e-12)
    for j in range(len(his)):
        want = brute_relaxed_e2e(seqs[: j + 1], his[: j + 1], schemes, transfer, N)
        assert relaxed.latency[j] == pytest.approx(want, rel=1e-7)
        r = round_relaxed(cells, relaxed, j, N)
        if r is not None:  # rounding is never better than the relaxation, and fits N GPUs
            assert r.latency >= relaxed.latency[j] * (1 - 1e-6)
            assert sum(schemes[k].gpus * d for k, d in r.counts) <= N
    assert relaxed.latency[-1] <= solve_integer(cells, N, rel_tol=1e-13).latency * (1 + 1e-9)


def test_propagation_objective_is_the_proposal_without_a_sync_model():
    """`--objective propagation` is today's proposal: identical to the same profile stripped of its sync model."""
    prof = load_profile("h100-llama2-7b")
    bare = prof.model_copy(update={"network": None, "model": prof.model.model_copy(update={"params": None})})
    ds = load_dataset("builtin:wikipedia", 16384)
    a = propose(Cluster.of(prof, 32, "propagation"), ds, 16384)
    b = propose(Cluster.of(bare, 32), ds, 16384)
    assert model_json(a) == model_json(b)
    e2e = propose(Cluster.of(prof, 32), ds, 16384)
    assert model_json(e2e) != model_json(a)  # the default objective sees the sync term
