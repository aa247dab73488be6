"""Spec tables behind the analytic profiles: GPUs and models (the training frameworks' constants:
hydraplan.core.frameworks; attention kernels' rates: hydraplan.core.kernelrates).

Every number carries its source so the generated profiles can record it in their `notes`. Datasheet values are
exact; efficiencies, latencies and overheads are calibrated to the published measurements of data/published/
(`python -m bench fidelity`) where those cover them, and engineering estimates (stated as such) elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Protocol:
    """One NCCL protocol (LL, LL128, Simple) on a fabric: its fixed latency and the bus bandwidth it reaches."""

    latency_s: float
    busbw_GBps: float


@dataclass(frozen=True)
class Fabric:
    """What NCCL's collectives reach on one fabric (hydraplan.core.collectives): each protocol's fixed latency and the
    bus bandwidth its all-reduce reaches (NVLS inside a Hopper node, a tree across nodes: NCCL picks the fastest
    protocol for a size), the bus bandwidth of a ring (all-gather, reduce-scatter), the latency of each dependent hop
    of a ring or tree, and across nodes one GPU's NIC (all-to-all, sends). Measured by nccl-tests at `gpus` GPUs."""

    name: str
    gpus: int
    protocols: tuple[Protocol, ...]
    ring_GBps: float
    hop_s: float
    nic_GBps: float
    source: str
    alltoall_GBps: float = 0.0  # across nodes: the per-GPU NIC rate an all-to-all reaches (0: the NIC's)


@dataclass(frozen=True)
class GPUSpec:
    key: str  # profile-name prefix
    name: str
    memory_gib: float
    peak_tflops: float  # dense bf16 tensor-core peak
    fp8_tflops: float | None  # dense fp8 tensor-core peak (None: no FP8 tensor cores)
    hbm_gb_s: float
    nvlink_gb_s: float  # bidirectional NVLink bandwidth per GPU (datasheet convention)
    ib_gb_s_per_node: float  # aggregate InfiniBand bandwidth of an 8-GPU node, one direction
    gpus_per_node: int
    gemm_efficiency: float  # fraction of the bf16 peak reached by wide, long training GEMMs (fwd + dgrad + wgrad)
    fp8_gemm_efficiency: float | None  # the same of the fp8 peak, for Transformer Engine's FP8 GEMMs
    gemm_m_half: int  # per-GPU tokens at which a GEMM reaches half its asymptotic efficiency
    node_fabric: Fabric  # NCCL's collectives inside a node (NVLink; NVLS on Hopper)
    net_fabric: Fabric  # NCCL's collectives across nodes
    sources: tuple[tuple[str, str], ...]
    power_factor: float = 1.0  # sustained tensor-core clock under the part's power limit / the datasheet's

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


PUBLISHED = "data/published/"
NVLINK_H100 = Fabric(
    "nvlink4-h100", 8, (Protocol(28.43e-6, 12.5), Protocol(37.43e-6, 325.5), Protocol(81.43e-6, 448.2)), ring_GBps=340.3,
    hop_s=1.24e-6, nic_GBps=370.0,
    source=f"nccl-tests inside one H100 node: all-reduce with NVLS on 8 GPUs ({PUBLISHED}azure-nd-h100-v5-nccl.json, NCCL "
           f"2.18.5; nvidia-dgxc-h100-nccl.json; voltagepark-h100-ib-nccl.json's node) and all-reduce, all-gather, "
           f"reduce-scatter on 4 ({PUBLISHED}h100-4gpu-nvswitch-nccl.json, NCCL 2.29.2): three protocols, the ring's "
           "bandwidth and hop fitted to the 51 points by their worst relative error (12%), each system's latency its "
           "own (hardware.NCCL_LATENCY); a send at the 370 of NVLink's 450 GB/s per direction usable (NVIDIA's sjeaugey, "
           "NVIDIA/nccl-tests issue 212)")
NVLINK_H200 = Fabric(
    "nvlink4-h200", 8, (Protocol(29.74e-6, 307.8), Protocol(74.15e-6, 470.1)), ring_GBps=340.3, hop_s=1.24e-6,
    nic_GBps=370.0,
    source=f"nccl-tests all-reduce with NVLS on 8 H200 ({PUBLISHED}azure-nd-h200-v5-nccl.json, NCCL 2.20.5): two "
           "protocols fitted to its 23 sizes (worst 4.7%); the ring, hop and sends as H100's (the same NVLink 4)")
NVLINK_A100 = Fabric("nvlink3-a100", 8, (Protocol(28.43e-6, 12.5), Protocol(37.43e-6, 230.0)), ring_GBps=230.0,
                     hop_s=1.24e-6, nic_GBps=245.0,
                     source="estimate (no published A100 measurement in data/published): H100's latencies, NVLink 3's "
                            "300 GB/s per direction at H100's usable share")
