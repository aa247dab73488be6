"""Megatron's sequence-packing seam (Megatron-LM main's DpBalancedScheduler; in no megatron-core release yet, so its
code is not downloaded): dp_balanced as its code states it (in-order next-fit packs, the pack count padded to the
multiple by moving last documents into packs of their own, pack i*dp + d to replica d on all its cp ranks) on the
cases of Megatron's tests/unit_tests/test_sequence_packing.py, and the plugin obeying the same executor and never
slower on a batch."""

from __future__ import annotations

import enum
import sys
import types

import numpy as np
import pytest

from hydraplan.core.executors import MegatronPacking, packing_padded, packing_violations
from hydraplan.integrations import megatron as integ
from hydraplan.solve.megatron.dp_balanced import dp_balanced_schedule
from hydraplan.store.datasets import load_dataset, sample_iterations
from hydraplan.store.profiles import load_profile

# Megatron's test_wrap_dataloader: 8 ranks, max_seqlen_per_dp_cp_rank 8192, 64 lengths in [2048, 8192] padded to 16,
# microbatch_group_size_per_vp_stage = pp (used with VPP)
CASES = [(1, 1, 8, None), (2, 1, 4, None), (2, 4, 1, None), (2, 2, 1, None), (1, 4, 1, 4)]
WORLD, PER_RANK = 8, 8192


