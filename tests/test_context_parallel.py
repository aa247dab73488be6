"""Context parallelism in one process: the sharded attention math against unsharded varlen attention (fp64,
exact up to summation order) and range checks. The gather itself runs over gloo in tests/test_run_plan.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from planner.cpshard import shard_per_document, shard_per_sequence
from planner.schema import BatchSeq
from runtime.attention import varlen_attention
from runtime.batches import TokenData
from runtime.context_parallel import attend_gathered, check_ranges, shard_batch

H, D = 4, 8


def packed(lengths: list[int]):
    return TokenData(128).pack([BatchSeq(id=i, length=n) for i, n in enumerate(lengths)])


def qkv(total: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(total, H, D, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))


def held(ranges: list[tuple[int, int]]) -> torch.Tensor:
    return torch.cat([torch.arange(s, e) for s, e in ranges]) if ranges else torch.zeros(0, dtype=torch.long)


def unsharded(lengths, q, k, v, grad):
    mb = packed(lengths)
    out = varlen_attention(q, k, v, mb.cu_seqlens, mb.max_seqlen)
    return out.detach(), torch.autograd.grad(out, (q, k, v), grad)


# One long document, packed documents crossing chunk boundaries, more ranks than tokens of a document,
# and a micro-batch too short for every rank to hold a token (per-sequence: 2 tokens over 2*cp = 6 chunks).
CASES = [([24], 2), ([9, 23, 4, 11], 2), ([3, 17, 1, 12, 6], 3), ([2], 3), ([13, 2, 2, 9], 4)]


@pytest.mark.parametrize("lengths,cp", CASES)
@pytest.mark.parametrize("strategy", ["per-sequence", "per-document"])
def test_sharded_attention_equals_unsharded_outputs_and_gradients(lengths, cp, strategy):
    """Each rank attends its tokens to the gathered K/V (gathered here by concatenation, in a group order
    that differs from the CP order); outputs land on the right tokens and the K/V gradients summed over the
    ranks' uses equal the unsharded ones."""
    shard = (shard_per_sequence if strategy == "per-sequence" else shard_per_document)(np.array(lengths), cp)
    ranges = shard.ranges(cp)
    assert check_ranges(ranges, cp, sum(lengths)) is None
    total = sum(lengths)
    q, k, v = qkv(total, seed=cp * 100 + total)
    grad = torch.randn(total, H, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want, want_grads = unsharded(lengths, q, k, v, grad)

    cp_ranks = list(range(cp))[::-1]  # global ranks by CP rank: the group's rank order is reversed
    mb = packed(lengths)
    out = torch.zeros(total, H, D, dtype=torch.float64)
    loss = torch.zeros((), dtype=torch.float64)
    gathered = torch.cat([torch.cat([k, v], dim=1)[held(ranges[c])] for c in sorted(range(cp), key=lambda c: cp_ranks[c])])
    for c in range(cp):
        local = shard_batch(mb, ranges, c, cp_ranks, group=None)
        idx = held(ranges[c])
        assert local.tokens.tolist() == mb.tokens[idx].tolist() and local.positions.tolist() == mb.positions[idx].tolist()
        o = attend_gathered(q[idx], gathered, local.cp)
        out[idx] = o.detach()
        loss = loss + (o * grad[idx]).sum()
    got_grads = torch.autograd.grad(loss, (q, k, v))
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_rank_with_no_tokens_still_joins_the_gathers_backward():
    """Under per-sequence sharding of [2] over 3 ranks one holds nothing; an empty output must still
    depend on the gathered K/V, or the rank's backward would skip the collective the others wait in."""
    ranges = shard_per_sequence(np.array([2]), 3).ranges(3)
    assert [len(r) for r in ranges].count(0) == 1
    c = next(i for i, r in enumerate(ranges) if not r)
    local = shard_batch(packed([2]), ranges, c, [0, 1, 2], group=None)
    gathered = torch.randn(2, 2 * H, D, dtype=torch.float64, requires_grad=True)
    out = attend_gathered(torch.zeros(0, H, D, dtype=torch.float64), gathered, local.cp)
    assert out.shape == (0, H, D) and out.grad_fn is not None
    (g,) = torch.autograd.grad(out.sum(), gathered)
    assert torch.equal(g, torch.zeros_like(gathered))


@pytest.mark.parametrize("ranges,message", [
    ([[(0, 4)]], "1 rank lists but cp=2"),
    ([[(0, 4)], [(4, 11)]], "outside the micro-batch's 10 tokens"),
    ([[(0, 4)], [(3, 10)]], "token 3 is held by 2 ranks"),
    ([[(0, 4)], [(5, 10)]], "token 4 is held by 0 ranks"),
    ([[(6, 10), (0, 4)], [(4, 6)]], "not sorted"),
    ([[(0, 4), (4, 4)], [(4, 10)]], "empty"),
])
def test_check_ranges_names_what_is_wrong(ranges, message):
    assert message in check_ranges(ranges, 2, 10)
