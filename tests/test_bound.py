"""The any-strategy bound against brute force: on tiny instances every strategy, dispatch and packing is
enumerated, and the bound must never exceed the best plan's time (propagation or end to end)."""

import itertools

import numpy as np
import pytest
from helpers import tiny_profile

from hydraplan.core.cost import pipeline_time
from hydraplan.core.sync import exposed_s
from hydraplan.schema import Scheme, TimeCoeffs
from hydraplan.solve.bound import any_strategy_bound


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


def _strategies(schemes: list[Scheme], gpus: int):
    """Every multiset of pipelines within `gpus` GPUs (at least one pipeline)."""
    def rec(k: int, left: int):
        if k == len(schemes):
            yield []
            return
        for n in range(left // schemes[k].gpus + 1):
            for rest in rec(k + 1, left - n * schemes[k].gpus):
                yield [k] * n + rest

    yield from (s for s in rec(0, gpus) if s)


def brute_force(lengths: list[int], schemes: list[Scheme], gpus: int, transfer: list[float] | None = None) -> float:
    best = np.inf
    for strat in _strategies(schemes, gpus):
        for assign in itertools.product(range(len(strat)), repeat=len(lengths)):
            worst = 0.0
            for j, k in enumerate(strat):
                prop = _best_pipeline(schemes[k], [l for l, a in zip(lengths, assign) if a == j])
                if transfer is not None and prop > 0:
                    prop += exposed_s(transfer[k], prop)
                worst = max(worst, prop)
                if worst >= best:
                    break
            best = min(best, worst)
    return best


def _schemes() -> list[Scheme]:
    return [*tiny_profile().schemes,
            Scheme(tp=1, pp=1, cp=2, max_len=3000, util_len=256, time=TimeCoeffs(a=0.8e-9, b=6e-5, c=0.02))]


@pytest.mark.parametrize("seed", range(12))
def test_bound_never_exceeds_the_best_plan(seed):
    rng = np.random.default_rng(seed)
    schemes = _schemes()
    gpus = int(rng.integers(2, 5))
    lengths = rng.integers(100, 4000, size=int(rng.integers(1, 5))).tolist()
    opt = brute_force(lengths, schemes, gpus)
    b = any_strategy_bound(lengths, schemes, gpus)
    assert b.latency_s <= opt * (1 + 1e-9)
    assert b.latency_s >= 0.5 * opt  # and it is not vacuous
    # the pipeline counts of the feasible solution fit in N GPUs
    assert sum(schemes[k].gpus * n for k, n in b.pipelines.items()) <= gpus


@pytest.mark.parametrize("seed", range(8))
def test_end_to_end_bound_never_exceeds_the_best_plan(seed):
    rng = np.random.default_rng(100 + seed)
    schemes = _schemes()
    gpus = int(rng.integers(2, 5))
    lengths = rng.integers(100, 4000, size=int(rng.integers(1, 4))).tolist()
    transfer = rng.uniform(0.0, 0.6, size=len(schemes)).tolist()
    opt = brute_force(lengths, schemes, gpus, transfer)
    b = any_strategy_bound(lengths, schemes, gpus, transfer=transfer)
    assert b.latency_s <= opt * (1 + 1e-9)
    assert b.latency_s >= any_strategy_bound(lengths, schemes, gpus).latency_s * (1 - 1e-3)


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
