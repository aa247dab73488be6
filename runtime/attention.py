"""Causal variable-length attention on packed sequences (one interface, backend chosen by capability).

Packed micro-batches hold several documents back to back; a document never attends to another one
(Hydraulis §2.1: the varlen interface costs sum(l_i^2), not (sum l_i)^2). Every attention of the runtime
is one shape, `Windows`: segment i has q_lens[i] queries that are the LAST q_lens[i] of its k_lens[i]
keys (bottom-right causal alignment). A plain packed micro-batch is the case q_lens == k_lens; a Seq1F1B
split (keys cached from earlier splits) and a CP rank's token runs (keys gathered from the other CP
ranks) have q_lens <= k_lens.

Backends (`choose_backend`, first that applies; the reason is logged once per device/dtype/head dim):
- "torch-varlen-fa3": the torch-varlen call below with torch's FlashAttention-3 kernels activated
  (`torch.nn.attention.activate_flash_attention_impl("FA3")`, which routes torch's flash attention ops to
  the `flash_attn_interface` package's Hopper kernels); needs compute capability 9.x, torch varlen_attn,
  the FA3 package importable, fp16/bf16 and head dim a multiple of 8 up to 256;
- "torch-varlen": torch's `torch.nn.attention.varlen.varlen_attn` (its FlashAttention-2 kernels) with
  separate query and key offsets and window_size=(-1, 0), which torch's flash kernel aligns bottom-right;
  needs CUDA, a torch built with flash attention, compute capability >= 8.0, fp16/bf16, head dim a
  multiple of 8 and <= 256;
- "flash-attn": `flash_attn.flash_attn_varlen_func(..., causal=True)` when flash-attn >= 2.1 is installed
  (2.0 aligned causal masks top-left, wrong for q_len < k_len), same hardware/dtype/head-dim limits;
- "sdpa-per-document": exact `scaled_dot_product_attention` one segment at a time (segments of equal shape batched
  into one call). Square segments use is_causal=True (no mask). Segments with q_len < k_len use
  torch's lower-right `CausalBias` on CUDA (flash / memory-efficient kernels, no mask materialised);
  on CPU they split into a maskless part (the keys before the segment's queries, which every query
  sees) and a causal square part, merged exactly by their log-sum-exps, so no q x k mask exists either.
  Its work is sum(l_q * l_k) like the kernels'; it is also the reference the kernels' argument
  construction is tested against (tests/test_attention_backends.py).
Segment lengths are read to the host once per micro-batch (`Windows.lengths`, cached), never per layer.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import logging
import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

HALF = (torch.float16, torch.bfloat16)
MIN_CAPABILITY = (8, 0)  # FlashAttention-2 (torch's and flash-attn's): Ampere or newer
MAX_HEAD_DIM = 256
FLASH_ATTN_MIN = (2, 1)  # bottom-right causal alignment
FA3_MAJOR = 9  # FlashAttention-3's kernels are Hopper's (sm90)
FA3_PACKAGE = "flash_attn_interface"  # what torch's FA3 registration imports (torch/nn/attention/_fa3.py)


@dataclass(frozen=True)
class Capability:
    """What the machine offers for a device: the inputs of `choose_backend` (tests pass stand-ins)."""

    cuda: bool
    compute_capability: tuple[int, int] | None = None
    torch_varlen: bool = False  # torch.nn.attention.varlen importable and torch built with flash attention
    flash_attn: str | None = None  # installed flash-attn version
    fa3: bool = False  # torch can activate its FA3 impl and the FA3 kernels' package is importable


@dataclass(frozen=True)
class Choice:
    backend: str  # "torch-varlen" | "flash-attn" | "sdpa-per-document"
    reason: str


def _major_minor(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m[1]), int(m[2])) if m else (0, 0)


def choose_backend(cap: Capability, dtype: torch.dtype, head_dim: int) -> Choice:
    """Pure: the backend for attention of this dtype and head dim on a device with capability `cap`."""
    if not cap.cuda:
        return Choice("sdpa-per-document", "not a CUDA device")
    if dtype not in HALF:
        return Choice("sdpa-per-document", f"dtype {dtype} (the varlen kernels take fp16/bf16 only)")
    if head_dim % 8 or head_dim > MAX_HEAD_DIM:
        return Choice("sdpa-per-document", f"head dim {head_dim} (the varlen kernels need a multiple of 8 up to {MAX_HEAD_DIM})")
    cc = cap.compute_capability or (0, 0)
    if cc < MIN_CAPABILITY:
        return Choice("sdpa-per-document", f"compute capability {cc[0]}.{cc[1]} < {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} "
                              "(FlashAttention-2 kernels need Ampere or newer)")
    if cap.torch_varlen and cap.fa3 and cc[0] == FA3_MAJOR:
        return Choice("torch-varlen-fa3", f"CUDA sm{cc[0]}{cc[1]}, {dtype}, head dim {head_dim}: torch varlen_attn "
                                          "with torch's FlashAttention-3 kernels (Hopper, bottom-right causal)")
    if cap.torch_varlen:
        return Choice("torch-varlen", f"CUDA sm{cc[0]}{cc[1]}, {dtype}, head dim {head_dim}: torch varlen_attn "
                                      "(FlashAttention-2, bottom-right causal)")
    if cap.flash_attn is not None:
        if _major_minor(cap.flash_attn) >= FLASH_ATTN_MIN:
            return Choice("flash-attn", f"CUDA sm{cc[0]}{cc[1]}, {dtype}, head dim {head_dim}: torch varlen_attn "
                                        f"unavailable, flash-attn {cap.flash_attn} >= 2.1 (bottom-right causal)")
        return Choice("sdpa-per-document", f"torch varlen_attn unavailable and flash-attn {cap.flash_attn} < 2.1 "
                              "(its causal mask is top-left aligned)")
    return Choice("sdpa-per-document", "neither torch varlen_attn (torch built without flash attention) nor flash-attn >= 2.1")


def _torch_varlen_fn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def _flash_attn_fn():
    from flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func


def _fa3_offered() -> bool:
    """torch lists an FA3 impl and its kernels' package is importable (activation itself is `_flash_impl`)."""
    try:
        from torch.nn.attention import list_flash_attention_impls
    except ImportError:
        return False
    return "FA3" in list_flash_attention_impls() and importlib.util.find_spec(FA3_PACKAGE) is not None


