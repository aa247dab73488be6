"""Training frameworks' constants (kernel counts, fused-kernel traffic, what overlaps, memory per token): hydraplan's
own runtime (FRAMEWORK, what the bundled profiles model), Megatron-Core with Transformer Engine (NeMo, Megatron-LM)
and torchtitan, each number with its source. The GPU's constants are in hydraplan.core.hardware."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class FrameworkSpec:
    """A training framework's constants: Megatron-style tensor parallelism with sequence parallelism (inputs of the TP
    regions gathered again in the backward), ring context parallelism, FlashAttention, bf16 weights, fp32 gradient
    accumulation, activation recomputation none, selective or full, and Transformer Engine's FP8 GEMMs."""

    name: str
    weight_half: float  # per-GPU weights of one layer's GEMMs at which GEMM efficiency halves (TP split)
    memory_efficiency: float  # achieved / nominal HBM bandwidth of elementwise kernels
    kernels_per_layer: int  # kernel launches per decoder layer, forward + backward
    kernels_head: int  # launches of embedding, final norm, LM head and cross-entropy, fwd + bwd
    launch_s: float  # the host's cost of one kernel launch: a stage lasts at least its launches (the launch floor)
    kernel_gap_s: float  # what every kernel costs the GPU whatever its work (gap before it, partial last wave)
    attention_kernel: str | None  # the attention kernel (kernelrates.RATES); None: the GPU's (KERNEL_OF_GPU)
    tp_overlap: bool  # TP's collectives pipelined with the GEMMs beside them (Transformer Engine's userbuffers)
    cp_kernels_per_step: int  # launches of one ring step of CP attention (attention call, merge, send/recv), fwd+bwd
    cp_merge_bytes: float  # HBM bytes per query element a ring step's output (forward) and dQ (backward) merge moves
    fp8_cast_bytes: float  # HBM bytes per element of each FP8 GEMM input and output gradient: its casts
    fp8_kernels_per_layer: int  # the casts', transposes' and amax/scale kernels' launches per layer, fwd + bwd
    optimizer_bytes_per_param: int  # HBM bytes the optimizer step moves per parameter it owns
    selective_gemm_share: float  # share of the forward GEMMs selective recomputation re-runs (torchtitan's per-op SAC)
    act_h: int  # activation bytes kept per token per layer, split by TP (with SP) and CP: act_h*h + act_f*ffn (bf16)
    act_f: int
    act_h_full: int  # full recomputation: act_h_full*h, each layer's input (SP rows)
    act_h_fp8: int  # FP8 GEMMs: act_h_fp8*h + act_f_fp8*ffn (the GEMM inputs kept for the backward in fp8)
    act_f_fp8: int
    fp8_weight_bytes: int  # bytes per layer GEMM weight of its FP8 copy and transpose, kept through an iteration
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