NVLINK_A800 = Fabric("nvlink3-a800", 8, (Protocol(28.43e-6, 12.5), Protocol(37.43e-6, 153.0)), ring_GBps=153.0,
                     hop_s=1.24e-6, nic_GBps=163.0,
                     source="estimate (no published A800 measurement in data/published): H100's latencies, the A800's "
                            "200 GB/s NVLink per direction at H100's usable share")
NDR = Fabric(
    "infiniband", 32, (Protocol(45.75e-6, 16.2), Protocol(86.91e-6, 152.0), Protocol(469.1e-6, 363.4)),
    ring_GBps=340.3, hop_s=0.49e-6, nic_GBps=45.0,
    source=f"nccl-tests across H100 nodes over NDR InfiniBand: all-reduce and all-gather on 4 x 8 GPUs "
           f"({PUBLISHED}voltagepark-h100-ib-nccl.json, NCCL 2.24.3) and all-reduce with SHARP on 8 x 8 "
           f"({PUBLISHED}coreweave-h100-64gpu-sharp-nccl.json): three protocols and the hop fitted to the 15 points "
           "(worst 14%); a NIC's send at 0.9 of its 50 GB/s")
HDR = Fabric("infiniband-hdr", 32, (Protocol(45.75e-6, 8.1), Protocol(86.91e-6, 76.0), Protocol(469.1e-6, 181.7)),
             ring_GBps=230.0, hop_s=0.49e-6, nic_GBps=22.5,
             source="estimate: the NDR fabric's latencies and half its bandwidths (HDR's 200 Gb/s NICs)")
TCPXO = Fabric(
    "gcp-a3-mega", 16, (Protocol(134.6e-6, 32.9), Protocol(902.1e-6, 424.2)), ring_GBps=340.3, hop_s=3.1e-6,
    nic_GBps=22.5,
    source=f"nccl-tests all-reduce on 2 x 8 H100 over GPUDirect-TCPXO ({PUBLISHED}gcp-a3mega-h100-2node-nccl.json): two "
           "protocols and the hop fitted to its 21 sizes (worst 10%); a NIC's send at 0.9 of 200 Gb/s")
NCCL_LATENCY = {"nvidia-dgxc-h100-nccl": 0.565, "h100-4gpu-nvswitch-nccl": 0.61}
"""NCCL's latencies (every protocol's and the hop) on a measured system relative to its fabric's: the systems of
data/published whose NCCL differs from the fabric's reference (DGX Cloud's sample, NCCL 2.29.2 on a 4-GPU slice) ran
at these fractions of it (fitted with the fabric; the others at 1)."""
FABRICS = {f.name: f for f in (NDR, HDR, TCPXO)}
"""Fabrics across nodes by name (a GPU's own is its net_fabric)."""

H100 = GPUSpec(
    key="h100", name="H100-SXM-80GB", memory_gib=80, peak_tflops=989.4, fp8_tflops=1978.9, hbm_gb_s=3350,
    nvlink_gb_s=900, ib_gb_s_per_node=400, gpus_per_node=8, gemm_efficiency=0.70, fp8_gemm_efficiency=0.65,
    gemm_m_half=384, node_fabric=NVLINK_H100, net_fabric=NDR,
    sources=(
        ("peak_tflops", "989.4 dense BF16 and 1978.9 dense FP8 TFLOP/s, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s "
                        "(NVIDIA H100 SXM5 datasheet)"),
        ("ib", "DGX H100: 8x ConnectX-7 400 Gb/s NDR, one per GPU = 400 GB/s per node, 50 GB/s per GPU per direction "
               "(NVIDIA DGX H100 user guide); the brief's '400 GB/s' read as this node aggregate"),
        ("gemm_efficiency", "0.70 of the bf16 peak and 0.65 of the fp8 peak for wide, long training GEMMs (fwd, dgrad, "
                            "wgrad), weight_half 15.5M (hydraplan.core.frameworks): fitted with the frameworks' few "
                            "constants to the published training iterations of data/published (NeMo 24.x FP8, "
                            "Megatron-LM r0.8 BF16, Megatron-Bridge 25.11 FP8, torchtitan BF16/FP8; `python -m bench "
                            "fidelity`: every point within 15%)"),
        ("gemm_m_half", "384 tokens: H100's 132 SMs need larger M tiles than A100 to fill (estimate)"),
        ("nccl", f"NCCL inside a node: {NVLINK_H100.source}; across nodes (InfiniBand NDR): {NDR.source}"),
    ),
)

