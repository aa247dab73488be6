"""Megatron's hybrid-CP seam against Megatron's own code (the megatron-core 0.19.2 wheel `make setup` downloads,
loaded by tests/megatron_wheel.py): megatron-hcp equals its BalancedCPScheduler, the plugin's schedules obey the
executor's rules and are never slower than Megatron's on a batch, and the drop-in has its interface."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import numpy as np
import pytest
from megatron_standins import BalancedCPScheduler, Group, put, release
from megatron_wheel import load_hybrid_cp_schedule, megatron_schedule

from hydraplan.core.cluster import for_gpus
from hydraplan.core.executors import (
    HybridCP,
    hybrid_cp_lower_bound,
    hybrid_cp_round_times,
    hybrid_cp_time,
    hybrid_cp_violations,
)
from hydraplan.integrations import megatron as integ
from hydraplan.solve.megatron.balanced_cp import balanced_cp_schedule
from hydraplan.store.datasets import load_dataset, sample_iterations
from hydraplan.store.profiles import load_profile

PROFILE = "h100-llama2-7b"
GPUS = 64


@pytest.fixture(scope="module")
def megatron():
    return load_hybrid_cp_schedule()


@pytest.fixture(scope="module")
def profile():
    return load_profile(PROFILE)


def limit(profile, tp: int) -> int:
    """Megatron's --max-seqlen-per-dp-cp-rank as the issue sets it: MaxLen of <tp,1,1> in the job."""
    return next(s.max_len for s in for_gpus(profile, GPUS).schemes if s.key == (tp, 1, 1, "none"))


def batches(name: str, count: int = 20):
    return [b.lengths for b in sample_iterations(load_dataset(f"builtin:{name}", 32768), 200_000, count, 3)]


@pytest.mark.parametrize("name", ["wikipedia", "prolong"])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_megatron_hcp_equals_megatron_and_plugin_obeys_rules_and_is_never_slower(megatron, profile, name, tp):
    """At TP 2 Megatron's schedules put some 32K sequences on 2 ranks, which their memory does not allow
    (MaxLen of <2,1,2> is 28131): the plugin's never do, and are faster wherever Megatron's fit."""
    m, n = limit(profile, tp), GPUS // tp
    target = HybridCP.of(profile, tp=tp, dpcp=n, max_seqlen_per_rank=m)
    compared = 0
    for lengths in batches(name):
        theirs = megatron_schedule(megatron, lengths, m, n)
        assert balanced_cp_schedule(lengths, m, n) == theirs
        ours = integ.schedule_hybrid_cp(lengths, profile=PROFILE, tp=tp, dpcp=n, max_seqlen_per_rank=m)
        assert hybrid_cp_violations(ours, lengths, n, m) == [] and target.out_of_memory(ours, lengths) == []
        assert hybrid_cp_time(target, ours, lengths) >= hybrid_cp_lower_bound(target, lengths) * (1 - 1e-12)
        if not target.out_of_memory(theirs, lengths):
            compared += 1
            assert hybrid_cp_time(target, ours, lengths) <= hybrid_cp_time(target, theirs, lengths) * (1 + 1e-12)
    assert compared >= 10


def test_megatron_equal_on_a_many_round_case(megatron):
    """Few ranks, a long tail and equal lengths: trims, leftovers, several rounds and the empty-rank fill."""
    rng = np.random.default_rng(5)
    for n, m in [(4, 1000), (8, 700), (16, 500)]:
        for _ in range(20):
            lengths = np.concatenate([rng.integers(50, 4 * m, 12), np.full(5, m), rng.integers(1, 300, 30)])
            theirs = megatron_schedule(megatron, lengths, m, n)
            assert balanced_cp_schedule(lengths, m, n) == theirs
    assert any(len(megatron_schedule(megatron, rng.integers(1, 4000, 40), 1000, 4)) > 1 for _ in range(5))


def test_round_time_is_the_executors(profile):
    """A sequence starts when all of its ranks are free; the round ends with its last rank; rounds add up."""
    t = HybridCP.of(profile, tp=2, dpcp=4, max_seqlen_per_rank=20_000)
    lengths = [30_000, 1000, 2000, 3000]
    # round 0: ranks 0,1 run 1000 then 2000 alone; ranks 0-3 share 30000 after them, rank 2 runs 3000 first
    sched = [[[1, 0], [2, 0], [3, 0], [0]], [[1], [2], [3], [1]]]
    # round 1 lists 1 on ranks 0 and 3 (not a block) but timing does not care
    a = max(t.time(1000, 1), t.time(2000, 1), t.time(3000, 1)) + t.time(30_000, 4)
    b = max(t.time(1000, 2), t.time(2000, 1), t.time(3000, 1))
    np.testing.assert_allclose(hybrid_cp_round_times(t, sched, lengths), [a, b])


def test_checker_flags_every_rule():
    lengths = [800, 100, 100, 100, 100]
    ok = [[[0, 1], [0, 2], [3], [4]]]
    assert hybrid_cp_violations(ok, lengths, 4, 400) == []
    cases = {
        "aligned": [[[1], [0, 2], [0, 3], [4]]],  # ranks 1,2: not an aligned block
        "per-rank limit": [[[0, 1], [2], [3], [4]]],
        "deadlock": [[[0, 1], [1, 0], [3, 2], [4, 2]]],  # wait, 1 and 2 are on two ranks each: orders cross
        "without work": [[[0, 1, 2, 3, 4], [0], [], []]],
        "never scheduled": [[[0], [0], [1], [2]]],
        "several rounds": [[[0, 1], [0], [3], [4]], [[1], [2], [3], [4]]],
    }
    for what, sched in cases.items():
        problems = hybrid_cp_violations(sched, lengths, 4, 400)
        assert any(what in p for p in problems), (what, problems)


