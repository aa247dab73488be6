"""What one decoder layer keeps for its backward, measured against the memory model's per-token activation term.

The memory model charges, per packed token and decoder layer, 16h+6f bytes in bf16 without recomputation, 16h+4f
with selective and 2h with full recomputation, divided by TP (sequence parallelism; hydraplan.core.analytic
`layer_kept_bytes`). `saved_bytes_per_token` runs one layer's forward under
`torch.autograd.graph.saved_tensors_hooks` and adds up the distinct storages it keeps: not the parameters and not
the RoPE tables every layer shares (the model's `sp_unsplit`). The model leaves out two small statistics the
kernels keep, FlashAttention's fp32 log-sum-exp per head and query and the norms' fp32 rstd per token
(`uncharged_bytes_per_token`: 136 bytes of LLaMA-2 7B's 131,584 per token and layer without recomputation, 0.10%),
so a layer matches the model when what it keeps beyond them is at most the model's term and at least
`MIN_SHARE` of it.

Off CUDA the attention kernel is a stand-in that keeps exactly what the varlen FlashAttention kernels keep
(`flash_saves`: q, k, v, the output and the fp32 log-sum-exp), since the CPU fallback keeps other tensors, and the
TP ranks of a layer are simulated in one process (`simulated_tp`: a gather repeats the rank's rows, a
reduce-scatter keeps the first rows), which gives one rank's saved shapes, not its values.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch

from hydraplan.core.analytic import layer_kept_bytes
from hydraplan.core.hardware import MODELS
from hydraplan.runtime import attention, sequence_parallel
from hydraplan.runtime.attention import Choice, Windows, exact_window_attention
from hydraplan.runtime.batches import PackedBatch
from hydraplan.runtime.model import INIT_STD, Block, ModelConfig, rope_tables
from hydraplan.runtime.sequence_parallel import TPGroup

MIN_SHARE = 0.95  # what a layer keeps beyond the uncharged statistics, at least this share of the model's term
PROFILE_MODEL = "llama2-7b"  # the analytic profiles' model whose layer `hydraplan doctor` measures


def _log_sum_exp(q: torch.Tensor, k: torch.Tensor, w: Windows) -> torch.Tensor:
    """[heads, queries] fp32 log-sum-exp of each query's scaled scores over its bottom-right causal window: torch's
    CPU flash kernel's for whole documents, else one head at a time (no [heads, l, l] tensor)."""
    out = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
    group = q.shape[1] // k.shape[1]
    q0 = k0 = 0
    for lq, lk in zip(*w.lengths, strict=True):
        qs, ks = q[q0:q0 + lq], k[k0:k0 + lk].repeat_interleave(group, 1)
        if lq == lk and lq and q.device.type == "cpu":
            qs, ks = qs.transpose(0, 1)[None], ks.transpose(0, 1)[None]
            out[:, q0:q0 + lq] = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qs, ks, ks, 0.0, True)[1][0]
        elif lq:
            visible = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
            for h in range(q.shape[1]):
                s = qs[:, h].float() @ ks[:, h].float().T / math.sqrt(q.shape[-1])
                out[h, q0:q0 + lq] = s.masked_fill(~visible, -math.inf).logsumexp(-1)
        q0, k0 = q0 + lq, k0 + lk
    return out


class _FlashLike(torch.autograd.Function):
    """Varlen causal attention keeping what FlashAttention-2/3's varlen kernels keep for their backward: q, k, v,
    the output and the fp32 log-sum-exp (the backward recomputes the exact fallback's graph)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k):
        w = Windows(cu_q, cu_k, max_q, max_k)
        o = exact_window_attention(q, k, v, w)
        ctx.save_for_backward(q, k, v, o, _log_sum_exp(q, k, w))
        ctx.windows = w
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, _, _ = ctx.saved_tensors
        with torch.enable_grad():
            inputs = [t.detach().requires_grad_() for t in (q, k, v)]
            grads = torch.autograd.grad(exact_window_attention(*inputs, ctx.windows), inputs, do)
        return (*grads, None, None, None, None)


def _flash_like_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size, enable_gqa):
    """`torch.nn.attention.varlen.varlen_attn`'s call as the runtime makes it (causal, bottom-right)."""
    return _FlashLike.apply(q, k, v, cu_q, cu_k, max_q, max_k)


