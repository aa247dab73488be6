"""Analytic profiles from GPU and model specs (core/hardware.py): T(l) per scheme and recomputation mode from
FLOPs, bandwidths and latencies, the appendix C.1 memory model with sequence parallelism, and the notes that
cite every constant."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hydraplan.core import collectives as nccl
from hydraplan.core.cluster import max_len_from_memory
from hydraplan.core.cost import UTIL_THRESHOLD, util_len
from hydraplan.core.errors import UserError
from hydraplan.core.frameworks import FRAMEWORK, FrameworkSpec
from hydraplan.core.hardware import FP8_GPUS, GPUS, HYDRAULIS_MAX_LEN, LLAMA2_GPUS, MODELS, GPUSpec, ModelSpec
from hydraplan.core.kernelrates import attention_rate
from hydraplan.core.memory import LNK_SOURCE, lnk_terms
from hydraplan.core.schema import (
    RECOMPUTE_MODES,
    GPUInfo,
    ModelInfo,
    Network,
    Profile,
    ProfileMemory,
    Scheme,
    SchemeMemory,
)
from hydraplan.core.stagetime import DTYPES, FIT_MIN_LEN, TERM_NOTES, StageSpec, StageTime, gqa_bytes, sig, stage_time

# --------------------------------------------------------------------------------- analytic profiles
TP_DEGREES = (1, 2, 4, 8, 16)
CP_DEGREES = (1, 2, 4, 8, 16, 32, 64)
MAX_PP = 8
MAX_SCHEME_GPUS = 64  # tp*pp*cp of a scheme with cp <= WIDE_CP
WIDE_CP = 8  # CP beyond this (across nodes, for the longest contexts) only with pp = 1 and tp*cp <= MAX_WIDE_GPUS
MAX_WIDE_GPUS = 512
REFERENCE_GPUS = 64
MIN_MAX_LEN = 1024  # a scheme that cannot hold a 1K-token micro-batch at the reference size is omitted


def analytic_time(gpu: GPUSpec, model: ModelSpec, tp: int, pp: int, cp: int, recompute: str = "none",
                  fw: FrameworkSpec = FRAMEWORK, fit_range: tuple[int, int] = (FIT_MIN_LEN, 4 * FIT_MIN_LEN),
                  dtype: str = "bf16") -> StageTime:
    """T(l) of the last pipeline stage (hydraplan.core.stagetime: its named terms; with CP > 1 the exposed ring
    fitted over `fit_range`, the lengths the scheme serves, and the fit's worst relative error).
    A group larger than a node crosses InfiniBand: TP if tp > gpus_per_node, CP if tp*cp > gpus_per_node,
    PP if the whole pipeline does not fit in one node."""
    return stage_time(StageSpec(gpu, model, fw, tp, pp, cp, recompute, dtype), fit_range)


def analytic_memory(model: ModelSpec, tp: int, pp: int, cp: int, recompute: str = "none",
                    fw: FrameworkSpec = FRAMEWORK, gpus_per_node: int = 8, dtype: str = "bf16") -> SchemeMemory:
    """Appendix C.1 per-GPU memory of the worst stage, as named terms (their sources: `memory_notes`): bytes
    sharded over all N GPUs, bytes per rank, and bytes per packed token, so MaxLen stays linear in memory. FP8 GEMMs
    keep the fp8 weights and their transposes (`fp8_weights`) and their inputs in fp8 for the backward."""
    info = model_info(model)
    sharded = {"master_and_adam": fw.sharded_bytes_per_param * model.params, "owner_gradient": 4.0 * model.params}
    local = {"weights_and_gradients": fw.local_bytes_per_param * _stage_params(model, pp) / tp}
    local.update({t.name: t.bytes for t in lnk_terms(info, tp, pp, None, 2)})
    local["communicators"] = _communicator_bytes(tp, pp, cp, gpus_per_node, fw)
    if dtype == "fp8":
        local["fp8_weights"] = fw.fp8_weight_bytes * (model.layers // pp) * model.layer_matmul_params / tp
    kv = kv_bytes_per_token(model, tp, fw)
    token = {k: sig(v) for k, v in _activation_terms(model, tp, pp, cp, recompute, fw, dtype).items()}
    if cp > 1:  # the gathered K/V windows: every layer's kept for its backward, or under full recomputation one layer's
        token["cp_kv"] = sig(kv * (2 * cp + 1) / (2 * cp) / (model.layers if recompute == "full" else 1))
    return SchemeMemory(
        sharded_bytes=float(sum(sharded.values())),
        local_bytes=float(round(sum(local.values()))),
        act_bytes_per_token=sig(sum(token.values())),
        kv_bytes_per_token=sig(kv),
        sharded_terms={k: float(v) for k, v in sharded.items()},
        local_terms={k: float(round(v)) for k, v in local.items()},
        token_terms=token,
    )


def _stage_params(model: ModelSpec, pp: int) -> int:
    """Parameters of the worst stage: its decoder layers plus the embedding or the LM head and final norm."""
    h, vocab = model.hidden, model.vocab
    embeddings = model.embedding_params + h if pp == 1 else vocab * h + h  # tied: a copy on each end stage
    return (model.layers // pp) * model.layer_params + embeddings


def layer_kept_bytes(model: ModelSpec, tp: int, cp: int, recompute: str, fw: FrameworkSpec = FRAMEWORK,
                     dtype: str = "bf16") -> float:
    """Bytes per packed token one decoder layer keeps for its backward on one rank (framework.activations; what
    runtime/saved.py measures); under FP8 GEMMs their inputs in fp8 (framework.fp8)."""
    h, f = model.hidden, model.ffn
    fp8 = dtype == "fp8"
    act_h = gqa_bytes(model, fw.act_h_fp8 if fp8 else fw.act_h, 4)  # K and V: 2 bytes x kv_dim each (bf16 attention)
    act_f = fw.act_f_fp8 if fp8 else fw.act_f
    product = 1 if fp8 else 2  # the SwiGLU product (the FC2 input), recomputed under selective recomputation
    return {"none": act_h + act_f * f, "selective": act_h + (act_f - product) * f,
            "full": fw.act_h_full * h}[recompute] / (tp * cp)


def _activation_terms(model: ModelSpec, tp: int, pp: int, cp: int, recompute: str, fw: FrameworkSpec,
                      dtype: str) -> dict[str, float]:
    """Activation bytes per packed token of the worst stage, x fragmentation: `activations`, what the micro-batches
    in flight keep for their backward (1F1B keeps pp micro-batches on the first stage: layers/pp * pp = all layers;
    the last stage one micro-batch of its layers plus the logits; the worst of the two), `backward_layer`, one
    layer's whole activations live during its backward (the layer being recomputed, under full recomputation), and
    `sp_unsplit`, the working set that sequence parallelism does not split (CP splits it). Taken at the worst
    stage (a safe upper bound that keeps MaxLen linear in memory)."""
    h, vocab = model.hidden, model.vocab
    layers = model.layers // pp
    kept = layer_kept_bytes(model, tp, cp, recompute, fw, dtype)
    logits = 10 * vocab / (tp * cp)  # bf16 logits + fp32 copy and gradient for the cross-entropy
    first = model.layers * kept + (logits if pp == 1 else 0.0)
    last = layers * kept + logits
    return {"activations": max(first, last) * fw.fragmentation,
            "backward_layer": layer_kept_bytes(model, tp, cp, "none", fw, dtype) * fw.fragmentation,
            "sp_unsplit": fw.act_h_unsplit * h / cp * fw.fragmentation}


def kv_bytes_per_token(model: ModelSpec, tp: int, fw: FrameworkSpec = FRAMEWORK) -> float:
    """K and V (bf16, kv_dim wide: the TP shard's K/V heads) of one packed token over the layers the first stage
    holds in flight under 1F1B (all of them): what a CP rank's gathered key windows and a Seq1F1B split's window
    copy keep on top of the activations. Grouped-query attention shrinks it by heads/kv_heads."""
    return model.layers * 2 * 2 * model.kv_dim / tp * fw.fragmentation


def _communicator_bytes(tp: int, pp: int, cp: int, gpus_per_node: int, fw: FrameworkSpec) -> float:
    """NCCL's buffers of the communicators a rank joins: the world group and the TP group (ring/tree collectives),
    the LNK pull and push groups (all_to_all: one p2p connection per peer inside the node; across nodes NCCL
    shares its network buffers), the CP group's all_to_all and the two pipeline neighbours' p2p."""
    collectives = 1 + (tp > 1)
    p2p_peers = 2 * (gpus_per_node - 1) + (min(cp, gpus_per_node) - 1 if cp > 1 else 0) + (2 if pp > 1 else 0)
    return (collectives * fw.nccl_collective_mib + p2p_peers * fw.nccl_p2p_peer_mib) * 2**20


def model_info(model: ModelSpec) -> ModelInfo:
    """The profile's model block; the GQA, tying, bias and RoPE fields only where they differ from LLaMA-2's
    (absent means multi-head, untied, no bias, base 10000), so LLaMA-2 profiles keep their bytes."""
    extra = {"kv_heads": model.kv_heads if model.kv_heads not in (None, model.heads) else None,
             "tied_embeddings": model.tied or None, "qkv_bias": model.qkv_bias or None,
             "rope_theta": model.rope_theta if model.rope_theta != 10000.0 else None}
    return ModelInfo(name=model.key, layers=model.layers, hidden=model.hidden, ffn=model.ffn, heads=model.heads,
                     vocab=model.vocab, params=model.params, **{k: v for k, v in extra.items() if v is not None})


def capacity_bytes(gpu: GPUSpec, fw: FrameworkSpec = FRAMEWORK) -> float:
    """Usable bytes per GPU: HBM minus the safety margin and the framework's fixed reservations."""
    gib = 2.0**30
    return float(round(gpu.memory_gib * gib * (1 - fw.margin_fraction) - fw.reserved_gib * gib))


def scheme_space(model: ModelSpec) -> list[tuple[int, int, int, str]]:
    """<TP,PP,CP,recompute> candidates: TP dividing the heads and the K/V heads (the runtime splits both over TP
    ranks and does not replicate K/V heads), PP dividing the layers; at most 64 GPUs up to CP 8,
    and CP 16-64 (context parallelism across nodes) with pp = 1 on up to 512 GPUs; each recomputation mode."""
    return [(tp, pp, cp, mode)
            for tp in TP_DEGREES if model.heads % tp == 0 and (model.kv_heads or model.heads) % tp == 0
            for pp in range(1, MAX_PP + 1) if model.layers % pp == 0
            for cp in CP_DEGREES
            if (tp * pp * cp <= MAX_SCHEME_GPUS if cp <= WIDE_CP else pp == 1 and tp * cp <= MAX_WIDE_GPUS)
            for mode in RECOMPUTE_MODES]


def fit_range(gpu: GPUSpec, model: ModelSpec, tp: int, pp: int, cp: int, fw: FrameworkSpec = FRAMEWORK,
              dtype: str = "bf16") -> tuple[int, int]:
    """The lengths a layout serves, where its no-polynomial terms are fitted: from 1/16 of its MaxLen without
    recomputation to its MaxLen with full recomputation at REFERENCE_GPUS, the same lengths for every mode (fitted
    apart over each mode's own lengths, a mode that recomputes could come out cheaper than one that does not)."""
    capacity = capacity_bytes(gpu, fw)
    lo, hi = (max_len_from_memory(capacity, analytic_memory(model, tp, pp, cp, m, fw, gpu.gpus_per_node, dtype),
                                  REFERENCE_GPUS) for m in ("none", "full"))
    return lo // 16, hi


def analytic_scheme(gpu: GPUSpec, model: ModelSpec, tp: int, pp: int, cp: int, recompute: str = "none",
                    fw: FrameworkSpec = FRAMEWORK, dtype: str = "bf16") -> tuple[Scheme, float]:
    """One scheme of the analytic profile (MaxLen at REFERENCE_GPUS, possibly below MIN_MAX_LEN) and its fit's worst
    relative error."""
    memory = analytic_memory(model, tp, pp, cp, recompute, fw, gpu.gpus_per_node, dtype)
    max_len = max(1, max_len_from_memory(capacity_bytes(gpu, fw), memory, REFERENCE_GPUS))
    t = analytic_time(gpu, model, tp, pp, cp, recompute, fw, fit_range(gpu, model, tp, pp, cp, fw, dtype), dtype)
    return Scheme(tp=tp, pp=pp, cp=cp, recompute=recompute, max_len=max_len, util_len=util_len(t.time, max_len),
                  time=t.time, memory=memory), t.fit_rel_err


def network_of(gpu: GPUSpec) -> Network:
    """LNK's bandwidths: a send to a peer over NVLink inside a node, over the GPU's NIC across nodes."""
    return Network(intra_node_GBps=sig(nccl.nvlink_bytes_s(gpu) / 1e9), inter_node_GBps=sig(nccl.nic_bytes_s(gpu) / 1e9))


def profile_name(gpu: GPUSpec, model: ModelSpec, dtype: str = "bf16") -> str:
    """GPU-MODEL, with -fp8 for FP8 GEMMs."""
    return f"{gpu.key}-{model.key}" + ("-fp8" if dtype == "fp8" else "")


def analytic_profile(gpu: GPUSpec, model: ModelSpec, fw: FrameworkSpec = FRAMEWORK, name: str | None = None,
                     dtype: str = "bf16") -> Profile:
    """The analytic profile of one GPU and model (named `profile_name` unless `name`): every scheme that holds
    MIN_MAX_LEN at REFERENCE_GPUS; `dtype` fp8: Transformer Engine's FP8 GEMMs (a GPU with FP8 tensor cores)."""
    if dtype not in DTYPES:
        raise UserError(f"dtype must be one of {', '.join(DTYPES)} (got {dtype!r})", "dtype")
    if dtype == "fp8" and gpu.fp8_tflops is None:
        raise UserError(f"dtype fp8: {gpu.name} has no FP8 tensor cores (FP8 profiles: {', '.join(FP8_GPUS)})", "dtype")
    schemes, errors = [], []
    for tp, pp, cp, mode in scheme_space(model):
        scheme, err = analytic_scheme(gpu, model, tp, pp, cp, mode, fw, dtype)
        if scheme.max_len < MIN_MAX_LEN:
            continue
        schemes.append(scheme)
        errors.append(err)
    return Profile(
        name=name or profile_name(gpu, model, dtype),
        gpu=GPUInfo(name=gpu.name, memory_gib=gpu.memory_gib, gpus_per_node=gpu.gpus_per_node,
                    peak_tflops=gpu.peak_tflops),
        model=model_info(model),
        schemes=schemes,
        reference_gpus=REFERENCE_GPUS,
        memory=ProfileMemory(capacity_bytes=capacity_bytes(gpu, fw)),
        network=network_of(gpu),
        source="analytic",
        dtype=dtype,
        notes=_notes(gpu, model, fw, errors, dtype),
    )


def _notes(gpu: GPUSpec, model: ModelSpec, fw: FrameworkSpec, fit_errors: list[float], dtype: str) -> dict[str, str]:
    errs = np.asarray(fit_errors or [0.0])
    rate = attention_rate(gpu.key, fw.attention_kernel)
    notes = {
        "generator": "hydraplan profiles generate (hydraplan.core.analytic.analytic_profile); do not edit by hand",
        "time": "T(l) = a*l^2 + b*l + c seconds: fwd+bwd of one micro-batch of l packed tokens on the last stage "
                "(layers/pp decoder layers + LM head + loss), the sum of named physical terms (hydraplan.core.stagetime): "
                "scheme.time.a_terms, b_terms and c_terms hold each term's share, its meaning and source is time.NAME; "
                "c, the per-micro-batch constant, is the short GEMMs' under-utilization, the launch floor, the TP and PP "
                "latencies and CP's ring-step launches (`hydraplan profiles time NAME SCHEME` lists them)",
        "fit_worst_rel_err": f"{errs.max():.3f} (median {np.median(errs):.3f}): the worst relative error, over the "
                             "lengths the scheme serves (fit_range), of a*l^2 + b*l + c against the stage model, whose "
                             "only term that is no polynomial is the CP ring's exposed part (0 without CP); the closed-"
                             "form terms are floors the fit does not move",
        "dtype": (f"{dtype}: " + ("Transformer Engine FP8 GEMMs in the decoder layers at the FP8 peak "
                                  f"({gpu.fp8_tflops:g} TFLOP/s x fp8_gemm_efficiency), their casts (time.fp8_cast) and "
                                  "fp8 weight copies (memory.fp8_weights); attention, the LM head and communication "
                                  "stay bf16 (TP's input gathers in fp8)" if dtype == "fp8" else
                                  "bf16 GEMMs and attention, fp32 gradient accumulation")),
        "attention": f"{rate.kernel} on {gpu.key}: {rate.source}",
        "max_len": f"appendix C.1: (capacity - sharded/N - local) / act_bytes_per_token, stored for N = "
                   f"{REFERENCE_GPUS}; schemes with MaxLen < {MIN_MAX_LEN} at that N are omitted; each term of "
                   "sharded_bytes, local_bytes and act_bytes_per_token is in memory.*_terms, its source in memory.NAME",
        "util_len": f"appendix D with threshold {UTIL_THRESHOLD}: shortest l with l/(b*l+c) >= "
                    f"{UTIL_THRESHOLD}/b (attention-free tokens/s at {UTIL_THRESHOLD:.0%} of its asymptote), "
                    "capped at max_len",
        "schemes": f"TP in {{1,2,4,8,16}} dividing the heads, PP dividing the layers up to {MAX_PP}, CP in {{1,2,4,8}} "
                   f"with tp*pp*cp <= {MAX_SCHEME_GPUS}, and CP in {{16,32,64}} (across nodes) with pp = 1 and "
                   f"tp*cp <= {MAX_WIDE_GPUS}; each with recompute none, selective and full (sequence parallelism "
                   "always on for tp > 1)",
        "model": model.source,
        "stages": "the embedding lookup (first stage) does no GEMM work; the LM head and loss run on the last "
                  "stage, whose T is stored for every stage because the slowest stage sets the 1F1B rate",
        "links": f"NVLink {gpu.nvlink_gb_s:g} GB/s bidirectional = {gpu.nvlink_bytes_s / 1e9:g} GB/s per GPU per "
                 f"direction, {gpu.node_fabric.nic_GBps:g} GB/s usable; IB {gpu.ib_gb_s_per_node:g} GB/s per node = "
                 f"{gpu.ib_bytes_s / 1e9:g} GB/s per GPU per direction, {gpu.net_fabric.nic_GBps:g} usable; "
                 f"{gpu.gpus_per_node} GPUs per node; NCCL's collectives: {gpu.node_fabric.name} inside a node, "
                 f"{gpu.net_fabric.name} across (hydraplan.core.collectives, gpu.nccl)",
        "network": f"LNK pull/push per GPU per direction: NCCL's NVLink {nccl.nvlink_bytes_s(gpu) / 1e9:g} GB/s inside a "
                   f"node and one NIC's {nccl.nic_bytes_s(gpu) / 1e9:g} GB/s across nodes (links)",
        "params": _params_note(model),
        "capacity": f"{gpu.memory_gib:g} GiB x {1 - fw.margin_fraction:g} - {fw.reserved_gib:g} GiB = "
                    f"{capacity_bytes(gpu, fw) / 2**30:.1f} GiB usable per GPU (memory.capacity_bytes)",
    }
    notes.update({f"gpu.{k}": v for k, v in gpu.sources})
    notes.update({f"framework.{k}": v for k, v in fw.sources})
    notes.update({f"time.{k}": v for k, v in TERM_NOTES.items()})
    if model.kv_dim != model.hidden:
        notes["gqa"] = (f"grouped-query attention: {model.kv_heads} K/V heads for {model.heads} query heads, K and V "
                        f"{model.kv_dim} wide (kv_dim) instead of {model.hidden}: the K/V weights, the K and V kept "
                        "for the backward (2 bytes x kv_dim each in framework.activations' 6h of Q/K/V), rotary on K, "
                        "memory.kv and memory.cp_kv and the CP ring's transfers use kv_dim; attention FLOPs (a) follow "
                        "the query heads and are unchanged; TP must divide the K/V heads")
    if (gpu.key, model.key) in HYDRAULIS_MAX_LEN:
        notes["max_len_vs_hydraulis"] = _hydraulis_note(gpu, model, fw)
    notes.update(memory_notes(fw))
    if model.kv_dim != model.hidden:
        notes["memory.kv"] = notes["memory.kv"].replace("4*hidden/tp", f"4*kv_dim/tp, kv_dim = {model.kv_dim},")
    return notes


def _params_note(model: ModelSpec) -> str:
    if model.kv_dim == model.hidden and not model.tied and not model.qkv_bias:
        return f"model.params = {model.params:,}: layers x (4h^2 + 3hf + 2h) + untied embedding and LM head + final norm"
    bias = " + QKV biases (h + 2 kv_dim)" if model.qkv_bias else ""
    embedding = "tied embedding and LM head (one vocab x h matrix)" if model.tied else "untied embedding and LM head"
    return (f"model.params = {model.params:,}: layers x (2h^2 + 2h kv_dim + 3hf + 2h{bias}) + {embedding} + final norm "
            f"(kv_dim = {model.kv_dim})")


def _hydraulis_note(gpu: GPUSpec, model: ModelSpec, fw: FrameworkSpec) -> str:
    """MaxLen of <TP,1,1> against Hydraulis', each deviation with what explains it: MaxLen again with Hydraulis'
    bf16 gradients (alpha = 3/4: 4 bytes per stage parameter, not the fp32 accumulators' 6) and with nothing
    left unsplit by TP (act_h_unsplit = 0)."""
    def max_len(tp: int, spec: FrameworkSpec) -> int:
        return max_len_from_memory(capacity_bytes(gpu, spec), analytic_memory(model, tp, 1, 1, "none", spec), REFERENCE_GPUS)

    bf16_grads = replace(fw, local_bytes_per_param=4)
    all_split = replace(fw, act_h_unsplit=0)
    refs = HYDRAULIS_MAX_LEN[(gpu.key, model.key)]
    grads_gb = (fw.local_bytes_per_param - bf16_grads.local_bytes_per_param) * model.params / min(refs) / 1e9
    parts = []
    for tp, ref in refs.items():
        ours = max_len(tp, fw)
        parts.append(f"<{tp},1,1> {ours:,} vs {ref:,} ({ours / ref - 1:+.1%}; {max_len(tp, bf16_grads):,} with bf16 gradients, "
                     f"{max_len(tp, all_split):,} with nothing unsplit)")
    return (f"MaxLen at N = {REFERENCE_GPUS} against Hydraulis': " + "; ".join(parts) + ". Below at narrow TP: the "
            f"runtime keeps fp32 gradient accumulators ({fw.local_bytes_per_param} bytes per stage parameter against "
            f"Hydraulis' {bf16_grads.local_bytes_per_param}), which at TP {min(refs)} take {grads_gb:.1f} GB from the "
            "activations; above at TP 16: Hydraulis' MaxLen grows less with TP than the division of every activation by "
            "TP predicts, so its system keeps more per token that TP does not split than this model's estimate "
            "(framework.unsplit), and a TP 16 group spans two nodes")


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
        "memory.activations": "what the micro-batches in flight keep for their backward with sequence parallelism, "
                              "divided by TP x CP (framework.activations: 16h+6f, selective 16h+4f, full 2h per layer), "
                              "worst stage under 1F1B, plus the last stage's logits, x framework.fragmentation",
        "memory.backward_layer": "one layer's whole activations (16h+6f, divided by TP x CP) live during its backward, "
                                 "recomputed first under full recomputation (framework.activations), x fragmentation",
        "memory.sp_unsplit": "what sequence parallelism does not split, divided by CP only (framework.unsplit), "
                             "x framework.fragmentation",
        "memory.cp_kv": "a CP rank's gathered K/V windows saved by attention (runtime/context_parallel.py): with "
                        "2*cp symmetric chunks per sequence its two chunks' windows cover (2cp+1)/(2cp) of the sequence, "
                        "K and V bf16, all layers in flight on the first stage (kv_bytes_per_token x (2cp+1)/(2cp)); "
                        "under full recomputation only the layer in its backward keeps them (1/layers of that)",
        "memory.fp8_weights": f"FP8 GEMMs: {fw.fp8_weight_bytes} bytes per decoder-layer GEMM weight of the stage, split by "
                              "TP: Transformer Engine's fp8 copy of each weight and its transpose, cast on the first "
                              "micro-batch and kept through the iteration (framework.fp8)",
        "memory.kv": "kv_bytes_per_token: K and V in bf16 (4*hidden/tp bytes per token and layer) over every layer "
                     "in flight on the first stage, x framework.fragmentation; Seq1F1B's window copies "
                     "(hydraplan.solve.seqsplit) and CP's gathered keys are counted with it",
    }


def analytic_profiles() -> list[Profile]:
    """The bundled LLaMA-2 profiles, bf16 and (on GPUs with FP8 tensor cores) fp8 (the HF-config ones:
    hydraplan.store.profiles)."""
    return [analytic_profile(GPUS[g], m, dtype=d) for g in LLAMA2_GPUS for m in MODELS.values()
            for d in (("bf16", "fp8") if g in FP8_GPUS else ("bf16",))]
