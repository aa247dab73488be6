"""The any-strategy bound against brute force: on small instances every strategy, dispatch and packing is searched
exactly, and the bound must never exceed the best plan's time (propagation or end to end); a relaxation made to
over-reach (work or bubbles counted above what the real sequences cost) must fail the same check."""

import dataclasses
import functools

import numpy as np
import pytest
from helpers import tiny_profile

from bench.loose import loose_bound
from hydraplan.core.cost import pipeline_time
from hydraplan.core.sync import exposed_s
from hydraplan.schema import Scheme, TimeCoeffs
from hydraplan.solve.bound import any_strategy_bound, bisect
from hydraplan.solve.relaxation import probe, relaxation


def _partitions(items: list[int]):
    """Every set partition of `items` (lists of lists)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        for k in range(len(part)):
            yield part[:k] + [[first, *part[k]]] + part[k + 1:]
        yield [[first], *part]


def _best_pipeline(scheme: Scheme, lengths: list[int]) -> float:
    """Fastest packing of these sequences on one pipeline (inf if one does not fit)."""
    if not lengths:
        return 0.0
    best = np.inf
    for part in _partitions(list(range(len(lengths)))):
        mbs = [[lengths[i] for i in mb] for mb in part]
        if all(sum(mb) <= scheme.max_len for mb in mbs):
            best = min(best, pipeline_time(scheme, mbs))
    return best


def brute_force(lengths: list[int], schemes: list[Scheme], gpus: int, transfer: list[float] | None = None) -> float:
    """The best plan of any strategy within `gpus` GPUs: over subsets, the pipeline holding the first remaining
    sequence (its scheme and which others join it, packed exactly), then the rest on the GPUs left."""
    B = len(lengths)
    cost = {}
    for k, s in enumerate(schemes):
        for mask in range(1, 1 << B):
            prop = _best_pipeline(s, [lengths[i] for i in range(B) if mask >> i & 1])
            if transfer is not None and np.isfinite(prop):
                prop += exposed_s(transfer[k], prop)
            cost[k, mask] = prop

    @functools.lru_cache(maxsize=None)
    def best(left: int, free: int) -> float:
        if left == 0:
            return 0.0
        low = left & -left
        rest = left ^ low
        out = np.inf
        sub = rest
        while True:
            for k, s in enumerate(schemes):
                if s.gpus <= free:
                    out = min(out, max(cost[k, sub | low], best(rest ^ sub, free - s.gpus)))
            if sub == 0:
                break
            sub = (sub - 1) & rest
        return out

    return best((1 << B) - 1, gpus)


def _schemes() -> list[Scheme]:
    return [*tiny_profile().schemes,
            Scheme(tp=1, pp=1, cp=2, max_len=3000, util_len=256, time=TimeCoeffs(a=0.8e-9, b=6e-5, c=0.02))]


def _instance(rng: np.random.Generator, most: int = 4) -> tuple[list[Scheme], int, list[int]]:
    """Small enough to brute-force: 2-4 GPUs and 1 to `most` sequences."""
    gpus = int(rng.integers(2, 5))
    return _schemes(), gpus, rng.integers(100, 4000, size=int(rng.integers(1, most + 1))).tolist()


@pytest.mark.parametrize("seed", range(12))
def test_bound_never_exceeds_the_best_plan(seed):
    rng = np.random.default_rng(seed)
    schemes, gpus, lengths = _instance(rng)
    opt = brute_force(lengths, schemes, gpus)
    b = any_strategy_bound(lengths, schemes, gpus)
    assert b.latency_s <= opt * (1 + 1e-9)
    assert b.latency_s >= 0.5 * opt  # and it is not vacuous
    # the pipeline counts of the feasible solution fit in N GPUs
    assert sum(schemes[k].gpus * n for k, n in b.pipelines.items()) <= gpus


@pytest.mark.parametrize("seed", range(8))
def test_end_to_end_bound_never_exceeds_the_best_plan(seed):
    rng = np.random.default_rng(100 + seed)
    schemes, gpus, lengths = _instance(rng, most=3)
    transfer = rng.uniform(0.0, 0.6, size=len(schemes)).tolist()
    opt = brute_force(lengths, schemes, gpus, transfer)
    b = any_strategy_bound(lengths, schemes, gpus, transfer=transfer)
    assert b.latency_s <= opt * (1 + 1e-9)
    assert b.latency_s >= any_strategy_bound(lengths, schemes, gpus).latency_s * (1 - 1e-3)


@pytest.mark.parametrize("seed", range(6))
def test_a_reached_upper_and_the_interior_point_lp_leave_the_bound_as_it_was(seed):
    # a plan's latency taken as feasible without its probe, and the LPs asked only for feasibility (interior point
    # first): the same bisection, the same bound; the two LP solvers agree on feasibility around the optimum
    rng = np.random.default_rng(300 + seed)
    schemes, gpus, lengths = _instance(rng)
    opt = brute_force(lengths, schemes, gpus)
    probed = any_strategy_bound(lengths, schemes, gpus, upper=opt)
    reached = any_strategy_bound(lengths, schemes, gpus, upper=opt, upper_reached=True)
    assert reached.latency_s == probed.latency_s <= opt * (1 + 1e-9)
    assert loose_bound(lengths, schemes, gpus, upper=opt, upper_reached=True) == loose_bound(lengths, schemes, gpus,
                                                                                            upper=opt)
    rel = relaxation(np.asarray(lengths), schemes, gpus)
    answers = [(probe(rel, X, relax=True) is None, probe(rel, X, relax=True, vertex=False) is None)
               for X in np.linspace(0.5, 1.2, 8) * opt]
    assert all(vertex == interior for vertex, interior in answers)
    assert answers[0][0] and not answers[-1][0]  # both sides of the threshold are seen


def test_a_known_floor_starts_the_bisection():
    """Another bound's answer as the floor: the bound is never below it and still below the best plan; a floor
    between the relaxation's own answer and the optimum is where the answer lands (ignored, it would stay lower)."""
    roomy = 0
    for lengths, schemes, gpus, _, opt in _cases(False):
        loose = loose_bound(lengths, schemes, gpus)
        assert loose <= any_strategy_bound(lengths, schemes, gpus, floor=loose).latency_s <= opt * (1 + 1e-9)
        own = any_strategy_bound(lengths, schemes, gpus).latency_s
        if own < opt * (1 - 1e-3):
            roomy += 1
            mid = 0.5 * (own + opt)
            assert mid <= any_strategy_bound(lengths, schemes, gpus, floor=mid).latency_s <= opt * (1 + 1e-9)
    assert roomy >= 3


