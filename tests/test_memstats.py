"""Peak heap bytes (runtime/memstats.py) and the per-rank memory model run_plan --memory compares them with."""

import pytest
import torch

from hydraplan.core.memory import rank_memory, rank_memory_bytes
from hydraplan.runtime.memstats import PeakHeap, heap_bytes
from hydraplan.schema import GPUInfo, ModelInfo, Profile, Scheme, SchemeMemory, TimeCoeffs

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


def _profile(model: ModelInfo | None = None) -> Profile:
    return Profile(name="p", gpu=GPUInfo(name="g", memory_gib=1), model=model or ModelInfo(name="m", layers=2, hidden=8),
                   schemes=[_scheme()])


def test_rank_memory_model_of_measured_and_analytic_profiles():
    entries = [
        {"stage": 0, "fixed_bytes": 1000.0, "stash": 2, "act_bytes_per_token2": 0.5, "act_bytes_per_token": 30.0,
         "lnk_bytes": 0.0},
        {"stage": 1, "fixed_bytes": 2000.0, "stash": 1, "act_bytes_per_token2": 0.0, "act_bytes_per_token": 40.0,
         "lnk_bytes": 0.0}]
    measured = _scheme(measured_memory=entries)
    prof = _profile()
    assert rank_memory_bytes(prof, measured, 0, 4, 100) == 1000 + 2 * (0.5 * 100**2 + 30 * 100)
    assert rank_memory_bytes(prof, measured, 1, 4, 100) == 2000 + 40 * 100
    assert rank_memory_bytes(prof, measured, 2, 4, 100) is None
    analytic = _scheme(memory=SchemeMemory(sharded_bytes=8e9, local_bytes=1e9, act_bytes_per_token=1e5))
    assert rank_memory_bytes(prof, analytic, 1, 64, 4096) == 8e9 / 64 + 1e9 + 1e5 * 4096
    assert rank_memory_bytes(prof, _scheme(), 0, 4, 10) is None


def test_lnk_terms_of_a_profile_measured_before_they_were_counted():
    """Without lnk_bytes, the measured model adds LNK's bounded windows and the owner gradient: per direction
    `depth` groups of (this rank's slice + at most the whole largest group) values, here of layers of
    4*8^2 + 3*8*16 + 2*8 = 656 params next to embedding 16*8 = 128 and head 136."""
    from hydraplan.core.memory import LNK_PULL_DEPTH, LNK_PUSH_DEPTH

    model = ModelInfo(name="m", layers=2, hidden=8, ffn=16, heads=2, vocab=16, params=2 * 656 + 128 + 136)
    entry = {"stage": 0, "fixed_bytes": 1000.0, "stash": 1, "act_bytes_per_token2": 0.0, "act_bytes_per_token": 1.0}
    mem = rank_memory(_profile(model), _scheme(measured_memory=[entry]), 0, 4, 10, value_bytes=2)
    terms = {t.name: t.bytes for t in mem.terms}
    assert terms["lnk_pull"] == LNK_PULL_DEPTH * (656 / 1 + 656) * 2
    assert terms["lnk_push"] == LNK_PUSH_DEPTH * (656 + 656) * 2
    assert terms["owner_gradient"] == model.params * 4 / 4
    assert mem.total == pytest.approx(1000 + 10 + terms["lnk_pull"] + terms["lnk_push"] + terms["owner_gradient"])
