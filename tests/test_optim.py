"""The learning-rate schedule and the decay groups of the sharded optimizer (runtime/optim.py); clipping and the
schedule against torch in a 4-rank run are in tests/test_run_plan.py."""

import math

import pytest
import torch

from hydraplan.runtime.model import TINY, param_specs
from hydraplan.runtime.optim import Schedule, ShardedMaster


def test_warmup_then_each_decay_style():
    lr, lo = 1e-2, 1e-3
    assert [Schedule(lr, warmup=4).lr_at(s) for s in range(6)] == pytest.approx([lr / 4, lr / 2, 3 * lr / 4, lr, lr, lr])
    lin = Schedule(lr, warmup=2, style="linear", min_lr=lo, decay_iters=6)
    assert [lin.lr_at(s) for s in range(8)] == pytest.approx([lr / 2, lr, lr, lr - 9e-3 / 4, lr - 9e-3 / 2,
                                                             lr - 3 * 9e-3 / 4, lo, lo])
    cos = Schedule(lr, warmup=0, style="cosine", min_lr=lo, decay_iters=4)
    assert [cos.lr_at(s) for s in range(5)] == pytest.approx([lr, lo + 9e-3 * (1 + math.cos(math.pi / 4)) / 2,
                                                             (lr + lo) / 2, lo + 9e-3 * (1 + math.cos(3 * math.pi / 4)) / 2,
                                                             lo])


def test_weight_decay_reaches_matrices_only_on_every_shard():
    """A zero gradient leaves AdamW's update at zero, so one step with decay shows exactly what decays: every
    matrix element by 1 - lr*wd, no norm weight, on each of 3 owner shards (a norm cut across shards included)."""
    specs = param_specs(TINY)
    for rank in range(3):
        m = ShardedMaster(TINY, rank, 3, torch.float64, 0, 0.5)
        before = m.weights.detach().clone()
        m.step(torch.zeros_like(before))
        ratio = m.weights.detach() / before
        kinds = []
        for s in specs:
            n = (rank + 1) * s.numel // 3 - rank * s.numel // 3
            kinds += [len(s.shape) > 1] * n
        kinds = torch.tensor(kinds)
        assert torch.allclose(ratio[kinds], torch.full_like(ratio[kinds], 1 - 0.5 * 0.1), rtol=0, atol=1e-15)
        assert torch.equal(ratio[~kinds], torch.ones_like(ratio[~kinds])) and (~kinds).any()