@contextlib.contextmanager
def flash_saves(dev: torch.device) -> Iterator[None]:
    """Attention keeps what the FlashAttention kernels keep: on CUDA the device's own kernels, elsewhere the
    stand-in taking the torch-varlen call path."""
    if dev.type == "cuda":
        yield
        return
    select, fn = attention.select, attention._torch_varlen_fn
    attention.select = lambda q: Choice("torch-varlen", "stand-in keeping FlashAttention's tensors")
    attention._torch_varlen_fn = lambda: _flash_like_varlen
    try:
        yield
    finally:
        attention.select, attention._torch_varlen_fn = select, fn


@contextlib.contextmanager
def simulated_tp() -> Iterator[None]:
    """TP collectives of one rank without its peers: shapes and storages as on a real rank, values not."""
    gather, scatter = sequence_parallel._all_gather_rows, sequence_parallel._reduce_scatter_rows
    sequence_parallel._all_gather_rows = lambda x, tp, n: x.repeat(tp.size, *([1] * (x.dim() - 1)))[:n]
    sequence_parallel._reduce_scatter_rows = lambda y, tp: y[: tp.rows(y.shape[0])].clone()
    try:
        yield
    finally:
        sequence_parallel._all_gather_rows, sequence_parallel._reduce_scatter_rows = gather, scatter


def one_document(tokens: int, dev: torch.device) -> PackedBatch:
    ids = torch.zeros(tokens, dtype=torch.int64, device=dev)
    return PackedBatch(tokens=ids, labels=ids, positions=torch.arange(tokens, device=dev),
                       cu_seqlens=torch.tensor([0, tokens], dtype=torch.int32, device=dev), max_seqlen=tokens)


def saved_bytes_per_token(cfg: ModelConfig, recompute: str, tp: int, tokens: int, dtype: torch.dtype,
                          dev: torch.device = torch.device("cpu")) -> float:
    """Bytes one TP rank of one decoder layer keeps for its backward per packed token of a one-document
    micro-batch of `tokens` tokens (a multiple of tp): its distinct saved storages, parameters and RoPE tables
    excepted. The forward only; TP simulated (`simulated_tp`) when tp > 1."""
    group = TPGroup(size=tp)
    block = Block(cfg, group, recompute, dtype=dtype, device=dev)
    with torch.no_grad():
        for name, p in block.named_parameters():
            p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, INIT_STD)
    mb = one_document(tokens, dev)
    cos, sin = rope_tables(mb.positions, cfg.head_dim, cfg.rope_theta, dtype)
    x = torch.randn(group.rows(tokens), cfg.hidden, dtype=dtype, device=dev, requires_grad=True)
    skip = {t.untyped_storage().data_ptr() for t in (*block.parameters(), cos, sin)}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with (flash_saves(dev), simulated_tp() if tp > 1 else contextlib.nullcontext(),
          torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)):
        block(x, cos, sin, mb)
    return sum(kept.values()) / tokens


def model_bytes_per_token(model: str, recompute: str, tp: int) -> float:
    """The memory model's activation bytes per token and layer of an analytic profile's model (one TP rank)."""
    return layer_kept_bytes(MODELS[model], tp, 1, recompute)


def uncharged_bytes_per_token(cfg: ModelConfig, tp: int, recompute: str) -> float:
    """Bytes per token and layer the kernels keep beyond the model's term: FlashAttention's fp32 log-sum-exp
    (one per head of the rank and query) and the two norms' fp32 rstd (one per token each); none under full
    recomputation (a layer keeps only its input)."""
    return 0.0 if recompute == "full" else (4 * cfg.heads + 2 * 4) / tp
