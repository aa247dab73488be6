"""Baselines on small hand-checked cases; FFD and the FlexSP chunking DP against brute force."""

import itertools

import numpy as np
import pytest

from hydraplan.methods import baselines as bl
from hydraplan.schema import ModelInfo, Scheme, TimeCoeffs


def scheme(tp=1, pp=1, cp=1, max_len=10, a=0.0, b=1.0, c=0.0) -> Scheme:
    return Scheme(tp=tp, pp=pp, cp=cp, max_len=max_len, util_len=1, time=TimeCoeffs(a=a, b=b, c=c))


def optimal_bins(items: list[int], cap: int) -> int:
    """Exact bin-packing optimum by exhaustive search (small n)."""
    items = sorted(items, reverse=True)
    best = [len(items)]

    def rec(i: int, bins: list[int]) -> None:
        if len(bins) >= best[0]:
            return
        if i == len(items):
            best[0] = len(bins)
            return
        tried = set()
        for k in range(len(bins)):
            if bins[k] + items[i] <= cap and bins[k] not in tried:
                tried.add(bins[k])
                bins[k] += items[i]
                rec(i + 1, bins)
                bins[k] -= items[i]
        bins.append(items[i])
        rec(i + 1, bins)
        bins.pop()

    rec(0, [])
    return best[0]


def test_ffd_hand_case():
    bins = bl.ffd(np.array([5, 4, 3, 3, 2, 1]), 8)
    # 5->b0, 4->b1, 3->b0 (full), 3->b1, 2->b2 (b1 has 1 left), 1->b1
    assert [sorted(b.tolist()) for b in bins] == [[0, 2], [1, 3, 5], [4]]


@pytest.mark.parametrize("kind", ["over_third", "divisible"])
def test_ffd_bin_count_is_optimal_where_ffd_is_known_optimal(kind):
    # FFD is optimal when every item exceeds a third of the bin (at most two per bin), and when sizes are
    # divisible (each size divides every larger one and the capacity).
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(1, 9))
        if kind == "over_third":
            cap, items = 100, rng.integers(34, 101, n)
        else:
            cap, items = 64, 2 ** rng.integers(0, 7, n)
        bins = bl.ffd(items, cap)
        assert sorted(np.concatenate(bins).tolist()) == list(range(n))
        assert all(items[b].sum() <= cap for b in bins)
        assert len(bins) == optimal_bins(items.tolist(), cap)


def test_ffd_rejects_oversized_sequence():
    with pytest.raises(ValueError, match="exceeds"):
        bl.ffd(np.array([11]), 10)


def test_megatron_hand_case():
    s = scheme(pp=2, max_len=10, a=1e-4, b=1e-3, c=0.01)
    plan = bl.megatron(np.array([6, 5, 4, 3, 2]), s, gpus=4)  # 2 pipelines of 2 GPUs
    # FFD: {6,4} and {5,3,2}; one micro-batch per pipeline (round-robin)
    got = [[sorted(plan.lengths[mb].tolist()) for mb in p.micro_batches] for p in plan.phases[0].pipelines]
    assert got == [[[4, 6]], [[2, 3, 5]]]
    t0 = 1e-4 * (36 + 16) + 1e-3 * 10 + 0.01
    t1 = 1e-4 * (25 + 9 + 4) + 1e-3 * 10 + 0.01
    assert plan.estimate_s == pytest.approx(2 * t0)  # sum + (pp-1)*max with one micro-batch
    assert plan.phases[0].pipelines[1].latency_s == pytest.approx(2 * t1)
    assert plan.phases[0].idle_gpus == 0


def test_megatron_deals_by_count_and_leaves_pipelines_empty():
    s = scheme(max_len=10)
    plan = bl.megatron(np.array([10, 10, 10]), s, gpus=4)
    counts = [len(p.micro_batches) for p in plan.phases[0].pipelines]
    assert counts == [1, 1, 1, 0]
    assert plan.estimate_s == pytest.approx(10.0)