A800 = GPUSpec(
    key="a800", name="A800-80GB", memory_gib=80, peak_tflops=312.0, fp8_tflops=None, hbm_gb_s=2039, nvlink_gb_s=400,
    ib_gb_s_per_node=200, gpus_per_node=8, gemm_efficiency=0.70, fp8_gemm_efficiency=None, gemm_m_half=256,
    node_fabric=NVLINK_A800, net_fabric=HDR,
    sources=(
        ("peak_tflops", "312 dense BF16 TFLOP/s, 80 GB HBM2e at 2.039 TB/s (NVIDIA A100/A800 80GB SXM datasheet); "
                        "A800 NVLink capped at 400 GB/s (NVIDIA A800 datasheet); no FP8 tensor cores"),
        ("ib", "Hydraulis appendix H: '400 GB/s NVLink and 200 GB/s IB' for its A800 cluster = 8x HDR 200 Gb/s "
               "per node, 25 GB/s per GPU per direction"),
        ("gemm_efficiency", "0.70 of peak (~218 TFLOP/s) for wide training GEMMs incl. transposed dgrad/wgrad; "
                            "estimate: Megatron-LM reaches 52% end-to-end MFU on A100 (Narayanan et al. SC'21)"),
        ("gemm_m_half", "256 tokens: cuBLAS bf16 GEMMs with K=N=4096 reach about half their plateau near M=256 (estimate)"),
        ("nccl", f"{NVLINK_A800.source}; across nodes: {HDR.source}"),
    ),
)

H200 = GPUSpec(
    key="h200", name="H200-SXM-141GB", memory_gib=140, peak_tflops=989.4, fp8_tflops=1978.9, hbm_gb_s=4800,
    nvlink_gb_s=900, ib_gb_s_per_node=400, gpus_per_node=8, gemm_efficiency=0.70, fp8_gemm_efficiency=0.65,
    gemm_m_half=384, node_fabric=NVLINK_H200, net_fabric=NDR,
    sources=(
        ("peak_tflops", "989.4 dense BF16 and 1978.9 dense FP8 TFLOP/s (the H100's Hopper GH100 compute), 141 GB HBM3e "
                        "at 4.8 TB/s, NVLink 900 GB/s (NVIDIA H200 SXM datasheet); memory_gib 140: the device exposes "
                        "about 140 GiB of the 141 GB (nvidia-smi reports 143,771 MiB)"),
        ("ib", "DGX H200: 8x ConnectX-7 400 Gb/s NDR, one per GPU = 400 GB/s per node, 50 GB/s per GPU per direction "
               "(NVIDIA DGX H200 datasheet), as DGX H100"),
        ("gemm_efficiency", "as H100: the same SMs and clocks; the faster HBM helps memory-bound kernels (hbm_gb_s), "
                            "not the compute-bound GEMMs"),
        ("gemm_m_half", "384 tokens, as H100 (same SM count; estimate)"),
        ("nccl", f"NCCL inside a node: {NVLINK_H200.source}; across nodes and sends as H100 (the same NVLink 4 and "
                 "NDR fabric)"),
    ),
)

A100 = GPUSpec(
    key="a100", name="A100-SXM-80GB", memory_gib=80, peak_tflops=312.0, fp8_tflops=None, hbm_gb_s=2039, nvlink_gb_s=600,
    ib_gb_s_per_node=200, gpus_per_node=8, gemm_efficiency=0.70, fp8_gemm_efficiency=None, gemm_m_half=256,
    node_fabric=NVLINK_A100, net_fabric=HDR,
    sources=(
        ("peak_tflops", "312 dense BF16 TFLOP/s, 80 GB HBM2e at 2.039 TB/s, NVLink 600 GB/s (NVIDIA A100 80GB SXM "
                        "datasheet); no FP8 tensor cores"),
        ("ib", "DGX A100: 8x ConnectX-6 200 Gb/s HDR for the compute fabric, one per GPU = 200 GB/s per node, 25 GB/s "
               "per GPU per direction (NVIDIA DGX A100 user guide)"),
        ("gemm_efficiency", "0.70 of peak, as A800 (the same GA100 silicon; A800 differs only in NVLink): Megatron-LM "
                            "reaches 52% end-to-end MFU on A100 (Narayanan et al. SC'21)"),
        ("gemm_m_half", "256 tokens, as A800 (estimate)"),
        ("nccl", f"{NVLINK_A100.source}; across nodes: {HDR.source}"),
    ),
)

H100_500W = replace(
    H100, key="h100-500w", name="H100-SXM-96GB-500W", memory_gib=96, hbm_gb_s=2400, power_factor=0.69,
    sources=H100.sources + (
        ("power_factor", "H100 SXM 96 GB HBM2e (2.4 TB/s) run at a 500 W power limit (Meta's Grand Teton hosts of "
                         "torchtitan's benchmarks, data/published/torchtitan-*-h100-*.json): the tensor cores' sustained "
                         "clock at 0.69 of the 700 W part's, calibrated to those benchmarks against the H200's"),
    ))
GPUS: dict[str, GPUSpec] = {g.key: g for g in (H100, H200, A100, A800, H100_500W)}
LLAMA2_GPUS = ("h100", "a800")
"""The GPUs the bundled LLaMA-2 profiles are generated for."""
FP8_GPUS = tuple(k for k, g in GPUS.items() if g.fp8_tflops is not None)
"""The GPUs with FP8 tensor cores (FP8 profiles)."""

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
