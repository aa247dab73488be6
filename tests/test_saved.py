"""What one LLaMA-2 7B-shaped decoder layer keeps for its backward (runtime/saved.py) against the memory model's
per-token activation term, in bf16 at TP 1 and TP 2 with SP; and the norm and SwiGLU that keep only that."""

import pytest
import torch
import torch.nn.functional as F

from hydraplan.core.hardware import MODELS
from hydraplan.runtime import saved
from hydraplan.runtime.attention import Windows
from hydraplan.runtime.model import _RMSNorm, get_config
from hydraplan.runtime.recompute import MODES, swiglu_down

TOKENS = 64  # what a layer keeps is linear in the tokens with FlashAttention's saves: exact per token at any count


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("mode", MODES)
def test_a_7b_layer_keeps_what_the_model_charges(mode, tp):
    cfg = get_config(saved.PROFILE_MODEL)
    got = saved.saved_bytes_per_token(cfg, mode, tp, TOKENS, torch.bfloat16)
    model = saved.model_bytes_per_token(saved.PROFILE_MODEL, mode, tp)
    m = MODELS[saved.PROFILE_MODEL]
    assert model == {"none": 16 * m.hidden + 6 * m.ffn, "selective": 16 * m.hidden + 4 * m.ffn,
                     "full": 2 * m.hidden}[mode] / tp  # the model's documented 16h+6f, 16h+4f, 2h
    # beyond FlashAttention's fp32 log-sum-exp (4 B per head) and the norms' fp32 rstd (4 B each), exactly the model
    stats = 0 if mode == "full" else (4 * m.heads + 8) / tp
    assert got - stats == model
    assert 0.95 * model <= got <= 1.002 * model


def test_the_flash_stand_in_keeps_q_k_v_output_and_lse_and_attends_exactly():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(12, 4, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        o = saved._flash_like_varlen(q, k, v, cu, cu, 7, 7, window_size=(-1, 0), enable_gqa=False)
    assert [tuple(t.shape) for t in kept] == [(12, 4, 8)] * 4 + [(4, 12)] and kept[-1].dtype == torch.float32
    assert kept[3] is o or kept[3].untyped_storage().data_ptr() == o.untyped_storage().data_ptr()
    ref = []
    for a, b in ((0, 5), (5, 12)):
        qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q, k, v))
        ref.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1))
        s = (qs @ ks.transpose(-1, -2)) / 8 ** 0.5
        lse = s.masked_fill(~torch.ones(b - a, b - a, dtype=torch.bool).tril(), float("-inf")).logsumexp(-1)
        torch.testing.assert_close(kept[-1][:, a:b], lse.float(), rtol=0, atol=1e-5)
    ref = torch.cat(ref)
    torch.testing.assert_close(o, ref, rtol=0, atol=1e-12)
    dy = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    for g, r in zip(torch.autograd.grad(o, (q, k, v), dy), torch.autograd.grad(ref, (q, k, v), dy)):
        torch.testing.assert_close(g, r, rtol=0, atol=1e-12)


def test_bottom_right_log_sum_exp():
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(10, 4, 8, generator=gen), torch.randn(14, 2, 8, generator=gen)
    w = Windows(torch.tensor([0, 3, 10], dtype=torch.int32), torch.tensor([0, 3, 14], dtype=torch.int32), 7, 11)
    got = saved._log_sum_exp(q, k, w)
    for h in range(4):
        for (q0, q1), (k0, k1) in (((0, 3), (0, 3)), ((3, 10), (3, 14))):
            s = q[q0:q1, h].double() @ k[k0:k1, h // 2].double().T / 8 ** 0.5
            seen = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool).tril((k1 - k0) - (q1 - q0))
            torch.testing.assert_close(got[h, q0:q1].double(), s.masked_fill(~seen, float("-inf")).logsumexp(-1),
                                       rtol=0, atol=1e-5)


def test_rmsnorm_and_swiglu_gradients_are_exact():
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(7, 16, generator=gen, dtype=torch.float64), torch.randn(16, generator=gen, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: _RMSNorm.apply(a, b, 1e-5), (x.requires_grad_(), w.requires_grad_()))
    g, u = (torch.randn(5, 6, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    wd = torch.randn(6, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    for mode in ("none", "selective"):
        assert torch.autograd.gradcheck(lambda a, b, c: swiglu_down(a, b, c, mode), (g, u, wd))


def test_rmsnorm_keeps_its_input_and_an_fp32_rstd_in_bf16():
    x = torch.randn(6, 32, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(32, dtype=torch.bfloat16, requires_grad=True)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        y = _RMSNorm.apply(x, w, 1e-5)
    assert [(tuple(t.shape), t.dtype) for t in kept] == [((6, 32), torch.bfloat16), ((32,), torch.bfloat16),
                                                        ((6, 1), torch.float32)]
    assert kept[0] is x
    ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16) * w
    assert torch.equal(y, ref)
