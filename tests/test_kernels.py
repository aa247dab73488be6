"""run_plan --compile (runtime/kernels.py): the torch.compile'd elementwise blocks (inductor, C++ on CPU) train the
tiny model like eager, and a layer keeps for its backward what it keeps eager."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from hydraplan.runtime import kernels, saved
from hydraplan.runtime.batches import TokenData
from hydraplan.runtime.model import TINY, StageModule, init_full, load_full, param_specs
from hydraplan.schema import BatchSeq


@pytest.fixture(scope="module")
def compiled():
    """One compiled set for the module: inductor compiles each block once (dynamic shapes), in this process."""
    torch._dynamo.reset()  # the blocks compile here even if another test compiled them in this process
    return kernels.compiled("inductor")


def _train(dtype: torch.dtype, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss and gradient of one micro-batch of documents of `lengths` (the tiny model, seeded weights)."""
    module = StageModule(TINY, dtype=dtype)
    load_full(module, [init_full(s, i, 0, dtype) for i, s in enumerate(param_specs(TINY))])
    loss = module(None, TokenData(TINY.vocab).pack([BatchSeq(id=i, length=n) for i, n in enumerate(lengths)]))
    loss.backward()
    return loss.detach(), torch.cat([p.grad.reshape(-1) for p in module.ordered_params()])


def test_compiled_blocks_train_like_eager_in_fp64(compiled):
    """Every block runs compiled (six compiled frames) and the loss and gradient equal eager's to fp64 rounding
    (fused kernels reassociate: measured 0 and 3.6e-15)."""
    want_loss, want_grad = _train(torch.float64, [40, 24])
    counters.clear()
    with kernels.using(compiled):
        loss, grad = _train(torch.float64, [40, 24])
    assert counters["frames"]["ok"] >= len(kernels.EAGER.__dataclass_fields__)
    assert float((loss - want_loss).abs()) <= 1e-12
    assert float((grad - want_grad).abs().max()) <= 1e-12 * float(want_grad.abs().max())
    assert kernels.active() is kernels.EAGER  # the scope restored eager


@pytest.mark.parametrize("mode", ["none", "selective"])
def test_a_compiled_layer_keeps_what_an_eager_one_keeps(compiled, mode):
    """RMSNorm and SwiGLU save through their autograd Functions (compiled math inside), RoPE through AOTAutograd's
    partition: the distinct storages a layer keeps for its backward are the eager layer's, byte for byte."""
    eager = saved.saved_bytes_per_token(TINY, mode, 1, 48, torch.float64)
    with kernels.using(compiled):
        got = saved.saved_bytes_per_token(TINY, mode, 1, 48, torch.float64)
    assert got == eager