def _flash_impl(fa3: bool) -> None:
    """Route torch's flash attention ops to FA3 (True) or back to its built-in FA2 kernels; a process-wide
    switch, flipped only when it changes (`hydraplan doctor` checks both backends one after the other)."""
    from torch.nn.attention import activate_flash_attention_impl, current_flash_attention_impl, restore_flash_attention_impl

    if fa3 and current_flash_attention_impl() != "FA3":
        activate_flash_attention_impl("FA3")
    elif not fa3 and current_flash_attention_impl() is not None:
        restore_flash_attention_impl()


@functools.cache
def probe(device: torch.device) -> Capability:
    """The real capability of `device` (cached: queried once per process and device)."""
    if device.type != "cuda":
        return Capability(cuda=False)
    try:
        flash = importlib.metadata.version("flash_attn")
    except importlib.metadata.PackageNotFoundError:
        flash = None
    return Capability(cuda=True, compute_capability=tuple(torch.cuda.get_device_capability(device)),
                      torch_varlen=_torch_varlen_fn() is not None and torch.backends.cuda.is_flash_attention_available(),
                      flash_attn=flash, fa3=_fa3_offered())


@functools.cache
def choice_for(device: torch.device, dtype: torch.dtype, head_dim: int) -> Choice:
    choice = choose_backend(probe(device), dtype, head_dim)
    log.info("attention backend %s on %s: %s", choice.backend, device, choice.reason)
    return choice


def select(q: torch.Tensor) -> Choice:
    """The backend for queries like `q` [T, H, D] (tests replace this to drive a kernel's call path)."""
    return choice_for(q.device, q.dtype, int(q.shape[-1]))


