"""varlen attention against a per-document reference (explicit softmax), fp64, forward and backward."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hydraplan.runtime.attention import varlen_attention


def reference(q, k, v, lengths):
    """Each document on its own, written out: softmax(q k^T / sqrt(d) + causal mask) v."""
    outs, at = [], 0
    group = q.shape[1] // k.shape[1]
    for n in lengths:
        qd, kd, vd = (t[at:at + n].transpose(0, 1) for t in (q, k, v))  # [H, n, D]
        kd, vd = kd.repeat_interleave(group, 0), vd.repeat_interleave(group, 0)
        scores = qd @ kd.transpose(1, 2) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        outs.append((scores.softmax(-1) @ vd).transpose(0, 1))
        at += n
    return torch.cat(outs)


def cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.parametrize("lengths,hq,hkv", [([5, 1, 9, 3], 4, 4), ([16], 2, 2), ([7, 7, 2], 4, 2), ([1, 1, 1], 2, 1)])
def test_matches_per_document_reference_forward_and_backward(lengths, hq, hkv):
    gen = torch.Generator().manual_seed(sum(lengths) * hq + hkv)
    T, D = sum(lengths), 8
    q, k, v = (torch.randn(T, h, D, generator=gen, dtype=torch.float64, requires_grad=True) for h in (hq, hkv, hkv))
    upstream = torch.randn(T, hq, D, generator=gen, dtype=torch.float64)

    out = varlen_attention(q, k, v, cu(lengths), max(lengths))
    grads = torch.autograd.grad(out, (q, k, v), upstream)
    ref = reference(q, k, v, lengths)
    ref_grads = torch.autograd.grad(ref, (q, k, v), upstream)

    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for g, rg in zip(grads, ref_grads):
        torch.testing.assert_close(g, rg, rtol=0, atol=1e-12)


def test_documents_never_see_each_other():
    """Changing one document's keys/values leaves every other document's output unchanged."""
    gen = torch.Generator().manual_seed(0)
    lengths = [4, 6, 3]
    q, k, v = (torch.randn(13, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    base = varlen_attention(q, k, v, cu(lengths), 6)
    k2, v2 = k.clone(), v.clone()
    k2[4:10] += 1.0
    v2[4:10] -= 2.0
    moved = varlen_attention(q, k2, v2, cu(lengths), 6)
    torch.testing.assert_close(moved[:4], base[:4], rtol=0, atol=0)
    torch.testing.assert_close(moved[10:], base[10:], rtol=0, atol=0)
    assert not torch.allclose(moved[4:10], base[4:10])


def test_fallback_work_is_per_document(monkeypatch):
    """The CPU fallback computes sum_i l_i^2 attention scores per head (the cost model's a*l^2 per
    sequence), never (sum_i l_i)^2: every SDPA call is causal over one document length, maskless."""
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, **kw):
        calls.append((tuple(q.shape), tuple(k.shape), attn_mask, is_causal))
        return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    lengths, hq, hkv = [5, 3, 5, 1, 3, 7], 4, 2
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(sum(lengths), h, 8, generator=gen, dtype=torch.float64) for h in (hq, hkv, hkv))
    out = varlen_attention(q, k, v, cu(lengths), max(lengths))
    torch.testing.assert_close(out, reference(q, k, v, lengths), rtol=0, atol=1e-12)
    assert calls and all(mask is None and causal for _, _, mask, causal in calls)
    assert all(qs[-2] == ks[-2] and qs[-2] in lengths for qs, ks, _, _ in calls)  # one document per row
    scores = sum(qs[0] * qs[1] * qs[2] * ks[2] for qs, ks, _, _ in calls)  # batch * heads * l_q * l_k
    assert scores == hq * sum(n * n for n in lengths)


def test_zero_length_documents_are_allowed():
    gen = torch.Generator().manual_seed(2)
    lengths = [3, 0, 4]
    q, k, v = (torch.randn(7, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    out = varlen_attention(q, k, v, cu(lengths), 4)
    torch.testing.assert_close(out, reference(q, k, v, [3, 4]), rtol=0, atol=1e-12)