FRAMEWORK = FrameworkSpec(
    name="hydraplan", weight_half=15.5e6, memory_efficiency=0.8, kernels_per_layer=70, kernels_head=20, launch_s=7e-6,
    kernel_gap_s=3e-6,
    attention_kernel=None, tp_overlap=False, cp_kernels_per_step=10, cp_merge_bytes=16, fp8_cast_bytes=4,
    fp8_kernels_per_layer=24, optimizer_bytes_per_param=34, selective_gemm_share=0.0, act_h=16, act_f=6, act_h_full=2,
    act_h_fp8=13, act_f_fp8=5, fp8_weight_bytes=2, act_h_unsplit=20, forward_share=1 / 3, elementwise_h=60,
    elementwise_f=16, fragmentation=1.15, margin_fraction=0.10, reserved_gib=2.5, sharded_bytes_per_param=12,
    local_bytes_per_param=6, nccl_collective_mib=256, nccl_p2p_peer_mib=8,
    sources=(
        ("gemm_shard", "GEMM efficiency = gemm_efficiency * w/(w + 15.5e6) * m/(m + gemm_m_half), w = per-GPU weights "
                       "of one layer's GEMMs (TP split), m = per-GPU tokens (CP split): narrow or short GEMMs leave SMs "
                       "idle (Hydraulis appendix D); the m term is exactly a per-micro-batch constant in T; weight_half "
                       "fitted with the GPUs' gemm_efficiency to the published training iterations (gpu.gemm_efficiency)"),
        ("launch", "70 kernels per layer fwd+bwd (the runtime's eager PyTorch layer: norms, rotary, SwiGLU, residuals, "
                   "attention, GEMMs, their backward), 20 for the head: the host launches each in 7 us, so a stage "
                   "lasts at least its launches (the launch floor: launch_exposed), and each costs the GPU 3 us "
                   "whatever its work (kernel_gaps: the gap before it, its last partial wave; estimates, Hydraulis "
                   "appendix C.2 finds most of c in launches and latencies)"),
        ("cp_step", "ring attention step (Transformer Engine's context_parallel.py, the runtime's context_parallel.py): "
                    "10 launches per step fwd+bwd (the attention call, the output or dQ/dK/dV merge, the K/V send and "
                    "receive, their waits); the merge reads and writes the step's partial output and log-sum-exp "
                    "(forward) and accumulates dQ and dK/dV in fp32 (backward): 16 bytes per query element per step "
                    "(estimate from the kernels' reads and writes)"),
        ("fp8", "Transformer Engine FP8 (delayed or current scaling): each GEMM input (QKV, O, FC1, FC2: 3h+f per "
                "token) and output gradient (h+2kv_dim, h, 2f, h) is cast to fp8 with a transposed copy for the "
                "weight gradient, 4 bytes moved per element (read bf16, write fp8 twice), 24 more launches per layer "
                "(casts, transposes, amax and scale updates); the GEMM inputs kept for the backward are fp8: 13h+5f "
                "bytes per token instead of 16h+6f (the norm outputs feeding QKV and FC1, the attention output and "
                "the SwiGLU product in one byte); the fp8 weights and their transposes, 2 bytes per layer GEMM "
                "weight, are cast once per iteration and kept (fp8_weights); attention and the LM head stay bf16"),
        ("optimizer", "AdamW step per owned parameter: read fp32 master, gradient, m, v (16 B), write master, m, v (12 "
                      "B), write the bf16 copy (2 B), the gradient-norm pass (4 B) = 34 bytes at HBM bandwidth"),
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
        ("context_parallel", "ring attention (Megatron/Transformer Engine CP, the runtime's context_parallel.py): per "
                             "layer and pass, cp-1 sends of K and V (dK and dV too in the backward) of l/cp tokens, "
                             "kv_dim/tp wide, over NVLink inside a node and InfiniBand when tp*cp exceeds it, each beside "
                             "the previous step's attention: (cp-1) * max(0, latency + bytes/bandwidth - attention/cp) "
                             "exposed (time.cp_ring_exposed), fitted as nonnegative increments of a, b, c over the lengths "
                             "the layout serves, from 1/16 of its MaxLen without recomputation to its MaxLen with full "
                             "recomputation (fit_worst_rel_err)"),
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


MEGATRON = replace(
    FRAMEWORK, name="megatron", attention_kernel="flash-attention-2", tp_overlap=True, sources=FRAMEWORK.sources + (
        ("megatron", "Megatron-Core with Transformer Engine as NeMo 24.x and Megatron-LM r0.8 ran it: the runtime's "
                     "constants, with TP's collectives pipelined with the GEMMs (--tp-comm-overlap, Transformer "
                     "Engine's userbuffers: the recipes and the README state it) and attention at FlashAttention-2's "
                     "rate (Transformer Engine 1.x's fused attention: NeMo's long-sequence table, 4K-1M tokens, fits "
                     "it within 8%, FlashAttention-3's rate within 55%)"),
    ))
MEGATRON_BRIDGE = replace(
    MEGATRON, name="megatron-bridge", attention_kernel="flash-attention-3", sources=MEGATRON.sources + (
        ("megatron-bridge", "Megatron-Bridge 25.x (Transformer Engine 2.x): as Megatron-Core, attention at "
                            "FlashAttention-3's rate (cuDNN 9's fused attention on Hopper)"),
    ))
TORCHTITAN = replace(
    FRAMEWORK, name="torchtitan", attention_kernel="flash-attention-2", tp_overlap=True, selective_gemm_share=0.5,
    elementwise_h=70, elementwise_f=19, fp8_cast_bytes=7, sources=FRAMEWORK.sources + (
        ("torchtitan", "torchtitan (FSDP2, torch.compile, torchao float8) as its benchmark pages ran it: attention "
                       "through PyTorch's SDPA at FlashAttention-2's rate; TP's collectives pipelined with the GEMMs "
                       "(async TP, most of its TP runs; its vanilla-TP runs are 8-10% slower); its per-op selective "
                       "recomputation re-runs every other matmul's forward (selective_gemm_share 0.5, torchtitan's "
                       "op-SAC policy); elementwise traffic 70h+19f and FP8 casts of 7 bytes per element (dynamic "
                       "scaling reads each tensor once more for its amax), the last two fitted to its published "
                       "iterations"),
    ))
FRAMEWORKS = {f.name: f for f in (FRAMEWORK, MEGATRON, MEGATRON_BRIDGE, TORCHTITAN)}
"""The frameworks whose constants hydraplan knows, by name (profiles generate --framework)."""