def test_bound_is_tight_when_one_sequence_runs_alone():
    # one sequence, every scheme: the best plan is the cheapest pp * T(l) among schemes that fit
    schemes = _schemes()
    l = 1000
    opt = min(s.pp * (s.time.a * l * l + s.time.b * l + s.time.c) for s in schemes)
    b = any_strategy_bound([l], schemes, 4)
    assert b.latency_s == pytest.approx(opt, rel=2e-4)


def test_bound_grows_when_the_sync_cannot_hide():
    # a transfer larger than half the propagation time sets the end-to-end floor at 2t
    schemes = _schemes()
    b = any_strategy_bound([500], schemes, 4, transfer=[1.0] * len(schemes))
    assert b.latency_s == pytest.approx(2.0, rel=2e-4)


def _deep_schemes() -> list[Scheme]:
    """Besides the tiny profile's: a four-stage pipeline (bubble (pp-1) x its largest micro-batch) and a cp=2 one."""
    return [*_schemes(),
            Scheme(tp=1, pp=4, cp=1, max_len=8192, util_len=256, time=TimeCoeffs(a=0.5e-9, b=2.6e-5, c=0.006))]


# (long sequences kept whole, group width, level width): every path of the relaxation, down to all sequences in
# wide groups and levels
RELAXATIONS = [(0, 2.0, 2.0), (1, 1.5, 1.5), (2, 3.0, 1.2), (8, 1.1, 1.5)]


def _instances(seed: int):
    """Small batches on 4-8 GPUs, clustered so that length groups hold several sequences; then batches of two
    close long sequences and three short ones for two four-stage pipelines, where the bubbles decide."""
    rng = np.random.default_rng(seed)
    schemes = _deep_schemes()
    for _ in range(10):
        centres = rng.integers(150, 3500, int(rng.integers(1, 4)))
        lengths = [int(min(8000, max(16, rng.choice(centres) * rng.uniform(0.7, 1.3)))) for _ in range(int(rng.integers(3, 7)))]
        yield lengths, schemes, int(rng.integers(4, 9)), rng.uniform(0.0, 0.4, size=len(schemes))
    for _ in range(12):
        lengths = sorted(rng.integers(2400, 3200, 2).tolist() + rng.integers(100, 600, 3).tolist(), reverse=True)
        yield lengths, schemes[-1:], 8, rng.uniform(0.0, 0.4, size=1)


@functools.lru_cache(maxsize=None)
def _cases(end_to_end: bool) -> list[tuple[list[int], list[Scheme], int, list[float] | None, float]]:
    out = []
    for lengths, schemes, gpus, transfer in _instances(7 if end_to_end else 1):
        t = transfer.tolist() if end_to_end else None
        out.append((lengths, schemes, gpus, t, brute_force(lengths, schemes, gpus, t)))
    return out


