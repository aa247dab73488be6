"""Spec tables behind the analytic profiles: GPUs, models and the training-framework constants.

Every number carries its source so the generated profiles can record it in their `notes`. Datasheet
values are exact; efficiencies and overheads are engineering estimates (stated as such) that put the
analytic model within 2x of the fitted Hydraulis A800 coefficients while keeping every scheme's implied
MFU below 70%.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPUSpec:
    key: str  # profile-name prefix
    name: str
    memory_gib: float
    peak_tflops: float  # dense bf16 tensor-core peak
    hbm_gb_s: float
    nvlink_gb_s: float  # bidirectional NVLink bandwidth per GPU (datasheet convention)
    ib_gb_s_per_node: float  # aggregate InfiniBand bandwidth of an 8-GPU node, one direction
    gpus_per_node: int
    gemm_efficiency: float  # fraction of peak reached by wide, long training GEMMs (fwd + dgrad + wgrad)
    gemm_m_half: int  # per-GPU tokens at which a GEMM reaches half its asymptotic efficiency
    attention_efficiency: float  # fraction of peak reached by FlashAttention fwd+bwd (hardware FLOPs)
    sources: tuple[tuple[str, str], ...]

    @property
    def nvlink_bytes_s(self) -> float:
        """One-direction NVLink bandwidth per GPU (half the bidirectional datasheet figure)."""
        return self.nvlink_gb_s / 2 * 1e9

    @property
    def ib_bytes_s(self) -> float:
        """One-direction InfiniBand bandwidth per GPU (one NIC per GPU)."""
        return self.ib_gb_s_per_node / self.gpus_per_node * 1e9


@dataclass(frozen=True)
class ModelSpec:
    """A LLaMA-style decoder. The fields after `source` default to LLaMA-2's multi-head attention (kv_heads =
    heads), untied embeddings, no QKV bias and RoPE base 10000, so the LLaMA-2 profiles' numbers are unchanged."""

    key: str
    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    vocab: int
    source: str
    kv_heads: int | None = None  # grouped-query attention: K/V heads shared by heads/kv_heads query heads each
    tied: bool = False  # the LM head reuses the input embedding
    qkv_bias: bool = False  # biases on the Q, K and V projections (Qwen2)
    rope_theta: float = 10000.0

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V) per token: hidden * kv_heads / heads (= hidden without GQA)."""
        return self.hidden // self.heads * (self.kv_heads or self.heads)

    @property
    def layer_matmul_params(self) -> int:
        """Weights of one decoder layer's GEMMs: Q and O (2h^2), K and V (2h*kv_dim; 4h^2 in all without GQA) and
        SwiGLU gate/up/down (3hf)."""
        return 2 * self.hidden**2 + 2 * self.hidden * self.kv_dim + 3 * self.hidden * self.ffn

    @property
    def layer_params(self) -> int:
        bias = self.hidden + 2 * self.kv_dim if self.qkv_bias else 0
        return self.layer_matmul_params + bias + 2 * self.hidden  # + two RMSNorm weights

    @property
    def embedding_params(self) -> int:
        """The input embedding and the LM head: one vocab x hidden matrix if tied, else two."""
        return (1 if self.tied else 2) * self.vocab * self.hidden

    @property
    def params(self) -> int:
        """All parameters: layers, embedding and LM head, final norm."""
        return self.layers * self.layer_params + self.embedding_params + self.hidden


@dataclass(frozen=True)
class FrameworkSpec:
    """Megatron-style tensor parallelism with sequence parallelism (the runtime's: inputs of the TP regions
    gathered again in the backward), ring context parallelism, FlashAttention, bf16 weights, fp32 gradient
    accumulation, and activation recomputation none, selective or full (runtime/recompute.py)."""

    weight_half: float  # per-GPU weights of one layer's GEMMs at which GEMM efficiency halves (TP split)
    link_efficiency: float  # achieved / nominal bandwidth of NCCL collectives and p2p
    memory_efficiency: float  # achieved / nominal HBM bandwidth of elementwise kernels
    kernels_per_layer: int  # kernel launches per decoder layer, forward + backward
    kernels_head: int  # launches of embedding, final norm, LM head and cross-entropy, fwd + bwd
    launch_s: float  # host-side cost of one launch when the GPU is starved (eager PyTorch)
    nvlink_latency_s: float  # small-message latency of one NCCL collective / p2p step over NVLink
    ib_latency_s: float  # same across InfiniBand
    act_h: int  # activation bytes kept per token per layer, split by TP (with SP) and CP: act_h*h + act_f*ffn (bf16)
    act_f: int
    act_f_selective: int  # selective recomputation: act_h*h + act_f_selective*ffn (the SwiGLU product recomputed)
    act_h_full: int  # full recomputation: act_h_full*h, each layer's input (SP rows)
    act_h_unsplit: int  # per token, split by CP only: the sequence-parallel working set that TP does not split
    forward_share: float  # the forward's share of a layer's elementwise work and kernel launches (recomputation)
    elementwise_h: int  # HBM bytes per token per layer of elementwise kernels = elementwise_h*h + elementwise_f*ffn
    elementwise_f: int
    fragmentation: float  # caching-allocator overhead on activation memory with varying packed lengths
    margin_fraction: float  # share of HBM kept free as the safety margin
    reserved_gib: float  # CUDA context and kernel images, cuBLAS/cuDNN/attention workspaces, allocator reserve
    sharded_bytes_per_param: int  # fp32 master weight + Adam m and v, sharded over all N GPUs
    local_bytes_per_param: int  # bf16 weight + fp32 gradient accumulator of the stage, split by TP
    nccl_collective_mib: float  # NCCL buffers of one communicator running ring/tree collectives
    nccl_p2p_peer_mib: float  # NCCL buffers of one p2p connection to a peer inside the node
    sources: tuple[tuple[str, str], ...]


H100 = GPUSpec(
    key="h100", name="H100-SXM-80GB", memory_gib=80, peak_tflops=989.4, hbm_gb_s=3350, nvlink_gb_s=900,
    ib_gb_s_per_node=400, gpus_per_node=8, gemm_efficiency=0.60, gemm_m_half=384, attention_efficiency=0.40,
    sources=(
        ("peak_tflops", "989.4 dense BF16 TFLOP/s, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s (NVIDIA H100 SXM5 datasheet)"),
        ("ib", "DGX H100: 8x ConnectX-7 400 Gb/s NDR, one per GPU = 400 GB/s per node, 50 GB/s per GPU per direction "
               "(NVIDIA DGX H100 user guide); the brief's '400 GB/s' read as this node aggregate"),
        ("gemm_efficiency", "0.60 of peak (~590 TFLOP/s) for wide training GEMMs incl. transposed dgrad/wgrad; "
                            "estimate: Megatron-Core reports ~40-47% end-to-end MFU for bf16 GPT training on H100"),
        ("gemm_m_half", "384 tokens: H100's 132 SMs need larger M tiles than A100 to fill (estimate)"),
        ("attention_efficiency", "0.40 of peak for FlashAttention fwd+bwd: FA2 reaches ~35% on H100, FA3/cuDNN "
                                 "forward up to ~75%, backward lower (Shah et al. 2024, FlashAttention-3)"),
    ),
)

A800 = GPUSpec(
    key="a800", name="A800-80GB", memory_gib=80, peak_tflops=312.0, hbm_gb_s=2039, nvlink_gb_s=400,
    ib_gb_s_per_node=200, gpus_per_node=8, gemm_efficiency=0.70, gemm_m_half=256, attention_efficiency=0.60,
    sources=(
        ("peak_tflops", "312 dense BF16 TFLOP/s, 80 GB HBM2e at 2.039 TB/s (NVIDIA A100/A800 80GB SXM datasheet); "
                        "A800 NVLink capped at 400 GB/s (NVIDIA A800 datasheet)"),
        ("ib", "Hydraulis appendix H: '400 GB/s NVLink and 200 GB/s IB' for its A800 cluster = 8x HDR 200 Gb/s "
               "per node, 25 GB/s per GPU per direction"),
        ("gemm_efficiency", "0.70 of peak (~218 TFLOP/s) for wide training GEMMs incl. transposed dgrad/wgrad; "
                            "estimate: Megatron-LM reaches 52% end-to-end MFU on A100 (Narayanan et al. SC'21)"),
        ("gemm_m_half", "256 tokens: cuBLAS bf16 GEMMs with K=N=4096 reach about half their plateau near M=256 (estimate)"),
        ("attention_efficiency", "0.60 of peak for FlashAttention-2 fwd+bwd, causal, head dim 128: 50-73% of "
                                 "A100 peak (Dao 2023, FlashAttention-2)"),
    ),
)

H200 = GPUSpec(
    key="h200", name="H200-SXM-141GB", memory_gib=140, peak_tflops=989.4, hbm_gb_s=4800, nvlink_gb_s=900,
    ib_gb_s_per_node=400, gpus_per_node=8, gemm_efficiency=0.60, gemm_m_half=384, attention_efficiency=0.40,
    sources=(
        ("peak_tflops", "989.4 dense BF16 TFLOP/s (the H100's Hopper GH100 compute), 141 GB HBM3e at 4.8 TB/s, NVLink "
                        "900 GB/s (NVIDIA H200 SXM datasheet); memory_gib 140: the device exposes about 140 GiB of the "
                        "141 GB (nvidia-smi reports 143,771 MiB)"),
        ("ib", "DGX H200: 8x ConnectX-7 400 Gb/s NDR, one per GPU = 400 GB/s per node, 50 GB/s per GPU per direction "
               "(NVIDIA DGX H200 datasheet), as DGX H100"),
        ("gemm_efficiency", "0.60 of peak, as H100: the same SMs and clocks; the faster HBM helps memory-bound kernels "
                            "(hbm_gb_s), not the compute-bound GEMMs (estimate)"),
        ("gemm_m_half", "384 tokens, as H100 (same SM count; estimate)"),
        ("attention_efficiency", "0.40 of peak, as H100 (FlashAttention on Hopper; Shah et al. 2024, FlashAttention-3)"),
    ),
)

A100 = GPUSpec(
    key="a100", name="A100-SXM-80GB", memory_gib=80, peak_tflops=312.0, hbm_gb_s=2039, nvlink_gb_s=600,
    ib_gb_s_per_node=200, gpus_per_node=8, gemm_efficiency=0.70, gemm_m_half=256, attention_efficiency=0.60,
    sources=(
        ("peak_tflops", "312 dense BF16 TFLOP/s, 80 GB HBM2e at 2.039 TB/s, NVLink 600 GB/s (NVIDIA A100 80GB SXM "
                        "datasheet)"),
        ("ib", "DGX A100: 8x ConnectX-6 200 Gb/s HDR for the compute fabric, one per GPU = 200 GB/s per node, 25 GB/s "
               "per GPU per direction (NVIDIA DGX A100 user guide)"),
        ("gemm_efficiency", "0.70 of peak, as A800 (the same GA100 silicon; A800 differs only in NVLink): Megatron-LM "
                            "reaches 52% end-to-end MFU on A100 (Narayanan et al. SC'21)"),
        ("gemm_m_half", "256 tokens, as A800 (estimate)"),
        ("attention_efficiency", "0.60 of peak for FlashAttention-2 fwd+bwd, causal, head dim 128: 50-73% of A100 "
                                 "peak (Dao 2023, FlashAttention-2)"),
    ),
)

FRAMEWORK = FrameworkSpec(
    weight_half=8e6, link_efficiency=0.8, memory_efficiency=0.8, kernels_per_layer=70, kernels_head=20,
    launch_s=7e-6, nvlink_latency_s=15e-6, ib_latency_s=30e-6, act_h=16, act_f=6, act_f_selective=4, act_h_full=2,
    act_h_unsplit=20, forward_share=1 / 3, elementwise_h=60, elementwise_f=16, fragmentation=1.15, margin_fraction=0.10,
    reserved_gib=2.5, sharded_bytes_per_param=12, local_bytes_per_param=6, nccl_collective_mib=256, nccl_p2p_peer_mib=8,
    sources=(
        ("gemm_shard", "GEMM efficiency = gemm_efficiency * w/(w+8e6) * m/(m+gemm_m_half), w = per-GPU weights of one "
                       "layer's GEMMs (TP split), m = per-GPU tokens (CP split): narrow or short GEMMs leave SMs idle "
                       "(Hydraulis appendix D); the m term is exactly a per-micro-batch constant in T"),
        ("link_efficiency", "0.8: NCCL bus bandwidth vs nominal link bandwidth (nccl-tests on NVLink/IB clusters)"),
        ("launch", "70 kernels per layer fwd+bwd x 7 us host launch cost in eager PyTorch; 15/30 us NCCL latency "
                   "over NVLink/IB (estimates); these make up most of c (Hydraulis appendix C.2)"),
        ("activations", "bf16 activations kept per token per layer, with sequence parallelism all divided by TP x CP "
                        "(Hydraulis appendix C.1; Korthikanti et al. 2022 sec. 4.2.2: the TP regions' inputs are kept "
                        "as SP rows and gathered again in the backward), FlashAttention (no score matrices): norm inputs "
                        "2x2h, QKV and MLP inputs 2x2h, Q/K/V 6h, attention output 2h, SwiGLU gate/up 4f and product 2f "
                        "= 16h+6f (cf. Korthikanti: 34h/t for GPT with SP); selective recomputation keeps gate and up "
                        "and recomputes the product (16h+4f; FlashAttention already recomputes the attention scores); "
                        "full recomputation keeps each layer's input, 2h; plus one layer's 16h+6f live in its backward "
                        "(recomputed under full), plus fp32 logits and their gradient (10 bytes x vocab/TP/CP) on the "
                        "last stage"),
        ("unsplit", "20h bytes per token split by CP only: what sequence parallelism does not split, the full-length "
                    "[l, h] tensors around a layer's TP regions (the gathered input of a column-parallel GEMM, the "
                    "partial output of a row-parallel one and its padded reduce-scatter copy, in the backward the "
                    "gathered output gradient and the input gradient before its reduce-scatter, with the next "
                    "region's gather in flight: 8-12h in bf16 by count) and the RoPE tables; an estimate, raised to "
                    "20h so that A800 7B's MaxLen at TP 2-16 lands within 20% of Hydraulis' (whose MaxLen grows less "
                    "with TP than 1/TP activations predict; see max_len_vs_hydraulis)"),
        ("fragmentation", "1.15x on activations: caching-allocator fragmentation with a different packed length "
                          "each micro-batch (estimate; 1.2 before LNK's windows and NCCL's buffers were counted as "
                          "terms of their own, lowered with them so that A800 7B's MaxLen at TP 2 stays within 20% of "
                          "Hydraulis')"),
        ("recompute_time", "recomputation re-runs forward work in the backward. selective: the SwiGLU product from "
                           "the kept gate and up, 6f bytes per token per layer of elementwise traffic (no GEMM, no "
                           "attention: FlashAttention recomputes its scores anyway). full: each decoder layer's whole "
                           "forward once more: its GEMMs (1/3 of their forward+backward FLOPs), the attention forward "
                           "(2/7 of the attention FLOPs), 1/3 of its elementwise traffic and launches, its 4 forward TP "
                           "collectives and its forward CP K/V ring (the LM head is not recomputed)"),
        ("context_parallel", "ring attention (Megatron/TransformerEngine CP): per layer the K/V of the other CP ranks "
                             "pass around the ring, 4h(cp-1)/(cp tp) bytes per token forward and 8h(cp-1)/(cp tp) "
                             "backward (K/V again, dK/dV), over NVLink inside a node and InfiniBand when tp*cp exceeds "
                             "it; each ring step's transfer overlaps that step's attention, so only "
                             "max(0, ring - attention*(cp-1)/cp) is exposed, and T(l) for cp > 1 is that model fitted "
                             "to a*l^2 + b*l + c over single sequences from 1/16 of the layout's MaxLen without "
                             "recomputation to its MaxLen with full recomputation, the lengths CP serves "
                             "(fit_worst_rel_err; micro-batches of short documents alone would see more of the ring)"),
        ("margin", "usable memory = 90% of HBM minus 2.5 GiB (CUDA context and kernel images, cuBLAS/cuDNN and "
                   "attention workspaces, caching-allocator reserve; estimate); NCCL's buffers are memory.communicators"),
        ("states", "appendix C.1 with alpha = 3/4: fp32 master + Adam m, v (12 B/param) sharded over all N GPUs; "
                   "bf16 weights + fp32 gradient accumulators (6 B/param: the runtime accumulates across micro-batches "
                   "in fp32) of the stage split by TP; LNK's in-flight buffers are memory.lnk_pull and memory.lnk_push"),
        ("nccl", "NCCL_BUFFSIZE defaults to 4 MiB per connection buffer (NCCL environment-variable documentation); "
                 "256 MiB per collective communicator (up to 32 channels x 2 ring neighbours x 4 MiB) and 8 MiB per "
                 "p2p peer (2 channels x 4 MiB) are estimates of what the runtime's communicators allocate"),
        ("elementwise", "bytes per token per layer, fwd+bwd, bf16: two RMSNorms 20h, residual adds 24h, rotary on "
                        "Q and K 16h, SwiGLU 16f = 60h+16f, at 80% of HBM bandwidth; cross-entropy 16 B per vocab "
                        "entry (estimate from the kernels' reads and writes)"),
    ),
)

GPUS: dict[str, GPUSpec] = {g.key: g for g in (H100, H200, A100, A800)}
LLAMA2_GPUS = ("h100", "a800")
"""The GPUs the bundled LLaMA-2 profiles are generated for."""

HYDRAULIS_MAX_LEN: dict[tuple[str, str], dict[int, int]] = {("a800", "llama2-7b"): {2: 22_000, 4: 46_000, 8: 85_000,
                                                                                    16: 138_000}}
"""MaxLen of <TP,1,1> without recomputation in Hydraulis (appendix C.1's model as its released code computes it for
A800 80 GB and LLaMA-2 7B: 85,358 at TP 8, 137,985 at TP 16), what the analytic profile's notes compare with."""

MODELS: dict[str, ModelSpec] = {
    m.key: m
    for m in (
        ModelSpec("llama2-7b", "LLaMA-2 7B", layers=32, hidden=4096, ffn=11008, heads=32, vocab=32000,
                  source="LLaMA-2 7B config (Touvron et al. 2023): 32 layers, hidden 4096, FFN 11008, 32 heads, vocab 32000"),
        ModelSpec("llama2-13b", "LLaMA-2 13B", layers=40, hidden=5120, ffn=13824, heads=40, vocab=32000,
                  source="LLaMA-2 13B config: 40 layers, hidden 5120, FFN 13824, 40 heads (so TP=16 is impossible), vocab 32000"),
        ModelSpec("llama2-32b", "LLaMA-style 32B", layers=60, hidden=6656, ffn=17920, heads=64, vocab=32000,
                  source="FlexSP appendix table 5 GPT-30B: 60 layers, hidden 6656, 32.72B params (incl. a 384K "
                         "positional table); the table gives no FFN or heads: FFN 17920 from LLaMA-1 33B (same "
                         "60x6656 shape, 32.5B params); 64 heads of 104 so TP 8 and 16 divide them, as FlexSP's "
                         "Megatron baselines use TP=8/16 on this model"),
    )
}