def test_plugin_fills_every_rank_with_few_sequences(profile):
    lengths = [30_000, 5000]
    sched = integ.schedule_hybrid_cp(lengths, profile=profile, tp=2, dpcp=16, max_seqlen_per_rank=17_888)
    assert hybrid_cp_violations(sched, lengths, 16, 17_888) == []


SCRIPT = """
import hashlib, json
from hydraplan.integrations.megatron import schedule_dynamic_cp, schedule_hybrid_cp, schedule_packing
from hydraplan.store.datasets import load_dataset, sample_iterations
out = []
for b in sample_iterations(load_dataset("builtin:prolong", 32768), 200000, 5, 3):
    out.append(schedule_hybrid_cp(b.lengths.tolist(), profile="h100-llama2-7b", tp=2, dpcp=32, max_seqlen_per_rank=17888))
    out.append(schedule_packing(b.lengths.tolist(), profile="h100-llama2-7b", tp=2, pp=2, cp=2, dp=8, capacity=35712))
    out.append(schedule_dynamic_cp(b.lengths.tolist(), profile="h100-llama2-7b", tp=4, dpcp=16, max_seqlen_per_rank=40756))
print(hashlib.sha256(json.dumps(out).encode()).hexdigest())
"""


def test_identical_in_processes_with_different_hash_seeds():
    """Every seam's schedules (each rank computes its own, nothing is broadcast)."""
    digests = set()
    for seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        digests.add(subprocess.run([sys.executable, "-c", SCRIPT], env=env, check=True, capture_output=True,
                                   text=True).stdout.strip())
    assert len(digests) == 1 and len(digests.pop()) == 64


def test_install_replaces_balanced_cp_scheduler_in_megatron_and_uninstalls(monkeypatch, profile):
    ds = put(monkeypatch, release())
    uninstall = integ.install(PROFILE)
    sched = ds.BalancedCPScheduler(max_seq_len_per_rank=17_888, dp_cp_group=Group(16))
    config = types.SimpleNamespace(tensor_model_parallel_size=4, recompute_granularity="selective")
    lengths = [int(x) for x in batches("wikipedia", 1)[0]]
    pairs = [(1000 + i, l) for i, l in enumerate(lengths)]  # global ids are not positions
    groups, sample_id_groups = sched.get_groups_and_subsamples(pairs, config)
    expect = integ.schedule_hybrid_cp(lengths, profile=profile, tp=4, dpcp=16, max_seqlen_per_rank=17_888,
                                      recompute="selective")
    assert sample_id_groups == [[[1000 + i for i in rank] for rank in rnd] for rnd in expect]
    assert groups == [[[lengths[i] for i in rank] for rank in rnd] for rnd in expect]
    uninstall()
    assert ds.BalancedCPScheduler is BalancedCPScheduler


def _optimum(target: HybridCP, lengths: list[int]) -> float:
    """The fastest schedule by brute force: every start order, CP size that fits, and aligned block. One round is
    enough: rounds run back to back in one round are never slower (a sequence waits for its group, not a barrier)."""
    import itertools

    fits = target.fits(lengths)
    options = [[(c, lo) for k, c in enumerate(target.cps) if fits[k, i] for lo in range(0, target.dpcp, c)]
               for i in range(len(lengths))]
    times = {(i, c): target.time(lengths[i], c) for i in range(len(lengths)) for c in target.cps}
    best = np.inf
    for choice in itertools.product(*options):
        lists_ok = {r for c, lo in choice for r in range(lo, lo + c)} == set(range(target.dpcp))
        if not lists_ok:  # every rank needs work in the (last) round
            continue
        for order in itertools.permutations(range(len(lengths))):
            ready = [0.0] * target.dpcp
            for i in order:
                c, lo = choice[i]
                end = max(ready[lo:lo + c]) + times[i, c]
                ready[lo:lo + c] = [end] * c
            best = min(best, max(ready))
    return best


def test_plugin_against_brute_force_on_small_batches(profile):
    """Within 5% of the fastest schedule on random batches of 4 sequences over 4 ranks (short, mid and over-limit
    lengths, so CP sizes 1, 2 and 4 all occur), and never below it; the lower bound never above it."""
    rng = np.random.default_rng(7)
    target = HybridCP.of(profile, tp=8, dpcp=4, max_seqlen_per_rank=40_000)
    worst = 1.0
    for _ in range(20):
        lengths = [int(x) for x in rng.choice([2000, 9000, 30_000, 60_000, 90_000], 4)]
        opt = _optimum(target, lengths)
        ours = hybrid_cp_time(target, integ.schedule_hybrid_cp(lengths, profile=profile, tp=8, dpcp=4,
                                                                max_seqlen_per_rank=40_000), lengths)
        assert hybrid_cp_lower_bound(target, lengths) <= opt * (1 + 1e-12) and ours >= opt * (1 - 1e-12)
        worst = max(worst, ours / opt)
    assert worst <= 1.05, worst
