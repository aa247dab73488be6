"""Training FLOPs per token as other projects count them, so a predicted iteration time can be stated in the TFLOP/s
or MFU a source publishes. Each convention is written from the formula its project documents (sources in
CONVENTIONS); none is hydraplan's own count (hydraplan.core.cost.model_flops, which halves causal attention)."""

from __future__ import annotations

import math

from hydraplan.core.hardware import ModelSpec

CONVENTIONS = {
    "nemo": "NeMo perf_metrics.py (v2.1.0) llama2/llama3: L h^2 (12 + 12 g/a + 18 f/h + 12 s/h + 6 V/(L h)) per token, "
            "attention in full (not halved for the causal mask), the LM head counted, recomputation not",
    "megatron": "Megatron-LM num_floating_point_operations (training.py): 12 L h^2 (1 + g/a + s/h) + 6 L x MLP weights "
                "+ 6 h V per token, attention in full, recomputation not",
    "megatron-bridge": "Megatron-Bridge flop_utils.py: 12 L h (1.5 f) + 12 L h^2 (1 + g/a + s/(2h)) + 6 h V_pad per "
                       "token, causal attention halved, V padded to a multiple of 128 x TP",
    "torchtitan": "torchtitan get_num_flop_per_token: 6 N + 12 L H Q s, N the parameters without the input "
                  "embedding, attention in full",
}


def flops_per_token(convention: str, model: ModelSpec, seq_len: int, tp: int = 1) -> float:
    """Training FLOPs one token of a `seq_len`-token sequence counts under `convention` (a key of CONVENTIONS)."""
    L, h, f, V, s = model.layers, model.hidden, model.ffn, model.vocab, seq_len
    g_over_a = model.kv_dim / h  # K/V heads over query heads
    mlp = 3 * h * f  # SwiGLU weights per layer (the GeLU stand-ins of data/models/published have the same)
    if convention == "nemo":
        return L * h * h * (12 + 12 * g_over_a + 18 * f / h + 12 * s / h + 6 * V / (L * h))
    if convention == "megatron":
        return 12 * L * h * h * (1 + g_over_a + s / h) + 6 * L * mlp + 6 * h * V
    if convention == "megatron-bridge":
        v_pad = math.ceil(V / (128 * tp)) * 128 * tp
        return 12 * L * h * 1.5 * f + 12 * L * h * h * (1 + g_over_a + s / (2 * h)) + 6 * h * v_pad
    if convention == "torchtitan":
        n = model.params - V * h  # without the input embedding (the output projection counted)
        return 6 * n + 12 * L * h * s
    raise ValueError(f"unknown FLOP convention {convention!r} (one of {', '.join(CONVENTIONS)})")
