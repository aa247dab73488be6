"""Peak heap bytes (runtime/memstats.py) and the per-rank memory model run_plan --memory compares them with."""

import pytest
import torch

from hydraplan.core.memory import rank_memory_bytes
from hydraplan.runtime.memstats import PeakHeap, heap_bytes
from hydraplan.schema import Scheme, SchemeMemory, TimeCoeffs

MB = 10**6
SLACK = 2**18  # small allocations of the dispatcher and the interpreter around the tensors


def test_peak_heap_sees_exactly_the_tensors_alive_together():
    assert heap_bytes() is not None  # this machine's libc is glibc: the measurement must be available
    warm = torch.ones(16) + 1  # first-use allocations of the dispatcher happen outside the measurement
    with PeakHeap() as p:
        warm = warm + 1
    for _ in range(2):
        with PeakHeap() as p:
            a = torch.empty(5_000_000, dtype=torch.float32)  # 20 MB
            b = a + 1  # 40 MB alive together
            del a
            c = torch.zeros(2_500_000, dtype=torch.float64)  # 20 MB, while b lives: 40 MB again, not more
            del b, c
        assert p.peak - p.start == pytest.approx(40 * MB, abs=SLACK)
        with PeakHeap() as q:
            d = torch.zeros(1_000_000, dtype=torch.float64) * 2  # 8 MB, then a second 8 MB for the product
            del d
        assert q.peak - q.start == pytest.approx(16 * MB, abs=SLACK)


def _scheme(**kw) -> Scheme:
    return Scheme(tp=1, pp=2, cp=1, max_len=1000, util_len=100, time=TimeCoeffs(a=1e-9, b=1e-5, c=1e-3), **kw)


def test_rank_memory_model_of_measured_and_analytic_profiles():
    measured = _scheme(measured_memory=[
        {"stage": 0, "fixed_bytes": 1000.0, "stash": 2, "act_bytes_per_token2": 0.5, "act_bytes_per_token": 30.0},
        {"stage": 1, "fixed_bytes": 2000.0, "stash": 1, "act_bytes_per_token2": 0.0, "act_bytes_per_token": 40.0}])
    assert rank_memory_bytes(measured, 0, 4, 100) == 1000 + 2 * (0.5 * 100**2 + 30 * 100)
    assert rank_memory_bytes(measured, 1, 4, 100) == 2000 + 40 * 100
    assert rank_memory_bytes(measured, 2, 4, 100) is None
    analytic = _scheme(memory=SchemeMemory(sharded_bytes=8e9, local_bytes=1e9, act_bytes_per_token=1e5))
    assert rank_memory_bytes(analytic, 1, 64, 4096) == 8e9 / 64 + 1e9 + 1e5 * 4096
    assert rank_memory_bytes(_scheme(), 0, 4, 10) is None
