"""Analytic profiles from GPU and model specs (core/hardware.py): T(l) per scheme from FLOPs, bandwidths and
latencies, the appendix C.1 memory model, and the notes that cite every constant."""

from __future__ import annotations

from hydraplan.core.cluster import max_len_from_memory
from hydraplan.core.cost import UTIL_THRESHOLD, util_len
from hydraplan.core.hardware import FRAMEWORK, GPUS, MODELS, FrameworkSpec, GPUSpec, ModelSpec
from hydraplan.core.memory import LNK_SOURCE, lnk_terms
from hydraplan.core.schema import GPUInfo, ModelInfo, Network, Profile, ProfileMemory, Scheme, SchemeMemory, TimeCoeffs

# --------------------------------------------------------------------------------- analytic profiles
TP_DEGREES = (1, 2, 4, 8, 16)
CP_DEGREES = (1, 2, 4, 8)
MAX_PP = 8
MAX_SCHEME_GPUS = 64
REFERENCE_GPUS = 64
MIN_MAX_LEN = 1024  # a scheme that cannot hold a 1K-token micro-batch at the reference size is omitted


def _gemm_efficiency(gpu: GPUSpec, weights_per_gpu: float, fw: FrameworkSpec) -> float:
    """Asymptotic (long-M) GEMM efficiency; narrow TP shards leave SMs idle."""
    return gpu.gemm_efficiency * weights_per_gpu / (weights_per_gpu + fw.weight_half)


def _link(gpu: GPUSpec, fw: FrameworkSpec, crosses_nodes: bool) -> tuple[float, float]:
    """(achieved bytes/s per GPU, per-message latency) of NVLink inside a node or IB across nodes."""
    if crosses_nodes:
        return gpu.ib_bytes_s * fw.link_efficiency, fw.ib_latency_s
    return gpu.nvlink_bytes_s * fw.link_efficiency, fw.nvlink_latency_s


def analytic_time(gpu: GPUSpec, model: ModelSpec, tp: int, pp: int, cp: int,
                  fw: FrameworkSpec = FRAMEWORK) -> TimeCoeffs:
    """T(l) of the last pipeline stage (layers/pp decoder layers + LM head and loss, the slowest stage,
    which sets the 1F1B steady state): fwd+bwd of one micro-batch of l packed tokens, seconds.

    a: causal FlashAttention, 2*h*l^2 FLOPs per layer forward, backward 2.5x forward, split over TP x CP.
    b: GEMMs (6 FLOPs per weight per token) at the TP-dependent efficiency, elementwise kernels at HBM
       bandwidth, TP all-gather/reduce-scatter of the l x h activation (8 per layer, SP), the CP K/V ring
       (K,V forward; K,V and dK,dV backward), PP activation/gradient p2p.
    c: the GEMMs' short-M under-utilization (efficiency m/(m+m_half) at m = l/cp tokens per GPU is
       exactly g*(m + m_half): a constant of m_half tokens' GEMM time), kernel launches, collective and
       p2p latencies.
    A group larger than a node crosses InfiniBand: TP if tp > gpus_per_node, CP if tp*cp > gpus_per_node,
    PP if the whole pipeline does not fit in one node.
    """
    h, f, vocab, gpn = model.hidden, model.ffn, model.vocab, gpu.gpus_per_node
    layers = model.layers // pp
    peak = gpu.peak_tflops * 1e12
    w_layer = model.layer_matmul_params / tp
    w_head = vocab * h / tp
    gemm_per_token = 6 * (layers * w_layer / _gemm_efficiency(gpu, w_layer, fw)
                          + w_head / _gemm_efficiency(gpu, w_head, fw)) / peak
    a = 7.0 * h * layers / (tp * cp) / (peak * gpu.attention_efficiency)
    hbm = gpu.hbm_gb_s * 1e9 * fw.memory_efficiency
    elementwise = (layers * (fw.elementwise_h * h + fw.elementwise_f * f) + 16 * vocab) / (tp * cp) / hbm
    b = gemm_per_token / cp + elementwise
    c = gemm_per_token * gpu.gemm_m_half + (fw.kernels_per_layer * layers + fw.kernels_head) * fw.launch_s
    if tp > 1:
        bw, lat = _link(gpu, fw, tp > gpn)
        collectives = 8 * layers + 2  # 4 fwd + 4 bwd per layer; LM-head input all-gather, grad reduce-scatter
        b += collectives * (tp - 1) / tp * 2 * h / cp / bw
        c += collectives * lat
    if cp > 1:
        bw, lat = _link(gpu, fw, tp * cp > gpn)
        b += layers * 12 * (cp - 1) / cp * h / tp / bw
        c += layers * 3 * (cp - 1) * lat
    if pp > 1:
        bw, lat = _link(gpu, fw, tp * cp * pp > gpn)
        b += 2 * 2 * h / (tp * cp) / bw
        c += 2 * lat
    return TimeCoeffs(a=_sig(a), b=_sig(b), c=_sig(c))