def backend_for(q: torch.Tensor) -> str:
    return select(q).backend


# ------------------------------------------------------------------------------------------ windows
@dataclass(frozen=True)
class Windows:
    """Segments of packed queries, each attending to a window of packed keys that ends with its own
    tokens: segment i has the last q_lens[i] of its k_lens[i] keys as queries (bottom-right causal)."""

    cu_q: torch.Tensor  # [n+1] int32 query offsets (on the tensors' device)
    cu_k: torch.Tensor  # [n+1] int32 key offsets
    max_q: int
    max_k: int

    @functools.cached_property
    def lengths(self) -> tuple[list[int], list[int]]:
        """Query and key counts of each segment, as Python ints (one host read per micro-batch, not per layer)."""
        return torch.diff(self.cu_q).tolist(), torch.diff(self.cu_k).tolist()


def documents(cu_seqlens: torch.Tensor, max_seqlen: int) -> Windows:
    """The windows of a plain packed micro-batch: every document is its own (square) window."""
    return Windows(cu_seqlens, cu_seqlens, max_seqlen, max_seqlen)


@dataclass(frozen=True)
class KernelArgs:
    """The varlen kernels' shared arguments (FlashAttention-2's varlen interface)."""

    cu_q: torch.Tensor  # int32, starts at 0, ends at T_q
    cu_k: torch.Tensor  # int32, starts at 0, ends at T_k
    max_q: int
    max_k: int
    enable_gqa: bool


def kernel_args(q: torch.Tensor, k: torch.Tensor, w: Windows) -> KernelArgs:
    return KernelArgs(w.cu_q.to(torch.int32), w.cu_k.to(torch.int32), int(w.max_q), int(w.max_k), k.shape[1] != q.shape[1])


def _torch_varlen_call(q, k, v, a: KernelArgs) -> torch.Tensor:
    """window_size=(-1, 0): causal; torch's flash kernel aligns it bottom-right (key j visible to query i
    of a segment iff j <= i + k_len - q_len)."""
    return _torch_varlen_fn()(q, k, v, a.cu_q, a.cu_k, a.max_q, a.max_k, window_size=(-1, 0), enable_gqa=a.enable_gqa)


def _flash_attn_call(q, k, v, a: KernelArgs) -> torch.Tensor:
    """flash-attn >= 2.1: causal=True is bottom-right aligned; grouped K/V heads are native."""
    return _flash_attn_fn()(q, k, v, a.cu_q, a.cu_k, a.max_q, a.max_k, causal=True)


