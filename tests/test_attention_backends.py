"""The CUDA attention backends without a GPU: the capability-based selection with stand-in capabilities,
and each kernel's call path (plain packed documents, Seq1F1B splits with cached K/V, CP shares, the whole
model) with the kernel replaced by a CPU implementation of its documented semantics that also checks the
arguments it is given (int32 offsets from 0 to the token counts, exact max lengths, GQA, causal flags).
Every path must equal the exact per-document SDPA fallback in fp64, outputs and gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import hydraplan.runtime.attention as attention
from hydraplan.runtime.attention import Capability, Choice, Windows, choose_backend, exact_window_attention, window_attention
from hydraplan.runtime.batches import TokenData
from hydraplan.runtime.context_parallel import attend_gathered, shard_splits
from hydraplan.runtime.model import CONFIGS, StageModule, init_full, load_full, param_specs
from hydraplan.runtime.seq1f1b import cached_attention, split_views
from hydraplan.schema import BatchSeq
from hydraplan.solve.cpshard import shard_per_document

BF, FP = torch.bfloat16, torch.float16
H100 = Capability(cuda=True, compute_capability=(9, 0), torch_varlen=True, flash_attn=None)


# ------------------------------------------------------------------------------------------ selection
@pytest.mark.parametrize("cap,dtype,head_dim,backend,reason", [
    (Capability(cuda=False), BF, 128, "sdpa-per-document", "not a CUDA device"),
    (H100, BF, 128, "torch-varlen", "torch varlen_attn"),
    (Capability(cuda=True, compute_capability=(9, 0), torch_varlen=True, fa3=True), BF, 128, "torch-varlen-fa3",
     "FlashAttention-3"),
    (Capability(cuda=True, compute_capability=(8, 0), torch_varlen=True, fa3=True), BF, 128, "torch-varlen", "sm80"),
    (Capability(cuda=True, compute_capability=(10, 0), torch_varlen=True, fa3=True), BF, 128, "torch-varlen", "sm100"),
    (Capability(cuda=True, compute_capability=(9, 0), torch_varlen=True, fa3=True), torch.float32, 128,
     "sdpa-per-document", "fp16/bf16 only"),
    (H100, FP, 64, "torch-varlen", "sm90"),
    (H100, torch.float32, 128, "sdpa-per-document", "fp16/bf16 only"),
    (H100, torch.float64, 128, "sdpa-per-document", "fp16/bf16 only"),
    (H100, BF, 12, "sdpa-per-document", "head dim 12"),
    (H100, BF, 512, "sdpa-per-document", "head dim 512"),
    (Capability(cuda=True, compute_capability=(7, 5), torch_varlen=True, flash_attn="2.6.3"), BF, 128,
     "sdpa-per-document", "compute capability 7.5 < 8.0"),
    (Capability(cuda=True, compute_capability=(8, 0), torch_varlen=True, flash_attn="2.6.3"), BF, 128, "torch-varlen", "sm80"),
    (Capability(cuda=True, compute_capability=(8, 6), torch_varlen=False, flash_attn="2.6.3"), BF, 128,
     "flash-attn", "flash-attn 2.6.3 >= 2.1"),
    (Capability(cuda=True, compute_capability=(9, 0), torch_varlen=False, flash_attn="2.1.0"), FP, 256, "flash-attn", "2.1.0"),
    (Capability(cuda=True, compute_capability=(9, 0), torch_varlen=False, flash_attn="2.0.9"), BF, 128,
     "sdpa-per-document", "2.0.9 < 2.1"),
    (Capability(cuda=True, compute_capability=(9, 0), torch_varlen=False, flash_attn="1.0.9"), BF, 128,
     "sdpa-per-document", "1.0.9 < 2.1"),
    (Capability(cuda=True, compute_capability=(9, 0), torch_varlen=False, flash_attn=None), BF, 128,
     "sdpa-per-document", "neither"),
])
def test_backend_selection_by_capability(cap, dtype, head_dim, backend, reason):
    choice = choose_backend(cap, dtype, head_dim)
    assert choice.backend == backend
    assert reason in choice.reason


def test_this_machine_probes_as_cpu_and_logs_the_choice(caplog):
    attention.choice_for.cache_clear()
    with caplog.at_level("INFO", logger="hydraplan.runtime.attention"):
        assert attention.backend_for(torch.zeros(3, 2, 8, dtype=BF)) == "sdpa-per-document"
    assert "attention backend sdpa-per-document on cpu: not a CUDA device" in caplog.text
    assert attention.probe(torch.device("cpu")) == Capability(cuda=False)


# ------------------------------------------------------------------------------- kernel stand-ins
def kernel_reference(q, k, v, cu_q, cu_k, max_q, max_k, calls, bottom_right=True):
    """What FlashAttention-2's varlen kernels compute (and check), written out on the CPU: segment i's
    queries cu_q[i]:cu_q[i+1] attend to keys cu_k[i]:cu_k[i+1], query r seeing key c iff
    c <= r + l_k - l_q (bottom-right causal; top-left: c <= r)."""
    assert cu_q.dtype == torch.int32 and cu_k.dtype == torch.int32
    assert cu_q.device == q.device and cu_k.device == q.device
    assert cu_q.shape == cu_k.shape and int(cu_q[0]) == 0 and int(cu_k[0]) == 0
    assert int(cu_q[-1]) == q.shape[0] and int(cu_k[-1]) == k.shape[0] == v.shape[0]
    lq, lk = torch.diff(cu_q).tolist(), torch.diff(cu_k).tolist()
    assert isinstance(max_q, int) and isinstance(max_k, int)
    assert max_q == max(lq) and max_k == max(lk)
    assert all(a <= b for a, b in zip(lq, lk))
    assert q.shape[1] % k.shape[1] == 0
    calls.append((lq, lk))
    group = q.shape[1] // k.shape[1]
    outs = []
    for qd, kd, vd, a, b in zip(q.split(lq), k.split(lk), v.split(lk), lq, lk):
        qd = qd.transpose(0, 1)
        kd, vd = (t.transpose(0, 1).repeat_interleave(group, 0) for t in (kd, vd))
        scores = qd @ kd.transpose(1, 2) / math.sqrt(q.shape[-1])
        shift = b - a if bottom_right else 0
        hidden = torch.arange(b)[None, :] > torch.arange(a)[:, None] + shift
        outs.append((scores.masked_fill(hidden, float("-inf")).softmax(-1) @ vd).transpose(0, 1))
    return torch.cat(outs)


@pytest.fixture(params=["torch-varlen", "torch-varlen-fa3", "flash-attn"])
def kernel(request, monkeypatch):
    """Route attention through one backend's call path with its kernel replaced by `kernel_reference`;
    yields the list of the kernel's calls (segment lengths). torch-varlen-fa3 is torch-varlen's call with torch's
    FA3 kernels switched in: the fake checks which kernels the call would reach."""
    calls: list = []
    if request.param.startswith("torch-varlen"):
        switched = {"fa3": None}
        monkeypatch.setattr(attention, "_flash_impl", lambda fa3: switched.__setitem__("fa3", fa3))

        def fake(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size, enable_gqa):
            assert switched["fa3"] == (request.param == "torch-varlen-fa3")
            assert window_size == (-1, 0)  # torch's causal
            assert enable_gqa == (k.shape[1] != q.shape[1])
            return kernel_reference(q, k, v, cu_q, cu_k, max_q, max_k, calls)

        monkeypatch.setattr(attention, "_torch_varlen_fn", lambda: fake)
    else:
        def fake(q, k, v, cu_q, cu_k, max_q, max_k, *, causal):
            assert causal is True
            return kernel_reference(q, k, v, cu_q, cu_k, max_q, max_k, calls)

        monkeypatch.setattr(attention, "_flash_attn_fn", lambda: fake)
    monkeypatch.setattr(attention, "select", lambda q: Choice(request.param, "test"))
    return calls


def qkv(T, hq, hkv, seed, D=8):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(T, h, D, generator=gen, dtype=torch.float64, requires_grad=True) for h in (hq, hkv, hkv))


def packed(lengths, first_id=0):
    return TokenData(128).pack([BatchSeq(id=first_id + i, length=n) for i, n in enumerate(lengths)])


def assert_same(out, ref, inputs, seed):
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for a, b in zip(torch.autograd.grad(out, inputs, upstream, retain_graph=True),
                    torch.autograd.grad(ref, inputs, upstream, retain_graph=True)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------- call paths
@pytest.mark.parametrize("lengths,hq,hkv", [([5, 1, 9, 3], 4, 4), ([7, 7, 2], 4, 2), ([16], 2, 1)])
def test_plain_packed_documents(kernel, lengths, hq, hkv):
    q, k, v = qkv(sum(lengths), hq, hkv, seed=sum(lengths))
    mb = packed(lengths)
    out = window_attention(q, k, v, mb.windows)
    assert kernel == [(lengths, lengths)]
    assert_same(out, exact_window_attention(q, k, v, mb.windows), (q, k, v), 1)


@pytest.mark.parametrize("lengths,bounds", [([5, 9, 3], [0, 7, 11, 17]), ([17], [0, 2, 3, 10, 17]), ([6, 2], [0, 3, 3, 8])])
def test_seq1f1b_splits_with_cached_keys(kernel, lengths, bounds):
    """Split queries against their cached key windows: q_len < k_len, bottom-right aligned."""
    q, k, v = qkv(sum(lengths), 4, 2, seed=3)
    mb = packed(lengths)
    for view in split_views(mb, bounds):
        if not view.tokens:
            continue
        args = (q[view.lo:view.hi], k[view.key_lo:view.hi], v[view.key_lo:view.hi])
        assert_same(cached_attention(*args, view), exact_window_attention(*args, view.windows), (q, k, v), view.lo)
    assert any(lq != lk for lq, lk in kernel)  # some split attended to cached keys


@pytest.mark.parametrize("lengths,cp,bounds", [([9, 23, 4, 11], 2, None), ([3, 17, 1, 12, 6], 3, [0, 8, 21, 26, 39])])
def test_context_parallel_shares(kernel, lengths, cp, bounds):
    """A CP rank's runs against the gathered K/V of their documents (gathered here by concatenation)."""
    total = sum(lengths)
    bounds = bounds or [0, total]
    ranges = shard_per_document(np.array(lengths), cp).ranges(cp)
    q, k, v = qkv(total, 4, 4, seed=5)
    kv = torch.cat([k, v], dim=1)
    mb = packed(lengths)
    for c in range(cp):
        for s, local in enumerate(shard_splits(mb, ranges, c, list(range(cp)), None, bounds)):
            if not local.num_tokens:
                continue
            held = [torch.cat([torch.arange(max(a, bounds[j]), min(b, bounds[j + 1])) for a, b in ranges[d]
                               if max(a, bounds[j]) < min(b, bounds[j + 1])] or [torch.zeros(0, dtype=torch.long)])
                    for j in range(s + 1) if bounds[j] >= local.cp.key_lo for d in range(cp)]
            gathered = kv[torch.cat(held)]
            mine = local.positions.new_tensor([i for i in range(total) if any(a <= i < b for a, b in ranges[c])
                                               and bounds[s] <= i < bounds[s + 1]])
            out = attend_gathered(q[mine], gathered, local.cp)
            sel = gathered.index_select(0, local.cp.key_index)
            ref = exact_window_attention(q[mine], *sel.chunk(2, dim=1), local.cp.windows)
            assert_same(out, ref, (q, k, v), c)
    assert kernel and any(lq != lk for lq, lk in kernel)


