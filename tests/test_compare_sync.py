"""compare end to end: every method's plan pays the docs/formats.md sync formula with its own schemes (phases in
sequence: pull before the first, push after the last), and static choices are tuned on that score."""

import itertools

import numpy as np
import pytest
from test_compare import run_of, scheme

from hydraplan.core.cluster import Cluster
from hydraplan.methods import baselines as bl
from hydraplan.methods import compare as cp
from hydraplan.schema import GPUInfo, ModelInfo, Network, Profile, Scheme, TimeCoeffs


def synced(schemes: list[Scheme]) -> Profile:
    """8 GPUs in one node at 1 GB/s, 10^9 parameters: t = 2 s / (tp * pp) per direction."""
    return Profile(name="p", gpu=GPUInfo(name="g", memory_gib=80, gpus_per_node=8),
                   model=ModelInfo(name="m", layers=2, hidden=64, params=10**9),
                   network=Network(intra_node_GBps=1.0, inter_node_GBps=1.0), schemes=schemes)


def test_one_phase_is_the_design_formula():
    s1, s2 = scheme(tp=1), scheme(tp=2)
    plan = bl.IterationPlan("x", "", np.array([1]), (bl.Phase("p", (run_of(s1, [3, 1]), run_of(s2, [2]), run_of(s1, [])), 0),))
    prof = synced([s1, s2])
    want = Cluster.of(prof, 8).estimate([(1, 1, 1), (2, 1, 1), (1, 1, 1)], [4.0, 2.0, 0.0]).iteration_s
    # by hand: <1,1,1> t = 2: 4 + (2 - 4/3) + max(0, 2 - 8/3) = 4.667; <2,1,1> t = 1: 2 + 1/3 + 0 = 2.333; idle: 0
    assert bl.plan_iteration_s(plan, Cluster.of(prof, 8)) == pytest.approx(want) == pytest.approx(4 + 2 / 3)


def test_phases_pull_before_the_first_and_push_after_the_last_with_switching_on_top():
    s1, s2 = scheme(tp=1), scheme(tp=2)
    first = bl.Phase("a", (run_of(s1, [3]), run_of(s1, [1])), 0)  # t = 2
    last = bl.Phase("b", (run_of(s2, [1]),), 0)  # t = 1
    plan = bl.IterationPlan("x", "", np.array([1]), (first, last), overhead_s=0.25)
    # first phase, its pull exposed: max(3 + (2 - 1), 1 + (2 - 1/3)) = 4; last, its push: 1 + (1 - 2/3)
    assert bl.plan_iteration_s(plan, Cluster.of(synced([s1, s2]), 8)) == pytest.approx(4 + 4 / 3 + 0.25)
    assert plan.estimate_s == pytest.approx(3 + 1 + 0.25)


@pytest.mark.parametrize("bandwidth", [1e3, 50e9])
def test_hotspa_end_to_end_picks_the_best_combination_by_its_score(bandwidth):
    schemes = [Scheme(tp=tp, pp=1, cp=1, max_len=m, util_len=1024, time=TimeCoeffs(a=4e-10 * f / tp, b=1e-5 * f / tp, c=0.002))
               for tp, m, f in [(1, 8192, 1.0), (2, 20000, 1.3), (4, 40000, 1.6)]]
    view = synced(schemes).model_copy(update={"network": Network(intra_node_GBps=5.0, inter_node_GBps=5.0)})
    rng = np.random.default_rng(5)
    batches = [np.minimum(rng.lognormal(7.5, 1.3, 40).astype(np.int64) + 1, 32768) for _ in range(6)]
    switch = bl.SwitchModel(2e9, bandwidth)
    score = bl.objective_score(Cluster.of(view, 8))
    got = cp.run_hotspa(batches, Cluster.of(view, 8), 32768, switch, score)
    ranges = bl.hotspa_ranges(32768)
    options = [[s for s in schemes if s.max_len >= hi] for _, hi in ranges]
    brute = min(sum(score(bl.hotspa(b, list(zip(ranges, combo)), 8, switch)) for b in batches)
                for combo in itertools.product(*options))
    assert sum(score(p) for p in got) == pytest.approx(brute, rel=1e-12)
    # the sync term is real here: it changes what the best propagation choice scores
    prop = cp.run_hotspa(batches, Cluster.of(view, 8), 32768, switch)
    assert sum(score(p) for p in prop) >= brute
    assert sum(score(p) for p in got) > sum(p.estimate_s for p in got)


def test_megatron_static_choice_is_tuned_on_the_objective():
    """16 one-token sequences, one micro-batch each. 8x<1,1,1> (b = 1): 2 s of propagation, but t = 2 s per
    direction: 2 + (2 - 2/3) + (2 - 4/3) = 4 s end to end. 4x<2,1,1> (b = 0.7): 2.8 s, t = 1 s: 2.867 s."""
    s1, s2 = scheme(tp=1, b=1.0, max_len=1), scheme(tp=2, b=0.7, max_len=1)
    prof = synced([s1, s2])
    batches = [np.ones(16, dtype=np.int64) for _ in range(2)]
    by_prop, prop_plans = cp.run_megatron(batches, Cluster.of(prof, 8, "propagation"), 1)
    by_e2e, e2e_plans = cp.run_megatron(batches, Cluster.of(prof, 8), 1, bl.objective_score(Cluster.of(prof, 8)))
    assert (by_prop.tp, by_e2e.tp) == (1, 2)
    assert prop_plans[0].estimate_s == pytest.approx(2.0) and e2e_plans[0].estimate_s == pytest.approx(2.8)
    assert bl.plan_iteration_s(prop_plans[0], Cluster.of(prof, 8)) == pytest.approx(4.0)
    assert bl.plan_iteration_s(e2e_plans[0], Cluster.of(prof, 8)) == pytest.approx(2.8 + 1 - 2.8 / 3)
