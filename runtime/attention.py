"""Causal variable-length attention on packed sequences (one interface, backend chosen per call).

Packed micro-batches hold several documents back to back; `cu_seqlens` marks where each starts, and a
document never attends to another one (Hydraulis §2.1: the varlen interface costs sum(l_i^2), not
(sum l_i)^2). Backends, best first:
- CUDA, fp16/bf16: torch's own `torch.nn.attention.varlen.varlen_attn` (FlashAttention kernels), else
  `flash_attn.flash_attn_varlen_func` when that package is installed;
- everything else (CPU, fp32/fp64): exact causal `scaled_dot_product_attention` per document, documents
  of equal length batched into one call. Its work is sum(l_i^2) like the varlen kernels' and the cost
  model's (a block-diagonal mask over the packed micro-batch would cost (sum l_i)^2). Exact (no
  approximation), so it is also the reference the fast kernels are tested against.
`window_attention` is the same with queries that are only the last tokens of their key windows (a
Seq1F1B split, a CP rank's share of a document).
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass

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
    return "sdpa-per-document"


def _sdpa_per_document(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Causal SDPA on each document alone; equal lengths share one batched call, so many short documents
    cost a few kernel launches rather than one each."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    gqa = k.shape[1] != q.shape[1]
    # split, not slicing: the backward of a split is one concatenation, a slice's backward a full-size zero tensor
    qs, ks, vs = q.split(lengths), k.split(lengths), v.split(lengths)
    outs: list[torch.Tensor] = list(qs)  # zero-length documents stay as their (empty) query rows
    by_length: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        if n > 0:
            by_length.setdefault(n, []).append(i)
    for docs in by_length.values():
        qb, kb, vb = (torch.stack([t[i] for i in docs]).transpose(1, 2) for t in (qs, ks, vs))  # [G, H, l, D]
        o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=gqa).transpose(1, 2)
        for i, od in zip(docs, o.unbind(0), strict=True):
            outs[i] = od
    return torch.cat(outs)


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
    return _sdpa_per_document(q, k, v, cu_seqlens)


@dataclass(frozen=True)
class Windows:
    """Segments of packed queries, each attending to a window of packed keys that ends with its own
    tokens: segment i has the last q_lens[i] of its k_lens[i] keys as queries, so causal alignment is
    bottom-right. A Seq1F1B split's documents (keys from earlier splits) and a CP rank's token runs (keys
    from the other CP ranks) are both this shape."""

    cu_q: torch.Tensor  # [n+1] int32 query offsets
    cu_k: torch.Tensor  # [n+1] int32 key offsets
    max_q: int
    max_k: int

    @functools.cached_property
    def lengths(self) -> tuple[list[int], list[int]]:
        """Query and key counts of each segment, as Python ints (computed once per micro-batch, not per layer)."""
        return torch.diff(self.cu_q).tolist(), torch.diff(self.cu_k).tolist()


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: Windows) -> torch.Tensor:
    """Causal attention of each segment's queries (q [sum q_lens, Hq, D]) to its key window (k, v
    [sum k_lens, Hkv, D]).

    CUDA fp16/bf16 with flash-attn installed: flash_attn_varlen_func with per-segment query and key
    offsets (causal masks are bottom-right aligned since flash-attn 2.1). Otherwise exact SDPA one
    segment at a time with a bottom-right causal mask: its work is sum(l_q * l_k) over segments like the
    varlen kernels', not (queries x keys) as one block-diagonal mask would cost.
    """
    if q.is_cuda and q.dtype in _FLASH_DTYPES and importlib.util.find_spec("flash_attn") is not None:
        from flash_attn import flash_attn_varlen_func

        return flash_attn_varlen_func(q, k, v, w.cu_q, w.cu_k, w.max_q, w.max_k, causal=True)
    gqa = k.shape[1] != q.shape[1]
    q_len, k_len = w.lengths
    outs = []
    # split, not slicing: the backward of a split is one concatenation, a slice's backward a full-size zero tensor
    for qd, kd, vd in zip(q.split(q_len), k.split(k_len), v.split(k_len)):
        qd, kd, vd = qd.transpose(0, 1), kd.transpose(0, 1), vd.transpose(0, 1)
        lq, lk = qd.shape[1], kd.shape[1]
        if lq == lk:
            o = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, enable_gqa=gqa)
        else:
            mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
            o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, enable_gqa=gqa)
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)