def test_hotspa_ranges():
    assert bl.hotspa_ranges(32768) == [(16384, 32768), (4096, 16384), (0, 4096)]
    assert bl.hotspa_ranges(16384) == [(4096, 16384), (0, 4096)]
    assert bl.hotspa_ranges(4096) == [(0, 4096)]


def test_hotspa_phases_and_switch_cost():
    small, big = scheme(max_len=5000), scheme(tp=2, pp=2, max_len=40000, b=0.5)
    switch = bl.SwitchModel(param_bytes=1e9, bandwidth_Bps=1e9)
    assert switch.switch_s(small, big) == pytest.approx(1.0 + 0.5)
    ranges = [((16384, 32768), big), ((4096, 16384), big), ((0, 4096), small)]
    lengths = np.array([20000, 3000, 1000])
    plan = bl.hotspa(lengths, ranges, gpus=4, switch=switch)
    assert [sorted(plan.lengths[np.concatenate([mb for p in ph.pipelines for mb in p.micro_batches])].tolist())
            for ph in plan.phases] == [[20000], [1000, 3000]]
    # big -> small and back to big for the next iteration: two switches of 1.5 s
    assert plan.overhead_s == pytest.approx(3.0)
    # phase 1: <2,2,1> x1, one micro-batch of 20000 tokens at b=0.5, pp=2 -> 2 * 10000
    assert plan.phases[0].latency_s == pytest.approx(20000.0)
    # phase 2: <1,1,1> x4, FFD packs 3000+1000 into one micro-batch (MaxLen 5000)
    assert plan.phases[1].latency_s == pytest.approx(4000.0)
    assert plan.estimate_s == pytest.approx(24003.0)
    single = bl.hotspa(np.array([100, 200]), ranges, gpus=4, switch=switch)
    assert single.overhead_s == 0.0 and len(single.phases) == 1
    # another recomputation mode of the same layout reshards nothing
    full = big.model_copy(update={"recompute": "full", "max_len": 90000})
    assert switch.switch_s(big, full) == 0.0 and bl.switch_overhead([big, full, big], switch) == 0.0
    assert bl.switch_overhead([small, full], switch) == pytest.approx(3.0)


def test_model_param_bytes_llama7b():
    # LLaMA-2 7B (L=32, h=4096, ffn=11008, V=32000) has 6.74e9 parameters
    model = ModelInfo(name="llama2-7b", layers=32, hidden=4096, ffn=11008, vocab=32000)
    assert bl.model_param_bytes(model) / 2 == pytest.approx(6.74e9, rel=0.002)


def test_imbalance_degree():
    assert bl.imbalance_degree(np.array([1.0, 1.0, 2.0])) == pytest.approx(1.5)
    assert bl.imbalance_degree(np.array([3.0, 3.0])) == pytest.approx(1.0)


def test_wlb_pack_least_loaded_then_shortest_then_carry():
    s = scheme(b=1.0)
    mbs, left = bl.wlb_pack(np.array([5, 4, 3, 2]), s, micro_batches=2, max_tokens=6)
    # 5 -> m0, 4 -> m1, 3 fits neither (5+3, 4+3 > 6) -> next iteration, 2 -> least loaded m1
    assert mbs == [[0], [1, 3]] and left == [2]


def test_wlb_outlier_queue_delays_until_one_per_micro_batch():
    s = scheme(max_len=100)
    plans = bl.wlb_llm([np.array([12, 3, 3]), np.array([11, 2]), np.array([1, 1])], s, gpus=1,
                       micro_batches_per_pipeline=2, thresholds=[10])
    assert [sorted(p.lengths.tolist()) for p in plans] == [[3, 3], [2, 11, 12], [1, 1]]
    # the two outliers land in different micro-batches
    mbs = plans[1].phases[0].pipelines[0].micro_batches
    assert sorted(int((plans[1].lengths[mb] > 10).sum()) for mb in mbs) == [1, 1]
    assert [p.delayed_token_iters for p in plans] == [0.0, 12.0, 0.0]
    # 12 -> m0, 11 -> m1, 2 -> the least loaded m1: times 12 and 13 (b = 1, c = 0), max * M / sum
    assert plans[1].imbalance == pytest.approx(13 * 2 / 25)