# ------------------------------------------------------------------------------------------- exact
def _lse_attention(q, k, v, causal: bool, gqa: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention [B, H, lq, D] and its log-sum-exp [B, H, lq, 1], written out (CPU fallback pieces only)."""
    if gqa:
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        n = q.shape[-2]
        scores = scores + torch.full((n, n), float("-inf"), dtype=scores.dtype, device=scores.device).triu(1)
    lse = scores.logsumexp(-1, keepdim=True)
    return (scores - lse).exp() @ v, lse


def _bottom_right(q, k, v, gqa: bool) -> torch.Tensor:
    """Bottom-right causal attention of q [B, H, lq, D] to k, v [B, Hkv, lk, D] with lq < lk, exact and
    without a q x k mask: on CUDA via torch's lower-right CausalBias (flash / memory-efficient SDPA); on
    CPU as the merge of the prefix keys (seen by every query) and the causal square of the last lq keys."""
    lq, lk = q.shape[-2], k.shape[-2]
    if q.is_cuda:
        from torch.nn.attention.bias import causal_lower_right

        if gqa:  # CausalBias' kernels take equal head counts
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], 1) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(lq, lk))
    p = lk - lq
    o1, l1 = _lse_attention(q, k[..., :p, :], v[..., :p, :], False, gqa)
    o2, l2 = _lse_attention(q, k[..., p:, :], v[..., p:, :], True, gqa)
    lse = torch.logaddexp(l1, l2)
    return o1 * (l1 - lse).exp() + o2 * (l2 - lse).exp()


def exact_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: Windows) -> torch.Tensor:
    """The "sdpa-per-document" backend: exact, one SDPA call per group of segments with equal (q_len, k_len)."""
    gqa = k.shape[1] != q.shape[1]
    q_len, k_len = w.lengths
    # split, not slicing: the backward of a split is one concatenation, a slice's backward a full-size zero tensor
    qs, ks, vs = q.split(q_len), k.split(k_len), v.split(k_len)
    outs: list[torch.Tensor] = list(qs)  # segments without queries stay as their (empty) query rows
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (lq, lk) in enumerate(zip(q_len, k_len)):
        if lq > 0:
            groups.setdefault((lq, lk), []).append(i)
    for (lq, lk), segs in groups.items():
        qb, kb, vb = (torch.stack([t[i] for i in segs]).transpose(1, 2) for t in (qs, ks, vs))  # [G, H, l, D]
        if lq == lk:
            o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=gqa)
        else:
            o = _bottom_right(qb, kb, vb, gqa)
        for i, od in zip(segs, o.transpose(1, 2).unbind(0), strict=True):
            outs[i] = od
    return torch.cat(outs)


# --------------------------------------------------------------------------------------- interface
def available(device: torch.device, dtype: torch.dtype, head_dim: int) -> list[str]:
    """Every backend this device can run for this dtype and head dim (`hydraplan doctor` checks each one)."""
    cap = probe(device)
    out = ["sdpa-per-document"]
    kernels = cap.cuda and dtype in HALF and head_dim % 8 == 0 and head_dim <= MAX_HEAD_DIM and (
        (cap.compute_capability or (0, 0)) >= MIN_CAPABILITY)
    if kernels and cap.torch_varlen:
        out.append("torch-varlen")
    if kernels and cap.torch_varlen and cap.fa3 and (cap.compute_capability or (0, 0))[0] == FA3_MAJOR:
        out.append("torch-varlen-fa3")
    if kernels and cap.flash_attn is not None and _major_minor(cap.flash_attn) >= FLASH_ATTN_MIN:
        out.append("flash-attn")
    return out


def run_backend(backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: Windows) -> torch.Tensor:
    """`window_attention` with the given backend instead of the chosen one."""
    if backend in ("torch-varlen", "torch-varlen-fa3"):
        _flash_impl(backend == "torch-varlen-fa3")
        return _torch_varlen_call(q, k, v, kernel_args(q, k, w))
    if backend == "flash-attn":
        return _flash_attn_call(q, k, v, kernel_args(q, k, w))
    return exact_window_attention(q, k, v, w)


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: Windows) -> torch.Tensor:
    """Causal attention of each segment's queries (q [sum q_lens, Hq, D]) to its key window (k, v
    [sum k_lens, Hkv, D]; Hq a multiple of Hkv: grouped-query attention). Returns [sum q_lens, Hq, D]."""
    return run_backend(select(q).backend, q, k, v, w)


def keeps_scores(q: torch.Tensor, w: Windows) -> bool:
    """Whether `window_attention` of these queries keeps more than its inputs, output and log-sum-exp for the
    backward: the exact backend on CPU keeps the score matrices of bottom-right segments (q_len < k_len:
    Seq1F1B splits, CP runs); the flash kernels, SDPA's causal squares and torch's CausalBias kernels do not
    (they recompute scores in their backward). Selective recomputation drops exactly these (runtime/recompute.py)."""
    if q.is_cuda or select(q).backend != "sdpa-per-document":
        return False
    q_len, k_len = w.lengths
    return any(0 < a < b for a, b in zip(q_len, k_len))


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     max_seqlen: int) -> torch.Tensor:
    """Causal attention within each packed document (cu_seqlens: [n+1] int32 offsets from 0 to T). The
    model passes its micro-batch's cached `PackedBatch.windows` to `window_attention` instead."""
    return window_attention(q, k, v, documents(cu_seqlens, max_seqlen))
