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
    key: str
    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    vocab: int
    source: str

    @property
    def layer_matmul_params(self) -> int:
        """Weights of one decoder layer's GEMMs: Q, K, V, O (4h^2, MHA) and SwiGLU gate/up/down (3hf)."""
        return 4 * self.hidden**2 + 3 * self.hidden * self.ffn

    @property
    def layer_params(self) -> int:
        return self.layer_matmul_params + 2 * self.hidden  # + two RMSNorm weights

    @property
    def params(self) -> int:
        """All parameters: layers, untied input embedding and LM head, final norm."""
        return self.layers * self.layer_params + 2 * self.vocab * self.hidden + self.hidden


@dataclass(frozen=True)
class FrameworkSpec:
    """Megatron-style tensor parallelism WITHOUT sequence parallelism (the runtime has none), FlashAttention, bf16
    weights, fp32 gradient accumulation and no recomputation."""

    weight_half: float  # per-GPU weights of one layer's GEMMs at which GEMM efficiency halves (TP split)
    link_efficiency: float  # achieved / nominal bandwidth of NCCL collectives and p2p
    memory_efficiency: float  # achieved / nominal HBM bandwidth of elementwise kernels
    kernels_per_layer: int  # kernel launches per decoder layer, forward + backward
    kernels_head: int  # launches of embedding, final norm, LM head and cross-entropy, fwd + bwd
    launch_s: float  # host-side cost of one launch when the GPU is starved (eager PyTorch)
    nvlink_latency_s: float  # small-message latency of one NCCL collective / p2p step over NVLink
    ib_latency_s: float  # same across InfiniBand
    act_h_replicated: int  # saved activation bytes per token per layer that every TP rank keeps whole (x h, split by CP)
    act_h: int  # ... and that TP splits: act_h*h + act_f*ffn (bf16, split by TP and CP)
    act_f: int
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

FRAMEWORK = FrameworkSpec(
    weight_half=8e6, link_efficiency=0.8, memory_efficiency=0.8, kernels_per_layer=70, kernels_head=20,
    launch_s=7e-6, nvlink_latency_s=15e-6, ib_latency_s=30e-6, act_h_replicated=8, act_h=8, act_f=6, elementwise_h=60,
    elementwise_f=16, fragmentation=1.25, margin_fraction=0.10, reserved_gib=2.5, sharded_bytes_per_param=12,
    local_bytes_per_param=6, nccl_collective_mib=256, nccl_p2p_peer_mib=8,
    sources=(
        ("gemm_shard", "GEMM efficiency = gemm_efficiency * w/(w+8e6) * m/(m+gemm_m_half), w = per-GPU weights of one "
                       "layer's GEMMs (TP split), m = per-GPU tokens (CP split): narrow or short GEMMs leave SMs idle "
                       "(Hydraulis appendix D); the m term is exactly a per-micro-batch constant in T"),
        ("link_efficiency", "0.8: NCCL bus bandwidth vs nominal link bandwidth (nccl-tests on NVLink/IB clusters)"),
        ("launch", "70 kernels per layer fwd+bwd x 7 us host launch cost in eager PyTorch; 15/30 us NCCL latency "
                   "over NVLink/IB (estimates); these make up most of c (Hydraulis appendix C.2)"),
        ("activations", "saved bf16 activations per token per layer, TP+CP split, no sequence parallelism (the "
                        "runtime has none, so every TP rank keeps the norm and GEMM inputs whole), FlashAttention, no "
                        "recompute: norm inputs 2x2h and GEMM inputs 2x2h replicated = 8h; Q/K/V 6h, attention output "
                        "2h, SwiGLU gate/up/out 6f split by TP = 8h+6f (cf. Korthikanti et al. 2022: 10h replicated + "
                        "24h/t for GPT without SP), plus one layer of backward workspace, plus fp32 logits/grad "
                        "(10 bytes x vocab/TP) on the last stage"),
        ("fragmentation", "1.25x on activations: caching-allocator fragmentation with a different packed length each "
                          "micro-batch (estimate, calibrated with sequence parallelism so A800 7B <2,1,1> "
                          "MaxLen landed near Hydraulis' 22K; without it that MaxLen is lower)"),
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

GPUS: dict[str, GPUSpec] = {g.key: g for g in (H100, A800)}

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
