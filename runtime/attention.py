"""Causal variable-length attention on packed sequences (one interface, backend chosen per call).

Packed micro-batches hold several documents back to back; `cu_seqlens` marks where each starts, and a
document never attends to another one (Hydraulis §2.1: the varlen interface costs sum(l_i^2), not
(sum l_i)^2). Backends, best first:
- CUDA, fp16/bf16: torch's own `torch.nn.attention.varlen.varlen_attn` (FlashAttention kernels), else
  `flash_attn.flash_attn_varlen_func` when that package is installed;
- everything else (CPU, fp32/fp64): exact `scaled_dot_product_attention` with a block-diagonal causal
  mask. Exact (no approximation), so it is also the reference the fast kernels are tested against.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

_FLASH_DTYPES = (torch.float16, torch.bfloat16)


def _torch_varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def backend_for(q: torch.Tensor) -> str:
    """Name of the backend `varlen_attention` uses for tensors like `q`."""
    if q.is_cuda and q.dtype in _FLASH_DTYPES:
        if _torch_varlen() is not None:
            return "torch-varlen"
        if importlib.util.find_spec("flash_attn") is not None:
            return "flash-attn"
    return "masked-sdpa"


def document_ids(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Index of the document each packed token belongs to."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    return torch.repeat_interleave(torch.arange(len(lengths), device=cu_seqlens.device), lengths, output_size=total)


def block_causal_mask(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """[T, T] boolean mask: token i may attend to token j iff same document and j <= i."""
    doc = document_ids(cu_seqlens, total)
    pos = torch.arange(total, device=cu_seqlens.device)
    return (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])


def _masked_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    mask = block_causal_mask(cu_seqlens, q.shape[0])
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1]
    )
    return out.transpose(0, 1)


def varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int
) -> torch.Tensor:
    """Causal attention within each packed document.

    q: [T, Hq, D], k/v: [T, Hkv, D] (Hq a multiple of Hkv: grouped-query attention), cu_seqlens: [n+1]
    int32 offsets starting at 0 and ending at T, max_seqlen: the longest document. Returns [T, Hq, D].
    """
    backend = backend_for(q)
    gqa = k.shape[1] != q.shape[1]
    if backend == "torch-varlen":
        return _torch_varlen()(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, window_size=(-1, 0), enable_gqa=gqa)
    if backend == "flash-attn":
        from flash_attn import flash_attn_varlen_func

        return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True)
    return _masked_sdpa(q, k, v, cu_seqlens)
