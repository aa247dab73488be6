"""The canonical estimate of docs/formats.md, checked against hand-computed values."""

import pytest

from hydraplan.core.cluster import for_gpus, max_len_for_gpus
from hydraplan.core.cost import micro_batch_time, pipeline_time, seq_time
from hydraplan.core.errors import UserError
from hydraplan.schema import GPUInfo, ModelInfo, Profile, ProfileMemory, Scheme, SchemeMemory, TimeCoeffs


def scheme(tp=1, pp=1, cp=1, a=1.0, b=10.0, c=100.0, max_len=1000, memory=None):
    return Scheme(tp=tp, pp=pp, cp=cp, max_len=max_len, util_len=10, time=TimeCoeffs(a=a, b=b, c=c), memory=memory)


def profile(*schemes, capacity=None):
    return Profile(
        name="t", gpu=GPUInfo(name="g", memory_gib=80), model=ModelInfo(name="m", layers=4, hidden=8),
        schemes=list(schemes), memory=ProfileMemory(capacity_bytes=capacity) if capacity else None,
    )


def test_micro_batch_and_pipeline_time_by_hand():
    s = scheme(pp=3, a=1.0, b=10.0, c=100.0)
    assert seq_time(s, 2) == 2 * 2 + 10 * 2 + 100  # 124
    assert micro_batch_time(s, [2, 3]) == (4 + 20) + (9 + 30) + 100  # 163
    # micro-batches 163 and 124: sum 287 plus (pp-1)=2 times the largest 163
    assert pipeline_time(s, [[2, 3], [2]]) == 287 + 2 * 163
    assert pipeline_time(s, []) == 0.0


def test_max_len_follows_cluster_size():
    mem = SchemeMemory(sharded_bytes=6400.0, local_bytes=100.0, act_bytes_per_token=2.0)
    p = profile(scheme(memory=mem), capacity=1000.0)
    s = p.schemes[0]
    assert max_len_for_gpus(p, s, 64) == (1000 - 100 - 6400 // 64) // 2  # 400
    assert max_len_for_gpus(p, s, 8) == (1000 - 100 - 800) // 2  # 50
    assert max_len_for_gpus(p, s, 4) == 0  # the states alone overflow: 1600 sharded bytes per GPU
    assert max_len_for_gpus(p, s, 1024) > max_len_for_gpus(p, s, 64)


def test_scheme_without_memory_constants_keeps_its_max_len():
    p = profile(scheme(max_len=777), capacity=1000.0)
    assert max_len_for_gpus(p, p.schemes[0], 4) == 777


def test_for_gpus_drops_schemes_that_do_not_fit():
    p = profile(scheme(tp=1), scheme(tp=8))
    assert [s.tp for s in for_gpus(p, 4).schemes] == [1]
    with pytest.raises(UserError, match=r"no scheme fits in 4 GPUs \(the smallest job it fits has 8 GPUs\)"):
        for_gpus(profile(scheme(tp=8)), 4)


def test_for_gpus_names_the_smallest_job_the_sharded_states_fit_in():
    """1200 bytes of weights and optimizer states sharded over N, 100 local, 10 per token, 1000 usable:
    one GPU overflows, two leave 1000 - 100 - 600 = 300 bytes for activations (30 tokens)."""
    p = profile(scheme(memory=SchemeMemory(sharded_bytes=1200.0, local_bytes=100.0, act_bytes_per_token=10.0)),
                capacity=1000.0)
    with pytest.raises(UserError, match=r"no scheme fits in 1 GPUs \(the smallest job it fits has 2 GPUs\)"):
        for_gpus(p, 1)
    assert for_gpus(p, 2).schemes[0].max_len == 30