def analytic_memory(model: ModelSpec, tp: int, pp: int, cp: int, fw: FrameworkSpec = FRAMEWORK,
                    gpus_per_node: int = 8) -> SchemeMemory:
    """Appendix C.1 per-GPU memory of the worst stage, as named terms (their sources: `memory_notes`): bytes
    sharded over all N GPUs, bytes per rank, and bytes per packed token, so MaxLen stays linear in memory."""
    info = model_info(model)
    sharded = {"master_and_adam": fw.sharded_bytes_per_param * model.params, "owner_gradient": 4.0 * model.params}
    local = {"weights_and_gradients": fw.local_bytes_per_param * _stage_params(model, pp) / tp}
    local.update({t.name: t.bytes for t in lnk_terms(info, tp, pp, None, 2)})
    local["communicators"] = _communicator_bytes(tp, pp, cp, gpus_per_node, fw)
    kv = kv_bytes_per_token(model, tp, fw)
    token = {"activations": _sig(_activation_bytes_per_token(model, tp, pp, cp, fw))}
    if cp > 1:
        token["cp_kv"] = _sig(kv * (2 * cp + 1) / (2 * cp))
    return SchemeMemory(
        sharded_bytes=float(sum(sharded.values())),
        local_bytes=float(round(sum(local.values()))),
        act_bytes_per_token=_sig(sum(token.values())),
        kv_bytes_per_token=_sig(kv),
        sharded_terms={k: float(v) for k, v in sharded.items()},
        local_terms={k: float(round(v)) for k, v in local.items()},
        token_terms=token,
    )


