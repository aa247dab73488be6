"""Attention kernels' rates by sequence (chunk) length: what the analytic profiles' attention terms and the fidelity
bench's kernel predictions share.

A FlashAttention-style kernel walks each query tile over the key tiles it needs. Per query row it pays the work of
the keys it visits plus a fixed cost (loading Q, the softmax rescaling, writing O and the log-sum-exp) worth `half`
keys of work: on s keys a non-causal call reaches efficiency * s / (s + half) of the dtype's dense peak. Under the
causal mask a row visits s/2 keys on average plus half of the diagonal tile it shares with the keys after it
(CAUSAL_TILE rows), and the FLOP count halves, so a causal call reaches efficiency * s / (s + CAUSAL_TILE + 2*half).
The backward (FLOPs 2.5x the forward's: five matmuls against two) has its own two constants. Each kernel's
constants are fitted to the published points of data/published/ (relative least squares; the sources are in
`AttentionRate.source`), four numbers per kernel, dtype and head dimension.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CAUSAL_TILE = 128  # query rows per tile of FlashAttention-2/-3 and cuDNN on Hopper and Ampere at head dim 128
BACKWARD_FLOPS = 2.5  # backward FLOPs per forward FLOP (FlashAttention's count: 5 matmuls against 2)


@dataclass(frozen=True)
class AttentionRate:
    """One kernel on one GPU in one dtype and head dimension: asymptotic efficiency (fraction of the dtype's dense
    peak) and `half` (keys of work a query row costs on top of the keys it visits), forward and backward."""

    gpu: str
    kernel: str
    dtype: str  # bf16 (fp16 runs at the same tensor-core rate) or fp8
    head_dim: int
    fwd_efficiency: float
    fwd_half: float
    bwd_efficiency: float
    bwd_half: float
    source: str


def _rate(gpu: str, kernel: str, dtype: str, head_dim: int, fwd: tuple[float, float], bwd: tuple[float, float],
          source: str) -> AttentionRate:
    return AttentionRate(gpu, kernel, dtype, head_dim, fwd[0], fwd[1], bwd[0], bwd[1], source)


FA3_PAPER = "FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608 v2) figures 5-7, data/published/flashattention3-h100.json"
FA2_README = "FlashAttention-2 README figures (A100 80GB SXM4, fwd+bwd), data/published/flashattention2-fwdbwd.json"
RATES: tuple[AttentionRate, ...] = (
    _rate("h100", "flash-attention-3", "bf16", 128, (0.675, 239), (0.597, 427),
          f"{FA3_PAPER}: 667.6 and 590.9 TFLOP/s asymptotes of 989.4 (forward causal and not; backward not causal); "
          "worst point 4.7%"),
    _rate("h100", "flash-attention-2", "bf16", 128, (0.371, 145), (0.333, 274),
          f"{FA3_PAPER}, its FlashAttention-2 bars (FA 2.5.8): 367.4 and 329.1 TFLOP/s; worst point 8.0%"),
    _rate("h100", "flash-attention-3", "fp8", 128, (0.558, 1029), (0.0, 0.0),
          f"{FA3_PAPER}, FP8 e4m3 forward not causal: 1103.8 TFLOP/s of 1978.9; no FP8 backward published"),
    _rate("h100", "flash-attention-3", "fp8", 256, (0.582, 591), (0.0, 0.0),
          f"{FA3_PAPER}, FP8 e4m3 forward at head dim 256: 1151.5 TFLOP/s of 1978.9"),
    _rate("a100", "flash-attention-2", "bf16", 128, (0.696, 116), (0.623, 219),
          f"{FA2_README}: forward 217.0 TFLOP/s of 312 and half 116 fitted on the fwd+bwd points, the backward's "
          "efficiency and half in H100 FlashAttention-2's ratios (0.896 and 1.89: no A100 backward alone published)"),
)
KERNEL_OF_GPU = {"h100": "flash-attention-3", "h200": "flash-attention-3", "h100-500w": "flash-attention-3",
                 "a100": "flash-attention-2", "a800": "flash-attention-2"}
"""The attention kernel a framework on each GPU runs: FlashAttention-3 or cuDNN's fused attention (at FA3's rate,
FlashAttention-3 section 4.1) on Hopper, FlashAttention-2 on Ampere."""
SAME_SILICON = {"h200": "h100", "h100-500w": "h100", "a800": "a100"}
"""GPUs whose attention kernels run as another's: the same SMs (H200 differs in HBM, A800 in NVLink, the 500 W part in
its clock, hardware.GPUSpec.power_factor)."""


def attention_rate(gpu: str, kernel: str | None = None, dtype: str = "bf16", head_dim: int = 128) -> AttentionRate:
    """The rate of `kernel` (default: the GPU's, KERNEL_OF_GPU) on `gpu`; fp16 is bf16's rate."""
    silicon = SAME_SILICON.get(gpu, gpu)
    kernel = kernel or KERNEL_OF_GPU[gpu]
    dtype = "bf16" if dtype == "fp16" else dtype
    for r in RATES:
        if (r.gpu, r.kernel, r.dtype, r.head_dim) == (silicon, kernel, dtype, head_dim):
            return r
    raise KeyError(f"no published rate of {kernel} on {gpu} in {dtype} at head dim {head_dim}")


def row_keys(half: float, causal: bool, keys: float | np.ndarray) -> np.ndarray:
    """Keys' worth of work one query row costs on `keys` keys: all of them, or under the causal mask half of them
    and half a diagonal tile, plus the row's fixed cost."""
    k = np.asarray(keys, dtype=np.float64)
    return (k / 2 + CAUSAL_TILE / 2 if causal else k) + half


def kernel_tflops(rate: AttentionRate, peak_tflops: float, direction: str, causal: bool,
                  seqlen: float | np.ndarray) -> np.ndarray:
    """TFLOP/s of one call on sequences of `seqlen` (FLOPs as FlashAttention counts them: 4*s^2*d per head forward,
    halved when causal, backward 2.5x, forward+backward 3.5x)."""
    s = np.asarray(seqlen, dtype=np.float64)
    useful = s / 2 if causal else s
    seconds = {"forward": np.zeros_like(s), "backward": np.zeros_like(s)}
    for d, (eff, half, mult) in {"forward": (rate.fwd_efficiency, rate.fwd_half, 1.0),
                                 "backward": (rate.bwd_efficiency, rate.bwd_half, BACKWARD_FLOPS)}.items():
        if direction in (d, "forward+backward"):
            if eff <= 0:
                raise KeyError(f"no published {d} rate of {rate.kernel} on {rate.gpu} in {rate.dtype}")
            seconds[d] = mult * row_keys(half, causal, s) / (peak_tflops * eff)
    flops = useful * {"forward": 1.0, "backward": BACKWARD_FLOPS, "forward+backward": 1.0 + BACKWARD_FLOPS}[direction]
    return flops / (seconds["forward"] + seconds["backward"])
