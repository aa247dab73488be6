"""Strategy proposal: the DP against exhaustive search, the relaxation against the best fractional
assignment, rounding within N GPUs, candidates, errors and the CLI."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from helpers import hp

from hydraplan.core.cluster import Cluster, for_gpus
from hydraplan.core.cost import seq_cost
from hydraplan.core.errors import UserError
from hydraplan.schema import GPUInfo, ModelInfo, Profile, Scheme, Strategies, TimeCoeffs
from hydraplan.solve.proposal import build_cells, candidates, propose, round_relaxed, solve_integer, solve_relaxed

STEP = 128


def make_profile(schemes: list[Scheme], gpus_per_node: int = 8) -> Profile:
    return Profile(name="test", gpu=GPUInfo(name="X", memory_gib=80, gpus_per_node=gpus_per_node),
                   model=ModelInfo(name="m", layers=32, hidden=4096), schemes=schemes)


def scheme(tp: int, pp: int, cp: int, max_len: int, util: int, a: float, b: float, c: float) -> Scheme:
    return Scheme(tp=tp, pp=pp, cp=cp, max_len=max_len, util_len=util, time=TimeCoeffs(a=a, b=b, c=c))


# ------------------------------------------------------------------ independent model of the docstring
def cells_of(lengths: np.ndarray, L: int) -> tuple[list[np.ndarray], list[int]]:
    """Sequences per non-empty 128-token bin (the last bin ends at L) and each cell's upper end."""
    lengths = np.minimum(lengths, L)
    bins = np.minimum(-(-lengths // STEP) * STEP, L)
    his = sorted(set(bins.tolist()))
    seqs = [lengths[bins == h] for h in his]
    his[-1] = L
    return seqs, his


def interval_terms(s: Scheme, seqs: np.ndarray) -> tuple[float, float, float]:
    """(W, B, F) of the documented model: UtilLen-packed micro-batches, bubble of the longest one, and the
    floor of the pipeline that runs the longest sequence (a sequence is never split across pipelines)."""
    u = s.max_len if s.pp == 1 else min(s.util_len, s.max_len)  # pp=1: the packer fills to MaxLen
    work = seq_cost(s, seqs).sum() + s.time.c * np.sum(np.minimum(seqs, u) / u)
    lmax = float(seqs.max())
    m = max(lmax, u)
    bubble = (s.pp - 1) * (s.time.a * lmax * m + s.time.b * m + s.time.c)
    floor = s.pp * (s.time.a * lmax * lmax + s.time.b * lmax + s.time.c)
    return float(work), float(bubble), float(floor)


def interval_latency(s: Scheme, seqs: np.ndarray, d: float) -> float:
    """max(W / d + B, F)."""
    work, bubble, floor = interval_terms(s, seqs)
    return max(work / d + bubble, floor)


def partitions(m: int):
    for cuts in itertools.product([False, True], repeat=m - 1):
        bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [m]
        yield list(zip(bounds[:-1], bounds[1:]))


def brute_integer(seqs: list[np.ndarray], his: list[int], schemes: list[Scheme], N: int) -> float:
    """Every partition into intervals, every (scheme, d) per interval with total GPUs <= N."""
    best = np.inf
    for parts in partitions(len(seqs)):
        options = []
        for i, j in parts:
            batch = np.concatenate(seqs[i:j])
            options.append([(s.gpus * d, interval_latency(s, batch, d)) for s in schemes if s.max_len >= his[j - 1]
                            for d in range(1, N // s.gpus + 1)])

        def walk(n: int, budget: int, worst: float) -> float:
            if n == len(options):
                return worst
            return min((walk(n + 1, budget - g, max(worst, lat)) for g, lat in options[n] if g <= budget),
                       default=np.inf)

        best = min(best, walk(0, N, 0.0))
    return best


def brute_relaxed(seqs: list[np.ndarray], his: list[int], schemes: list[Scheme], N: int) -> float:
    """Every partition and scheme per interval with fractional d: the smallest tau >= every F with
    sum g * W / (tau - B) <= N."""
    best = np.inf
    for parts in partitions(len(seqs)):
        for ks in itertools.product(range(len(schemes)), repeat=len(parts)):
            terms = []
            for (i, j), k in zip(parts, ks):
                s = schemes[k]
                if s.max_len < his[j - 1]:
                    break
                W, B, F = interval_terms(s, np.concatenate(seqs[i:j]))
                terms.append((s.gpus * W, B, F))
            else:
                A, B, F = np.array(terms).T
                lo = max(B.max(), F.max())
                hi = lo + A.sum() / N + 1.0
                for _ in range(200):
                    mid = 0.5 * (lo + hi)
                    lo, hi = (lo, mid) if (A / (mid - B)).sum() <= N else (mid, hi)
                best = min(best, hi)
    return best


POOL = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (4, 1, 1)]


def small_instance(seed: int, max_cells: int = 6):
    rng = np.random.default_rng(seed)
    L = STEP * max_cells
    keys = [POOL[i] for i in rng.choice(len(POOL), size=int(rng.integers(2, 4)), replace=False)]
    schemes = []
    for n, (tp, pp, cp) in enumerate(keys):
        g = tp * pp * cp
        # the scheme holding L is the least efficient one, so short sequences want another
        ml, slow = (L, float(rng.uniform(1.2, 3))) if n == 0 else (int(rng.integers(1, max_cells)) * STEP, 1.0)
        schemes.append(scheme(tp, pp, cp, ml, int(rng.integers(64, 600)), a=slow * float(rng.uniform(1e-6, 1e-5)) / g,
                              b=slow * float(rng.uniform(1e-4, 1e-3)) / g, c=float(rng.uniform(0, 0.02))))
    bins = rng.choice(max_cells, size=int(rng.integers(2, max_cells + 1)), replace=False)
    # long-tailed: short bins hold many sequences, long ones few
    lengths = np.concatenate([STEP * b + rng.integers(1, STEP + 1, size=int(rng.integers(1, 2 + 12 // (1 + b))))
                              for b in bins])
    N = int(rng.integers(max(s.gpus for s in schemes), 9))
    return schemes, lengths.astype(np.int64), L, N


def cells_for(schemes, lengths, L):
    values, counts = np.unique(np.minimum(lengths, L), return_counts=True)
    # tokens_per_iter = the data's own tokens: the nominal batch is the data itself
    return build_cells(schemes, values, counts, L, float(np.minimum(lengths, L).sum()))


# -------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("seed", range(20))
def test_integer_dp_equals_exhaustive_search(seed):
    schemes, lengths, L, N = small_instance(seed)
    seqs, his = cells_of(lengths, L)
    cells = cells_for(schemes, lengths, L)
    assert cells.hi.tolist() == his
    sol = solve_integer(cells, N, rel_tol=1e-13)
    want = brute_integer(seqs, his, schemes, N)
    assert sol.latency == pytest.approx(want, rel=1e-9)
    # the returned intervals are a real strategy: they tile the cells, fit N GPUs, hold their lengths,
    # and reach the stated latency under the independent model
    assert [iv[0] for iv in sol.intervals][0] == 0 and sol.intervals[-1][1] == len(his)
    assert all(a[1] == b[0] for a, b in zip(sol.intervals, sol.intervals[1:]))
    assert sum(schemes[k].gpus * d for _, _, k, d in sol.intervals) <= N
    assert all(schemes[k].max_len >= his[j - 1] for _, j, k, _ in sol.intervals)
    got = max(interval_latency(schemes[k], np.concatenate(seqs[i:j]), d) for i, j, k, d in sol.intervals)
    assert got == pytest.approx(sol.latency, rel=1e-12)


def tail_instance(seed: int):
    """Many short sequences and one of (nearly) the context length: the floor of the pipeline holding it
    decides which scheme takes the tail."""
    schemes, lengths, L, N = small_instance(200 + seed)
    rng = np.random.default_rng(seed)
    tail = [L - int(rng.integers(0, 64))]
    return schemes, np.concatenate([lengths, rng.integers(1, STEP, size=30), tail]).astype(np.int64), L, N


@pytest.mark.parametrize("seed", range(12))
def test_integer_dp_equals_exhaustive_search_with_a_long_tail(seed):
    schemes, lengths, L, N = tail_instance(seed)
    seqs, his = cells_of(lengths, L)
    sol = solve_integer(cells_for(schemes, lengths, L), N, rel_tol=1e-13)
    assert sol.latency == pytest.approx(brute_integer(seqs, his, schemes, N), rel=1e-9)
    # no interval finishes before its longest sequence has run alone on its pipeline
    for i, j, k, d in sol.intervals:
        s = schemes[k]
        lmax = float(np.concatenate(seqs[i:j]).max())
        assert sol.latency >= s.pp * float(seq_cost(s, np.array([lmax]))[0] + s.time.c) * (1 - 1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_relaxation_equals_best_fractional_assignment_for_every_prefix(seed):
    schemes, lengths, L, N = small_instance(100 + seed, max_cells=4)
    seqs, his = cells_of(lengths, L)
    cells = cells_for(schemes, lengths, L)
    relaxed = solve_relaxed(cells, N, rel_tol=1e-12)
    for j in range(len(his)):
        prefix_his = his[: j + 1]
        want = brute_relaxed(seqs[: j + 1], prefix_his, schemes, N)
        assert relaxed.latency[j] == pytest.approx(want, rel=1e-7)
    # a relaxation: never slower than the integer optimum
    assert relaxed.latency[-1] <= solve_integer(cells, N, rel_tol=1e-13).latency * (1 + 1e-9)


def wiki_like(seed: int, n: int = 4000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.maximum(1, rng.lognormal(6.5, 1.3, size=n)).astype(np.int64)


def mid_profile() -> Profile:
    """Shaped like the analytic H100 profiles: more GPUs per pipeline hold longer sequences, less efficiently."""
    out = []
    for tp, pp, cp in [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (4, 1, 1), (2, 2, 1), (2, 1, 2), (8, 1, 1), (4, 2, 1)]:
        g = tp * pp * cp
        eff = 1 + 0.08 * np.log2(tp) + 0.05 * np.log2(cp)
        out.append(scheme(tp, pp, cp, 4000 * tp * cp + 500 * pp, 2048, a=2e-9 * eff / g, b=1e-4 * eff / g,
                          c=0.01 / pp + 0.004 * np.log2(tp * cp + 1)))
    return make_profile(out)


@pytest.mark.parametrize("gpus", [8, 24, 64])
def test_rounding_fits_n_gpus_supports_l_and_is_no_better_than_the_relaxation(gpus):
    prof = for_gpus(mid_profile(), gpus)
    lengths = np.minimum(wiki_like(gpus), 30000)
    values, counts = np.unique(lengths, return_counts=True)
    cells = build_cells(list(prof.schemes), values, counts, 30000, 4096 * gpus)
    relaxed = solve_relaxed(cells, gpus)
    for j in range(cells.n_cells):
        r = round_relaxed(cells, relaxed, j, gpus)
        assert r is not None
        assert sum(cells.schemes[k].gpus * d for k, d in r.counts) <= gpus
        assert all(d >= 1 for _, d in r.counts)
        assert max(cells.schemes[k].max_len for k, _ in r.counts) >= cells.hi[j]
        assert r.latency >= relaxed.latency[j] * (1 - 1e-6)


def test_candidates_fit_support_their_range_and_include_the_best_homogeneous():
    prof = mid_profile()
    gpus, L = 32, 30000
    lengths = wiki_like(1)
    s = propose(Cluster.of(prof, gpus), lengths, L, max_candidates=0)
    view = {p.key: p for p in for_gpus(prof, gpus).schemes}
    assert [c.name for c in s.candidates] == [f"S{i}" for i in range(len(s.candidates))]
    for c in s.candidates:
        assert c.gpus <= gpus
        assert c.max_len == max(view[p.key].max_len for p in c.pipelines)
        assert c.max_len >= c.optimal_for[1] >= c.optimal_for[0] >= 1
        assert c.expected_s_per_token > 0
    assert any(c.kind == "heterogeneous" for c in s.candidates)
    homo = [c for c in s.candidates if "homogeneous" in c.sources]
    assert len(homo) == 1 and homo[0].max_len >= L and len({p.key for p in homo[0].pipelines}) == 1
    # it is the fastest single-scheme strategy under the documented model
    seqs = np.minimum(lengths, L)
    scale = 4096 * gpus / seqs.sum()

    def homo_time(sc: Scheme) -> float:
        d = gpus // sc.gpus
        u = sc.max_len if sc.pp == 1 else min(sc.util_len, sc.max_len)
        work = scale * (seq_cost(sc, seqs).sum() + sc.time.c * np.sum(np.minimum(seqs, u) / u))
        m = max(seqs.max(), u)
        floor = sc.pp * (sc.time.a * seqs.max() ** 2 + sc.time.b * seqs.max() + sc.time.c)
        return max(work / d + (sc.pp - 1) * (sc.time.a * seqs.max() * m + sc.time.b * m + sc.time.c), floor)

    times = {k: homo_time(sc) for k, sc in view.items() if sc.max_len >= L}
    best = min(times, key=times.get)
    assert {p.key for p in homo[0].pipelines} == {best}
    assert len(homo[0].pipelines) == gpus // view[best].gpus
    assert homo[0].expected_s_per_token * 4096 * gpus == pytest.approx(times[best], rel=1e-9)
    # the integer DP's optimum for L is never slower than the homogeneous fallback
    integer = next(c for c in s.candidates if "integer-dp" in c.sources)
    assert integer.expected_s_per_token <= homo[0].expected_s_per_token * (1 + 1e-9)


def test_by_default_candidates_are_kept_by_the_sequences_an_iteration_bounds(monkeypatch):
    """No --max-candidates: as many as CANDIDATE_SEQUENCES / (expected sequences per iteration), so every
    iteration's bounding work (O(sequences) per candidate) stays the same whatever the batch size."""
    prof, lengths = mid_profile(), wiki_like(2)
    full = propose(Cluster.of(prof, 32), lengths, 30000, max_candidates=0)
    per_iteration = 200_000 / np.minimum(lengths, 30000).mean()
    monkeypatch.setattr(candidates, "CANDIDATE_SEQUENCES", 3 * per_iteration + 1)  # room for three candidates
    assert propose(Cluster.of(prof, 32), lengths, 30000, tokens_per_iter=200_000) == \
        propose(Cluster.of(prof, 32), lengths, 30000, tokens_per_iter=200_000, max_candidates=3)
    monkeypatch.setattr(candidates, "CANDIDATE_SEQUENCES", 10**9)
    assert len(propose(Cluster.of(prof, 32), lengths, 30000).candidates) == len(full.candidates) > 3


def test_max_candidates_keeps_integer_and_homogeneous():
    prof, lengths = mid_profile(), wiki_like(2)
    full = propose(Cluster.of(prof, 32), lengths, 30000, max_candidates=0)
    few = propose(Cluster.of(prof, 32), lengths, 30000, max_candidates=3)
    assert len(full.candidates) > 3 >= len(few.candidates)
    assert {"integer-dp", "homogeneous"} <= {src for c in few.candidates for src in c.sources}
    assert full.proposed == few.proposed == len(full.candidates)


def test_propose_is_deterministic_and_ranks_are_placed():
    from hydraplan.store.fileio import model_json

    prof, lengths = mid_profile(), wiki_like(3)
    a = propose(Cluster.of(prof, 24), lengths, 30000, gpus_per_node=4)
    b = propose(Cluster.of(prof, 24), lengths, 30000, gpus_per_node=4)
    assert model_json(a) == model_json(b)
    for c in a.candidates:
        ranks = [r for p in c.pipelines for r in p.ranks]
        assert len(ranks) == len(set(ranks)) and all(0 <= r < 24 for r in ranks)
        for p in c.pipelines:
            if p.gpus <= 4:
                assert len({r // 4 for r in p.ranks}) == 1


def test_context_longer_than_any_scheme_names_the_longest_supported():
    prof = mid_profile()
    longest = max(s.max_len for s in for_gpus(prof, 8).schemes)
    with pytest.raises(UserError, match=f"longest supported length is {longest}"):
        propose(Cluster.of(prof, 8), wiki_like(4), longest + 1)


def test_too_few_gpus_for_any_scheme():
    prof = make_profile([scheme(2, 1, 1, 8000, 1024, 1e-9, 1e-4, 0.01), scheme(4, 1, 1, 16000, 1024, 1e-9, 1e-4, 0.01)])
    with pytest.raises(UserError, match=r"no scheme fits in 1 GPUs \(the smallest job it fits has 2 GPUs\)"):
        propose(Cluster.of(prof, 1), wiki_like(5), 4000)


def test_cli_writes_strategies_and_json_matches_file(tmp_path):
    profile = tmp_path / "p.json"
    profile.write_text(mid_profile().model_dump_json(by_alias=True))
    data = tmp_path / "lengths.txt"
    data.write_text("\n".join(map(str, wiki_like(6, 2000))) + "\n")
    out = tmp_path / "s.json"
    base = ["propose", "--profile", str(profile), "--dataset", str(data), "--gpus", "16", "--context-len", "20000",
            "--out", str(out)]
    table = hp(*base)
    assert table.returncode == 0, table.stderr
    s = Strategies.model_validate_json(out.read_text())
    assert s.gpus == 16 and s.context_len == 20000 and s.candidates
    for c in s.candidates:
        assert c.name in table.stdout
    as_json = hp(*base, "--json")
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout) == json.loads(out.read_text())


def test_cli_bad_context_exits_2_with_one_line(tmp_path):
    profile = tmp_path / "p.json"
    profile.write_text(mid_profile().model_dump_json(by_alias=True))
    data = tmp_path / "lengths.txt"
    data.write_text("100\n200\n")
    r = hp("propose", "--profile", str(profile), "--dataset", str(data), "--gpus", "8", "--context-len",
                "10000000", "--out", str(tmp_path / "s.json"))
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "longest supported length" in r.stderr
    assert not (tmp_path / "s.json").exists()


def test_rounding_tries_every_way_of_dropping_few_schemes_and_a_bounded_number_of_many():
    """Up to 10 schemes with fractional counts: every subset (smallest first). More (22 at 2M tokens on 1024 GPUs,
    4M subsets): every subset of the sizes that fit in MAX_VARIANTS, then the prefixes of the given order (the
    smallest shares first), so dropping many stays possible."""
    from itertools import chain, combinations

    from hydraplan.solve.proposal.rounding import MAX_VARIANTS, _subsets

    few = list(range(10))
    assert list(_subsets(few)) == list(chain.from_iterable(combinations(few, n) for n in range(11)))
    many = [7, 3, 11, 0, 5, 9, 2, 14, 1, 8, 6, 13, 4, 12, 10, 20, 15, 19, 16, 18, 17, 21]
    got = list(_subsets(many))
    assert len(got) == len(set(got)) <= MAX_VARIANTS + len(many)
    assert set(combinations(many, 2)) <= set(got) and got[0] == ()
    assert [tuple(many[:m]) for m in range(3, len(many) + 1)] == got[-(len(many) - 2):]


def every_variant_rounding(cells, relaxed, j: int, gpus: int, droppable: list[int]):
    """round_relaxed's variant search done plainly: each way of dropping some of `droppable`, its cells moved one by
    one (to the kept scheme meeting the budget with the fewest GPUs, else the lowest floor), allocated with no
    pruning; the smallest (latency, GPUs, counts)."""
    from hydraplan.core.sync import propagation_budget_s
    from hydraplan.solve.proposal.rounding import _Scaled, _subsets

    tau = np.asarray(propagation_budget_s(cells.transfer, float(relaxed.latency[j])))
    cs = relaxed.scheme[j, : j + 1]
    used = sorted(set(cs.tolist()))
    best = None
    for drop in _subsets(droppable):
        kept = [k for k in used if k not in drop]
        if not kept:
            continue
        mapping, W, B, F = cs.copy(), [], [], []
        ok = True
        for c, k in enumerate(cs):
            if k in drop:
                slack = {q: tau[q] - cells.bubble[c, q] for q in kept}
                holds = [q for q in kept if cells.feasible[c, q] and slack[q] > 0]
                meets = [q for q in holds if cells.floor[c, q] <= tau[q]]
                if not holds:
                    ok = False
                    break
                k = (min(meets, key=lambda q: (cells.gpus[q] * cells.work[c, q] / slack[q], used.index(q))) if meets
                     else min(holds, key=lambda q: (cells.floor[c, q], used.index(q))))
                mapping[c] = k
            W.append(cells.work[c, k])
            B.append(cells.bubble[c, k])
            F.append(cells.floor[c, k])
        if not ok:
            continue
        held = np.array(sorted(set(mapping.tolist())))
        stats = [[sum(W[c] / (tau[k] - B[c]) for c in range(len(W)) if mapping[c] == k),
                  min(B[c] for c in range(len(W)) if mapping[c] == k), max(B[c] for c in range(len(W)) if mapping[c] == k),
                  max(F[c] for c in range(len(W)) if mapping[c] == k)] for k in held]
        load, bmin, bmax, fmax = np.array(stats).T
        scaled = _Scaled(held, load, bmin, bmax, fmax, tau[held], cells.transfer[held], cells.gpus[held])
        d = scaled.allocate(gpus)
        if d is not None:
            counts = tuple((int(k), int(n)) for k, n in zip(scaled.schemes, d))
            key = (float(scaled.per_scheme(d).max()), int((d * scaled.g).sum()), counts)
            best = key if best is None or key < best else best
    return best


@pytest.mark.parametrize("gpus,sync", [(8, False), (24, False), (64, True), (40, True)])
def test_rounding_screens_variants_to_the_same_best_as_allocating_every_one(gpus, sync):
    """round_relaxed bounds a block of dropping variants at once and allocates only those that may win: the same
    strategy and latency as allocating every variant, with and without per-scheme transfer times."""
    prof = for_gpus(mid_profile(), gpus)
    lengths = np.minimum(wiki_like(gpus + 1), 30000)
    values, counts = np.unique(lengths, return_counts=True)
    transfer = np.array([0.004 / s.gpus for s in prof.schemes]) if sync else None
    cells = build_cells(list(prof.schemes), values, counts, 30000, 4096 * gpus, transfer=transfer)
    relaxed = solve_relaxed(cells, gpus)
    for j in range(cells.n_cells):
        x = np.bincount(relaxed.scheme[j, : j + 1], weights=relaxed.share[j, : j + 1], minlength=len(prof.schemes))
        by_share = sorted(np.flatnonzero(x > 0).tolist(), key=lambda k: (x[k], k))
        want = every_variant_rounding(cells, relaxed, j, gpus, [k for k in by_share if x[k] < 1])
        if want is None:
            want = every_variant_rounding(cells, relaxed, j, gpus, by_share)
        got = round_relaxed(cells, relaxed, j, gpus)
        assert (got.counts, got.latency) == (want[2], want[0])