def test_wlb_thresholds_double():
    assert bl.wlb_thresholds(200_000, 8, 2) == [12500, 25000]


def test_chunk_dp_matches_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(1, 9))
        sizes = rng.integers(1, 50, n)
        m = int(rng.integers(1, n + 1))
        chunks = bl.chunk_dp(sizes, m)
        assert np.concatenate(chunks).tolist() == list(range(n)) and all(c.size for c in chunks)
        best = min(max(sizes[a:b].sum() for a, b in zip((0, *cut), (*cut, n)))
                   for cut in itertools.combinations(range(1, n), m - 1))
        assert max(sizes[c].sum() for c in chunks) == best


def test_flexsp_balances_groups_within_a_step():
    s = scheme(max_len=10, c=0.5)
    plan = bl.flexsp(np.array([6, 5, 4, 3]), [s], gpus=2)
    assert len(plan.phases) == 1  # 18 tokens fit the 2 x 10 token cluster in one step
    groups = sorted(sorted(plan.lengths[np.concatenate(p.micro_batches)].tolist()) for p in plan.phases[0].pipelines)
    assert groups == [[3, 6], [4, 5]]
    assert plan.estimate_s == pytest.approx(9.5)


def test_flexsp_long_sequence_gets_a_large_group_and_steps_fit_memory():
    small = scheme(max_len=10, b=1.0)
    large = scheme(tp=2, max_len=30, b=0.6)
    lengths = np.array([25, 9, 8, 7, 6, 5, 4, 3])
    plan = bl.flexsp(lengths, [small, large], gpus=4)
    for ph in plan.phases:
        tokens = sum(int(plan.lengths[mb].sum()) for p in ph.pipelines for mb in p.micro_batches)
        assert tokens <= 60  # the cluster holds at most 2 x 30 tokens per step
        assert sum(p.scheme.gpus for p in ph.pipelines) + ph.idle_gpus == 4
        for p in ph.pipelines:
            assert all(int(plan.lengths[mb].sum()) <= p.scheme.max_len for mb in p.micro_batches)
    trained = np.concatenate([mb for ph in plan.phases for p in ph.pipelines for mb in p.micro_batches])
    assert sorted(trained.tolist()) == list(range(lengths.size))
    where_25 = [p.scheme.tp for ph in plan.phases for p in ph.pipelines for mb in p.micro_batches if 0 in mb]
    assert where_25 == [2]


def test_flexsp_needs_a_pp1_scheme():
    with pytest.raises(ValueError, match="pp=1"):
        bl.flexsp(np.array([5]), [scheme(pp=2)], gpus=4)


def test_wlb_drain_trains_every_sampled_token():
    s = scheme(max_len=20)
    batches = [np.array([12, 3]), np.array([15, 14, 13, 1])]
    plans = bl.wlb_llm(batches, s, gpus=1, micro_batches_per_pipeline=2, thresholds=[10])
    # 12 waits in iteration 0; the last iteration drains it with 15, 14 and 13: 15 | 14+1 fill the two
    # micro-batches (at most 20 tokens), so 13 and 12 (25 > 20) take a second round of two
    assert sorted(plans[0].lengths.tolist()) == [3]
    assert sorted(plans[1].lengths.tolist()) == [1, 12, 13, 14, 15]
    assert sum(len(p.micro_batches) for p in plans[1].phases[0].pipelines) == 4
    assert plans[1].delayed_token_iters == 12.0
    kept = bl.wlb_llm(batches, s, gpus=1, micro_batches_per_pipeline=2, thresholds=[10], drain=False)
    # without draining, the queue releases one outlier per micro-batch in FIFO order: 12 and 15
    assert sorted(kept[1].lengths.tolist()) == [1, 12, 15]