def test_whole_model_loss_and_gradients(kernel, monkeypatch):
    cfg = CONFIGS["tiny"]
    full = [init_full(s, i, 3, torch.float64) for i, s in enumerate(param_specs(cfg))]
    mb = packed([7, 12, 5])
    grads = []
    for _ in range(2):  # the kernel's call path, then the exact fallback
        mod = StageModule(cfg, dtype=torch.float64)
        load_full(mod, full)
        mod(None, mb).backward()
        grads.append([p.grad for p in mod.ordered_params()])
        monkeypatch.setattr(attention, "select", lambda q: Choice("sdpa-per-document", "reference"))
    assert len(kernel) == cfg.layers
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_top_left_alignment_would_be_wrong():
    """Why flash-attn < 2.1 is refused: with q_len < k_len a top-left causal mask hides keys the queries
    must see, so the Seq1F1B/CP windows would get a different (wrong) result."""
    q, k, v = qkv(9, 2, 2, seed=7)
    w = Windows(torch.tensor([0, 3], dtype=torch.int32), torch.tensor([0, 9], dtype=torch.int32), 3, 9)
    exact = exact_window_attention(q[:3], k, v, w)
    torch.testing.assert_close(kernel_reference(q[:3], k, v, w.cu_q, w.cu_k, 3, 9, []), exact, rtol=0, atol=1e-12)
    assert not torch.allclose(kernel_reference(q[:3], k, v, w.cu_q, w.cu_k, 3, 9, [], bottom_right=False), exact)