def _stage_params(model: ModelSpec, pp: int) -> int:
    """Parameters of the worst stage: its decoder layers plus the embedding or the LM head and final norm."""
    h, vocab = model.hidden, model.vocab
    embeddings = 2 * vocab * h + h if pp == 1 else vocab * h + h
    return (model.layers // pp) * model.layer_params + embeddings


def _activation_bytes_per_token(model: ModelSpec, tp: int, pp: int, cp: int, fw: FrameworkSpec) -> float:
    """Saved activations per packed token of the worst stage.

    1F1B keeps pp micro-batches in flight on the first stage: layers/pp * pp = all layers of activations;
    the last stage holds one micro-batch of its layers plus the logits. Both terms are taken at their
    worst stage (a safe upper bound that keeps MaxLen linear in memory).
    """
    h, vocab = model.hidden, model.vocab
    layers = model.layers // pp
    act_layer = fw.act_h_replicated * h / cp + (fw.act_h * h + fw.act_f * model.ffn) / (tp * cp)
    logits = 10 * vocab / (tp * cp)  # bf16 logits + fp32 copy and gradient for the cross-entropy
    first = (model.layers + 1) * act_layer + (logits if pp == 1 else 0.0)
    last = (layers + 1) * act_layer + logits
    return max(first, last) * fw.fragmentation


def kv_bytes_per_token(model: ModelSpec, tp: int, fw: FrameworkSpec = FRAMEWORK) -> float:
    """K and V (bf16, one per head of the TP shard) of one packed token over the layers the first stage holds in
    flight under 1F1B (all of them): what a CP rank's gathered key windows and a Seq1F1B split's window copy
    keep on top of the activations."""
    return model.layers * 2 * 2 * model.hidden / tp * fw.fragmentation


def _communicator_bytes(tp: int, pp: int, cp: int, gpus_per_node: int, fw: FrameworkSpec) -> float:
    """NCCL's buffers of the communicators a rank joins: the world group and the TP group (ring/tree collectives),
    the LNK pull and push groups (all_to_all: one p2p connection per peer inside the node; across nodes NCCL
    shares its network buffers), the CP group's all_to_all and the two pipeline neighbours' p2p."""
    collectives = 1 + (tp > 1)
    p2p_peers = 2 * (gpus_per_node - 1) + (min(cp, gpus_per_node) - 1 if cp > 1 else 0) + (2 if pp > 1 else 0)
    return (collectives * fw.nccl_collective_mib + p2p_peers * fw.nccl_p2p_peer_mib) * 2**20


def model_info(model: ModelSpec) -> ModelInfo:
    return ModelInfo(name=model.key, layers=model.layers, hidden=model.hidden, ffn=model.ffn, heads=model.heads,
                     vocab=model.vocab, params=model.params)


def capacity_bytes(gpu: GPUSpec, fw: FrameworkSpec = FRAMEWORK) -> float:
    """Usable bytes per GPU: HBM minus the safety margin and the framework's fixed reservations."""
    gib = 2.0**30
    return float(round(gpu.memory_gib * gib * (1 - fw.margin_fraction) - fw.reserved_gib * gib))


def _sig(x: float, digits: int = 6) -> float:
    """Round to significant digits so the generated files are short and byte-for-byte reproducible."""
    return float(f"{x:.{digits}g}")


def scheme_space(model: ModelSpec) -> list[tuple[int, int, int]]:
    """<TP,PP,CP> candidates: TP dividing the heads, PP dividing the layers, at most 64 GPUs."""
    return [(tp, pp, cp)
            for tp in TP_DEGREES if model.heads % tp == 0
            for pp in range(1, MAX_PP + 1) if model.layers % pp == 0
            for cp in CP_DEGREES if tp * pp * cp <= MAX_SCHEME_GPUS]


def analytic_profile(gpu: GPUSpec, model: ModelSpec, fw: FrameworkSpec = FRAMEWORK) -> Profile:
    """The bundled profile of one GPU and model: every scheme that holds MIN_MAX_LEN at REFERENCE_GPUS."""
    capacity = capacity_bytes(gpu, fw)
    schemes = []
    for tp, pp, cp in scheme_space(model):
        memory = analytic_memory(model, tp, pp, cp, fw, gpu.gpus_per_node)
        max_len = max_len_from_memory(capacity, memory, REFERENCE_GPUS)
        if max_len < MIN_MAX_LEN:
            continue
        time = analytic_time(gpu, model, tp, pp, cp, fw)
        schemes.append(Scheme(tp=tp, pp=pp, cp=cp, max_len=max_len, util_len=util_len(time, max_len),
                              time=time, memory=memory))
    return Profile(
        name=f"{gpu.key}-{model.key}",
        gpu=GPUInfo(name=gpu.name, memory_gib=gpu.memory_gib, gpus_per_node=gpu.gpus_per_node,
                    peak_tflops=gpu.peak_tflops),
        model=model_info(model),
        schemes=schemes,
        reference_gpus=REFERENCE_GPUS,
        memory=ProfileMemory(capacity_bytes=capacity),
        network=Network(intra_node_GBps=_sig(gpu.nvlink_bytes_s * fw.link_efficiency / 1e9),
                        inter_node_GBps=_sig(gpu.ib_bytes_s * fw.link_efficiency / 1e9)),
        source="analytic",
        notes=_notes(gpu, model, fw),
    )


def _notes(gpu: GPUSpec, model: ModelSpec, fw: FrameworkSpec) -> dict[str, str]:
    notes = {
        "generator": "hydraplan profiles generate (hydraplan.core.analytic.analytic_profile); do not edit by hand",
        "time": "T(l) = a*l^2 + b*l + c seconds: fwd+bwd of one micro-batch of l packed tokens on the last "
                "stage (layers/pp decoder layers + LM head + loss). a: causal FlashAttention; b: GEMMs, "
                "elementwise kernels, TP all-gather/reduce-scatter, CP K/V ring, PP p2p (NVLink inside a node, "
                "IB when the group spans nodes); c: short-GEMM under-utilization, launches, latencies",
        "max_len": f"appendix C.1: (capacity - sharded/N - local) / act_bytes_per_token, stored for N = "
                   f"{REFERENCE_GPUS}; schemes with MaxLen < {MIN_MAX_LEN} at that N are omitted; each term of "
                   "sharded_bytes, local_bytes and act_bytes_per_token is in memory.*_terms, its source in memory.NAME",
        "util_len": f"appendix D with threshold {UTIL_THRESHOLD}: shortest l with l/(b*l+c) >= "
                    f"{UTIL_THRESHOLD}/b (attention-free tokens/s at {UTIL_THRESHOLD:.0%} of its asymptote), "
                    "capped at max_len",
        "schemes": "TP in {1,2,4,8,16} dividing the heads, PP dividing the layers up to 8, CP in {1,2,4,8}, "
                   f"tp*pp*cp <= {MAX_SCHEME_GPUS}",
        "model": model.source,
        "stages": "the embedding lookup (first stage) does no GEMM work; the LM head and loss run on the last "
                  "stage, whose T is stored for every stage because the slowest stage sets the 1F1B rate",
        "links": f"NVLink {gpu.nvlink_gb_s:g} GB/s bidirectional = {gpu.nvlink_bytes_s / 1e9:g} GB/s per GPU per "
                 f"direction; IB {gpu.ib_gb_s_per_node:g} GB/s per node = {gpu.ib_bytes_s / 1e9:g} GB/s per GPU per "
                 f"direction; both at {fw.link_efficiency:g} efficiency; {gpu.gpus_per_node} GPUs per node",
        "network": f"LNK pull/push per GPU per direction at {fw.link_efficiency:g} of nominal: NVLink "
                   f"{gpu.nvlink_bytes_s / 1e9:g} GB/s inside a node, {gpu.ib_bytes_s / 1e9:g} GB/s across nodes (one NIC "
                   "per GPU); see gpu.ib",
        "params": f"model.params = {model.params:,}: layers x (4h^2 + 3hf + 2h) + untied embedding and LM head + final norm",
        "capacity": f"{gpu.memory_gib:g} GiB x {1 - fw.margin_fraction:g} - {fw.reserved_gib:g} GiB = "
                    f"{capacity_bytes(gpu, fw) / 2**30:.1f} GiB usable per GPU (memory.capacity_bytes)",
    }
    notes.update({f"gpu.{k}": v for k, v in gpu.sources})
    notes.update({f"framework.{k}": v for k, v in fw.sources})
    notes.update(memory_notes(fw))
    return notes


def memory_notes(fw: FrameworkSpec = FRAMEWORK) -> dict[str, str]:
    """The source of every memory term (notes memory.NAME), what `hydraplan profiles memory` prints beside it."""
    return {
        "memory.master_and_adam": f"{fw.sharded_bytes_per_param} B/param: fp32 master weight + AdamW m and v of the "
                                  "owner's fixed shard (runtime/optim.py), sharded over all N GPUs (framework.states)",
        "memory.owner_gradient": LNK_SOURCE["owner_gradient"],
        "memory.weights_and_gradients": f"{fw.local_bytes_per_param} B/param of the worst stage, split by TP: the pulled "
                                        "bf16 weights and the fp32 gradient accumulators (runtime/grads.py)",
        "memory.lnk_pull": LNK_SOURCE["lnk_pull"] + " (bf16)",
        "memory.lnk_push": LNK_SOURCE["lnk_push"] + " (bf16: gradients travel in the compute dtype)",
        "memory.communicators": f"NCCL buffers, estimate: {fw.nccl_collective_mib:g} MiB per collective communicator "
                                "(world, TP: ring/tree channels x NCCL_BUFFSIZE, 4 MiB by default) and "
                                f"{fw.nccl_p2p_peer_mib:g} MiB per p2p peer inside the node (LNK pull and push "
                                "all_to_all, CP all_to_all, pipeline neighbours; across nodes NCCL shares network "
                                "buffers), NCCL environment-variable documentation",
        "memory.activations": "framework.activations x framework.fragmentation, worst stage under 1F1B",
        "memory.cp_kv": "a CP rank's gathered K/V windows saved by attention (runtime/context_parallel.py): with "
                        "2*cp symmetric chunks per sequence its two chunks' windows cover (2cp+1)/(2cp) of the sequence, "
                        "K and V bf16, all layers in flight on the first stage (kv_bytes_per_token x (2cp+1)/(2cp))",
        "memory.kv": "kv_bytes_per_token: K and V in bf16 (4*hidden/tp bytes per token and layer) over every layer "
                     "in flight on the first stage, x framework.fragmentation; Seq1F1B's window copies "
                     "(hydraplan.solve.seqsplit) and CP's gathered keys are counted with it",
    }


def analytic_profiles() -> list[Profile]:
    return [analytic_profile(g, m) for g in GPUS.values() for m in MODELS.values()]