def case_lengths(seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(-(-x // 16) * 16) for x in rng.integers(2048, 8193, 64)]


def next_fit(lengths: list[int], capacity: int) -> list[list[int]]:
    packs, cur, used = [], [], 0
    for i, l in enumerate(lengths):
        if cur and used + l > capacity:
            packs.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += l
    return packs + [cur]


@pytest.mark.parametrize("tp,pp,cp,vpp", CASES)
def test_dp_balanced_contract_on_megatrons_cases(tp, pp, cp, vpp):
    dp = WORLD // (tp * pp * cp)
    group = pp if vpp else None
    multiple = dp * (group or 1)
    capacity = PER_RANK * cp
    for seed in range(10):
        lengths = case_lengths(seed)
        groups = dp_balanced_schedule(lengths, capacity, dp, cp, group)
        assert packing_violations(groups, lengths, dp, cp, capacity, multiple) == []
        packs = [mb[d * cp] for mb in groups for d in range(dp)]  # pack i*dp + d is replica d's micro-batch i
        # the packs are next-fit in batch order, then the last documents moved, one per new pack, from the back
        fit = next_fit(lengths, capacity)
        moved = len(packs) - len(fit)
        assert 0 <= moved < multiple and len(packs) % multiple == 0
        tail = [p[0] for p in packs[len(fit):]]
        assert all(len(p) == 1 for p in packs[len(fit):])
        restored = [list(p) for p in packs[:len(fit)]]
        for i in tail:  # give each moved document back to the pack it left
            k = next(k for k, p in enumerate(fit) if i in p)
            restored[k].append(i)
        assert [sorted(p) for p in restored] == fit
        assert all(p == sorted(p) for p in packs)


def test_dp_balanced_by_hand():
    """Five documents of 5 tokens, packs of 10, dp 2: [0,1] [2,3] [4] is three packs, so 3 leaves [2,3] for a
    pack of its own; micro-batch 0 is ([0,1], [2]), micro-batch 1 ([4], [3]); with cp 2 each replica's two ranks
    list the same pack."""
    assert dp_balanced_schedule([5] * 5, 10, 2, 1) == [[[0, 1], [2]], [[4], [3]]]
    assert dp_balanced_schedule([5] * 5, 10, 2, 2) == [[[0, 1], [0, 1], [2], [2]], [[4], [4], [3], [3]]]


@pytest.fixture(scope="module")
def profile():
    return load_profile("h100-llama2-7b")


@pytest.mark.parametrize("tp,pp,cp,vpp", CASES)
def test_plugin_obeys_the_executor_and_is_never_slower_on_megatrons_cases(profile, tp, pp, cp, vpp):
    dp = WORLD // (tp * pp * cp)
    group = pp if vpp else 1
    target = MegatronPacking.of(profile, tp=tp, pp=pp, cp=cp, dp=dp, capacity=PER_RANK * cp, multiple=dp * group)
    for seed in range(10):
        lengths = case_lengths(seed)
        ours = integ.schedule_packing(lengths, profile=profile, tp=tp, pp=pp, cp=cp, dp=dp, capacity=PER_RANK * cp,
                                      multiple=group)
        assert packing_violations(ours, lengths, dp, cp, PER_RANK * cp, dp * group) == []
        theirs = dp_balanced_schedule(lengths, PER_RANK * cp, dp, cp, group if vpp else None)
        assert max(target.propagation_s(ours, lengths)) <= max(target.propagation_s(theirs, lengths)) * (1 + 1e-12)


def test_plugin_is_faster_than_dp_balanced_on_wikipedia(profile):
    """<2,1,4> x 8 at 32K (the layout compare's Megatron baseline takes): dp_balanced's in-order packs leave the
    replicas unbalanced; hydraplan's dispatch balances them (>= 1.2x on every batch here, propagation)."""
    target = MegatronPacking.of(profile, tp=2, pp=1, cp=4, dp=8, capacity=48036 // 4 * 4, multiple=8)
    for b in sample_iterations(load_dataset("builtin:wikipedia", 32768), 200_000, 5, 0):
        ours = integ.schedule_packing(b.lengths, profile=profile, tp=2, pp=1, cp=4, dp=8, capacity=target.capacity)
        theirs = dp_balanced_schedule(b.lengths.tolist(), target.capacity, 8, 4)
        assert max(target.propagation_s(theirs, b.lengths)) >= 1.2 * max(target.propagation_s(ours, b.lengths))


class PackingSchedulerEnum(enum.Enum):
    DP_BALANCED = "dp_balanced"


class FakeDpBalanced:
    """Megatron's BasePackingScheduler interface as wrap_data_iterator uses it."""

    def __init__(self, max_seqlen_per_dp_cp_rank, cp_size, dp_size, microbatch_group_size_per_vp_stage):
        self.max_seqlen_per_dp_cp_rank = max_seqlen_per_dp_cp_rank
        self.cp_size, self.dp_size = cp_size, dp_size
        self.microbatch_group_size_per_vp_stage = microbatch_group_size_per_vp_stage

    def run(self, data_iterator, num_microbatches, dp_group, tp_group, pp_group, dp_cp_group, dev, config):
        return self.get_groups_and_subsamples(data_iterator)


@pytest.mark.parametrize("key", [PackingSchedulerEnum.DP_BALANCED, "dp_balanced"])
def test_install_replaces_dp_balanced_in_scheduler_map_and_uninstalls(monkeypatch, profile, key):
    data_schedule = types.ModuleType(integ.DATA_SCHEDULE)
    data_schedule.BalancedCPScheduler = object
    data_schedule.scheduler_map = {key: FakeDpBalanced}
    monkeypatch.setitem(sys.modules, integ.DATA_SCHEDULE, data_schedule)
    uninstall = integ.install("h100-llama2-7b", seams=("packing",))
    assert data_schedule.BalancedCPScheduler is object  # only the seam asked for
    cls = data_schedule.scheduler_map[key]
    assert issubclass(cls, FakeDpBalanced)
    lengths = case_lengths(3)
    config = types.SimpleNamespace(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                                   recompute_granularity=None)
    got = cls(PER_RANK, 1, 2, None).run([(i, l) for i, l in enumerate(lengths)], 64, None, None, None, None, None, config)
    assert got == integ.schedule_packing(lengths, profile=profile, tp=2, pp=2, cp=1, dp=2, capacity=PER_RANK)
    uninstall()
    assert data_schedule.scheduler_map[key] is FakeDpBalanced


def test_varlen_samples_are_padded_to_twice_cp_times_tp():
    """Megatron's varlen dataset at a fixed CP size: a multiple of 2 x CP, times TP with sequence parallelism; none
    without CP and TP."""
    assert packing_padded([1, 8, 9, 16], cp=4).tolist() == [8, 8, 16, 16]
    assert packing_padded([1, 8, 9], cp=1).tolist() == [1, 8, 9]
    assert packing_padded([1, 17], cp=2, tp=4).tolist() == [16, 32]
    assert packing_padded([1, 17], cp=2, tp=4, sequence_parallel=False).tolist() == [4, 20]
