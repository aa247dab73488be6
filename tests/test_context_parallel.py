"""Context parallelism in one process: the sharded attention math, with and without Seq1F1B splits, against
unsharded varlen attention (fp64, exact up to summation order) and range checks. The gather itself runs over
gloo in tests/test_run_plan.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hydraplan.runtime.attention import varlen_attention
from hydraplan.runtime.batches import TokenData
from hydraplan.runtime.context_parallel import attend_gathered, check_ranges, shard_batch, shard_splits
from hydraplan.schema import BatchSeq
from hydraplan.solve.cpshard import shard_per_document, shard_per_sequence

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
# and a micro-batch too short for every rank to hold a token (per-sequence: 2 tokens over 2*cp = 6 chunks);
# then Seq1F1B splits cutting documents and shard chunks, an empty split, and splits with no token on some rank.
CASES = [([24], 2, None), ([9, 23, 4, 11], 2, None), ([3, 17, 1, 12, 6], 3, None), ([2], 3, None), ([13, 2, 2, 9], 4, None),
         ([9, 23, 4, 11], 2, [0, 13, 30, 47]), ([24], 2, [0, 5, 24]), ([3, 17, 1, 12, 6], 3, [0, 8, 8, 21, 26, 39]),
         ([13, 2, 2, 9], 4, [0, 2, 14, 26])]


@pytest.mark.parametrize("lengths,cp,bounds", CASES)
@pytest.mark.parametrize("strategy", ["per-sequence", "per-document"])
def test_sharded_attention_equals_unsharded_outputs_and_gradients(lengths, cp, bounds, strategy):
    """Each rank attends its tokens to the gathered K/V (gathered here by concatenation, in a group order
    that differs from the CP order); outputs land on the right tokens and the K/V gradients summed over the
    ranks' uses equal the unsharded ones. With Seq1F1B splits each split's K/V are gathered on their own
    and a rank's share of a split attends to the gathered splits from its key_lo to its own."""
    shard = (shard_per_sequence if strategy == "per-sequence" else shard_per_document)(np.array(lengths), cp)
    ranges = shard.ranges(cp)
    assert check_ranges(ranges, cp, sum(lengths)) is None
    total = sum(lengths)
    bounds = bounds or [0, total]
    q, k, v = qkv(total, seed=cp * 100 + total)
    grad = torch.randn(total, H, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want, want_grads = unsharded(lengths, q, k, v, grad)

    cp_ranks = list(range(cp))[::-1]  # global ranks by CP rank: the group's rank order is reversed
    group_order = sorted(range(cp), key=lambda c: cp_ranks[c])
    kv = torch.cat([k, v], dim=1)

    def share(c: int, lo: int, hi: int) -> torch.Tensor:
        idx = held(ranges[c])
        return idx[(idx >= lo) & (idx < hi)]

    gathered = [torch.cat([kv[share(c, lo, hi)] for c in group_order]) for lo, hi in zip(bounds[:-1], bounds[1:])]
    mb = packed(lengths)
    out = torch.zeros(total, H, D, dtype=torch.float64)
    loss = torch.zeros((), dtype=torch.float64)
    for c in range(cp):
        shares = [shard_batch(mb, ranges, c, cp_ranks, None)] if len(bounds) == 2 else shard_splits(mb, ranges, c, cp_ranks,
                                                                                                     None, bounds)
        for s, local in enumerate(shares):
            lo, hi = bounds[s], bounds[s + 1]
            idx = share(c, lo, hi)
            assert local.tokens.tolist() == mb.tokens[idx].tolist() and local.positions.tolist() == mb.positions[idx].tolist()
            assert local.cp.sizes == [len(share(d, lo, hi)) for d in group_order]
            if lo == hi:
                continue
            o = attend_gathered(q[idx], torch.cat([gathered[j] for j in range(s + 1) if bounds[j] >= local.cp.key_lo]),
                                local.cp)
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