def test_cpu_fallback_builds_no_query_by_key_mask(monkeypatch):
    """The exact fallback for q_len < k_len merges a maskless prefix part and a causal square part: the
    only masks it builds are q_len x q_len, and it matches the written-out kernel semantics."""
    shapes = []
    full = torch.full

    def spy(size, *a, **kw):
        shapes.append(tuple(size))
        return full(size, *a, **kw)

    monkeypatch.setattr(torch, "full", spy)
    q, k, v = qkv(40, 4, 2, seed=9)
    w = Windows(torch.tensor([0, 3, 8], dtype=torch.int32), torch.tensor([0, 30, 40], dtype=torch.int32), 5, 30)
    out = exact_window_attention(q[:8], k, v, w)
    monkeypatch.setattr(torch, "full", full)
    assert shapes and all(s[0] == s[1] <= 5 for s in shapes)
    assert_same(out, kernel_reference(q[:8], k, v, w.cu_q, w.cu_k, 5, 30, []), (q, k, v), 2)


def test_cuda_fallback_lower_right_bias_has_the_kernels_semantics():
    """The CUDA fallback's torch CausalBias lower-right (here evaluated on the CPU) is the bottom-right
    causal alignment of the kernels, with grouped K/V heads repeated as the fallback does."""
    import warnings

    from torch.nn.attention.bias import causal_lower_right

    q, k, v = qkv(12, 4, 2, seed=11)
    w = Windows(torch.tensor([0, 4], dtype=torch.int32), torch.tensor([0, 12], dtype=torch.int32), 4, 12)
    kr, vr = (t.transpose(0, 1)[None].repeat_interleave(2, 1) for t in (k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CPU has no flash kernel for it and says so
        out = F.scaled_dot_product_attention(q[8:].transpose(0, 1)[None], kr, vr, attn_mask=causal_lower_right(4, 12))
    torch.testing.assert_close(out[0].transpose(0, 1), kernel_reference(q[8:], k, v, w.cu_q, w.cu_k, 4, 12, []),
                               rtol=0, atol=1e-12)


def test_the_fa3_switch_flips_torchs_flash_impl_only_when_it_changes(monkeypatch):
    import torch.nn.attention as torch_attention

    state, log = {"impl": None}, []

    def activate(impl):
        log.append(("activate", impl))
        state["impl"] = impl

    def restore():
        log.append(("restore",))
        state["impl"] = None

    monkeypatch.setattr(torch_attention, "activate_flash_attention_impl", activate)
    monkeypatch.setattr(torch_attention, "restore_flash_attention_impl", restore)
    monkeypatch.setattr(torch_attention, "current_flash_attention_impl", lambda: state["impl"])
    for fa3 in (False, True, True, False, False, True):
        attention._flash_impl(fa3)
    assert log == [("activate", "FA3"), ("restore",), ("activate", "FA3")]
