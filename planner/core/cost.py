"""The canonical cost model every tool agrees on (docs/formats.md): T(l,P) of a micro-batch, the pipeline
time `sum + (pp-1) * max`, model FLOPs and MFU, UtilLen. Pure functions, vectorized with numpy.

A micro-batch of lengths l_i on scheme P costs sum(a*l_i^2 + b*l_i) + c; a pipeline with micro-batches
m_1..m_V costs sum_v t(m_v) + (pp-1) * max_v t(m_v); an iteration costs the max over its pipelines.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from hydraplan.core.errors import UserError
from hydraplan.core.schema import ModelInfo, Profile, Scheme, TimeCoeffs


# ------------------------------------------------------------------------------- canonical estimate
def seq_cost(scheme: Scheme, lengths: np.ndarray | Sequence[int] | int) -> np.ndarray:
    """Per-sequence cost a*l^2 + b*l (no micro-batch constant), vectorized."""
    l = np.asarray(lengths, dtype=np.float64)
    return (scheme.time.a * l + scheme.time.b) * l


def seq_time(scheme: Scheme, length: float) -> float:
    """T(l,P): one stage's forward+backward of a micro-batch holding one sequence of length l."""
    t = scheme.time
    return (t.a * length + t.b) * length + t.c


def micro_batch_time(scheme: Scheme, lengths: Iterable[int]) -> float:
    return float(seq_cost(scheme, list(lengths)).sum()) + scheme.time.c


def pipeline_time_from_mb(mb_times: Sequence[float] | np.ndarray, pp: int) -> float:
    mb = np.asarray(mb_times, dtype=np.float64)
    if mb.size == 0:
        return 0.0
    return float(mb.sum() + (pp - 1) * mb.max())


def micro_batch_times(scheme: Scheme, lengths: np.ndarray, micro_batches: Sequence[np.ndarray]) -> np.ndarray:
    """t(m) of micro-batches given as index arrays into `lengths`: the one computation the planner, the
    baselines and `hydraplan validate` share, so they agree to the bit. One pass over all micro-batches
    (each summed in its own order by np.add.reduceat): 10^5 of them per static layout at 8192 GPUs."""
    sizes = np.fromiter(map(len, micro_batches), dtype=np.int64, count=len(micro_batches))
    sums = np.zeros(sizes.size)
    full = np.flatnonzero(sizes)
    if full.size:
        cost = seq_cost(scheme, np.asarray(lengths)[np.concatenate([micro_batches[k] for k in full.tolist()])])
        sums[full] = np.add.reduceat(cost, np.r_[0, np.cumsum(sizes[full])[:-1]])
    return sums + scheme.time.c


def pipeline_estimate(scheme: Scheme, lengths: np.ndarray, micro_batches: Sequence[np.ndarray]) -> float:
    """The canonical estimate of a pipeline whose micro-batches are index arrays into `lengths`."""
    return pipeline_time_from_mb(micro_batch_times(scheme, lengths, micro_batches), scheme.pp)


def pipeline_time(scheme: Scheme, micro_batches: Iterable[Iterable[int]]) -> float:
    """Canonical latency of one pipeline running the given micro-batches (lists of lengths)."""
    return pipeline_time_from_mb([micro_batch_time(scheme, mb) for mb in micro_batches], scheme.pp)


# ------------------------------------------------------------------------------- FLOPs and utilization
def attention_weights(model: ModelInfo) -> int:
    """Q, K, V and O weights of one decoder layer: 4h^2, or 2h^2 + 2h*kv_dim with grouped-query attention
    (model.kv_heads K/V heads of hidden/heads each)."""
    h = model.hidden
    if model.kv_heads is None or model.heads is None:
        return 4 * h * h
    return 2 * h * h + 2 * h * (h // model.heads * model.kv_heads)


def model_flops(model: ModelInfo, lengths: np.ndarray | Sequence[int] | int) -> np.ndarray:
    """Training FLOPs (forward + backward = 3x forward) per sequence, vectorized.

    6 FLOPs per GEMM weight per token (decoder layers with SwiGLU, and the LM head; the embedding lookup
    and norms do no GEMM work) plus causal attention, 3 * 2*2*h*l^2/2 per layer (grouped-query attention shrinks
    the K/V weights, not the attention FLOPs, which follow the query heads). A model without `ffn`
    is taken as LLaMA-shaped (ffn = 8h/3, 12h^2 GEMM weights per layer); without `vocab`, 32000.
    """
    h = model.hidden
    ffn = model.ffn if model.ffn is not None else 8 * h / 3
    vocab = model.vocab if model.vocab is not None else 32000
    weights = model.layers * (attention_weights(model) + 3 * h * ffn) + vocab * h
    l = np.asarray(lengths, dtype=np.float64)
    return 6.0 * weights * l + 6.0 * model.layers * h * l * l


def _peak_flops(profile: Profile) -> float:
    if profile.gpu.peak_tflops is None:
        raise UserError(f"profile {profile.name}: field gpu.peak_tflops: missing, needed to compute MFU")
    return profile.gpu.peak_tflops * 1e12


def mfu(profile: Profile, scheme: Scheme, lengths: np.ndarray | Sequence[int], seconds: float) -> float:
    """Model-FLOPs utilization of one pipeline of `scheme` training `lengths` in `seconds`."""
    if seconds <= 0:
        return 0.0
    flops = float(model_flops(profile.model, lengths).sum())
    return flops / (seconds * scheme.gpus * _peak_flops(profile))


def steady_state_mfu(profile: Profile, scheme: Scheme, lengths: np.ndarray | Sequence[int]) -> np.ndarray:
    """Implied MFU of micro-batches of each length in a full pipeline: every stage finishes one micro-batch
    per T(l), so the pipeline's pp*tp*cp GPUs do the whole model's work for one micro-batch per T(l)."""
    l = np.asarray(lengths, dtype=np.float64)
    seconds = seq_cost(scheme, l) + scheme.time.c
    return model_flops(profile.model, l) / (seconds * scheme.gpus * _peak_flops(profile))


# -------------------------------------------------------------------------------------------- UtilLen
UTIL_THRESHOLD = 0.85


def util_len(time: TimeCoeffs, max_len: int) -> int:
    """Appendix D UtilLen: the shortest l at which l/(b*l + c), the tokens/s without the attention term,
    reaches UTIL_THRESHOLD of its l->inf asymptote 1/b, i.e. b*l >= 0.85/0.15 * c. The l^2 attention
    term is work, not under-utilization (and with it tokens/s falls again at long l, so it has no
    asymptote). Capped at max_len so the V-pruning range [sum/MaxLen, sum/UtilLen] is never empty."""
    if time.b <= 0:
        return max_len
    need = UTIL_THRESHOLD / (1 - UTIL_THRESHOLD) * time.c / time.b
    return int(min(max(1, math.ceil(need - 1e-9)), max_len))


def tokens_per_gpu_s(scheme: Scheme, length: int) -> float | None:
    """Steady-state tokens/s per GPU of micro-batches of `length` tokens; None if they do not fit."""
    if length > scheme.max_len:
        return None
    return length / (seq_time(scheme, length) * scheme.gpus)