def _admits_the_optimum(mutate=lambda rel: rel) -> list[bool]:
    """Per case and relaxation: whether the relaxation is feasible at the brute-force optimum (as every valid one
    must be: the best plan maps to a feasible point)."""
    out = []
    for e2e in (False, True):
        for lengths, schemes, gpus, t, opt in _cases(e2e):
            for long, group, level in RELAXATIONS:
                rel = mutate(relaxation(lengths, schemes, gpus, None if t is None else np.array(t), long=long,
                                        group_ratio=group, level_ratio=level))
                out.append(probe(rel, opt * (1 + 1e-9)) is not None)
    return out


def test_tight_relaxation_admits_the_best_plan_of_any_strategy():
    assert all(_admits_the_optimum())


@pytest.mark.parametrize("over_reach", ["work at the group's longest", "bubble of the level's longest"])
def test_an_over_reaching_relaxation_fails_the_check(over_reach):
    """The check above has teeth: counting a group's work at its longest sequence, or a pp > 1 pipeline's bubble at
    the longest sequence of its level, claims more than the sequences cost, and some case catches it."""
    if over_reach.startswith("work"):
        def mutate(rel):
            return dataclasses.replace(rel, lo=rel.hi)
    else:
        def mutate(rel):
            return dataclasses.replace(rel, level_lo=rel.level_hi)
    assert not all(_admits_the_optimum(mutate))


def test_tight_bound_is_near_the_best_plan_and_above_the_loose_one():
    """Not vacuous: within 3% of the best plan on average over the cases (the first relaxation is 4.5% below, and
    18% on one), and never below the first bound by more than the bisection tolerance."""
    ratios = []
    for lengths, schemes, gpus, _, opt in _cases(False):
        b = any_strategy_bound(lengths, schemes, gpus, rel_tol=1e-4)
        assert b.latency_s <= opt * (1 + 1e-9)
        assert b.latency_s >= loose_bound(lengths, schemes, gpus, rel_tol=1e-4) * (1 - 2e-4)
        ratios.append(b.latency_s / opt)
    assert np.mean(ratios) >= 0.97


def test_bisection_finds_the_least_feasible_latency():
    res = bisect(lambda X: np.ones(1) if X >= 3.0 else None, 1.0, 10.0, 1e-6)
    assert res.lo < 3.0 <= res.hi <= 3.0 * (1 + 1e-6)
    grown = bisect(lambda X: np.ones(1) if X >= 3.0 else None, 1.0, None, 1e-6)  # no upper: grow the bracket
    assert grown.lo < 3.0 <= grown.hi <= 3.0 * (1 + 1e-6)


def test_volume_counts_every_sequence_at_its_own_length():
    """The bisections' floor: the mean over the GPUs of each sequence's cheapest GPU-seconds (work, and c per
    MaxLen of its tokens), each at its own length, written out here per sequence; counting a length group's
    work at its shortest length (the relaxation's rows) would put the floor below the first bound's."""
    rng = np.random.default_rng(5)
    schemes = _schemes()
    lengths = rng.integers(100, 3000, size=200)
    want = sum(min(s.gpus * (s.time.a * l * l + s.time.b * l + s.time.c * l / s.max_len)
                   for s in schemes if l <= s.max_len) for l in lengths.tolist()) / 16
    assert relaxation(lengths, schemes, 16).volume() == pytest.approx(want, rel=1e-12)


def test_hull_facets_support_the_points_in_every_nonnegative_direction():
    """The facets of one pipeline's load hull (its points' upper-right convex hull) cut out the region below the
    points: in every direction d >= 0 the largest d.x over {x >= 0 within the facets} (an LP, HiGHS) is the
    largest over the points, so no facet cuts a point off and none leaves room above them."""
    from hydraplan.solve.highs import SparseModel
    from hydraplan.solve.relaxation import _upper_right

    rng = np.random.default_rng(2)
    for case in range(60):
        n = int(rng.integers(1, 12))
        pts = rng.uniform(0, 10, size=(n, 2))
        if case % 3 == 0:  # ties and repeats
            pts = np.round(pts)
        al, be, ga = _upper_right(pts[:, 0].copy(), pts[:, 1].copy())
        assert (al >= 0).all() and (be >= 0).all()
        for d in rng.uniform(0, 1, size=(4, 2)):
            m = SparseModel()
            x = m.add_vars(2)
            F = al.size
            m.add_rows(F, np.repeat(np.arange(F), 2), np.tile(x, F), np.column_stack([al, be]).ravel(), upper=ga)
            sol = m.solve(cost=-d)
            assert sol.status == "optimal"
            assert d @ sol.values == pytest.approx((pts @ d).max(), rel=1e-9, abs=1e-9)
