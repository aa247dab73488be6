"""The cost model: T(l,P), MaxLen(P), UtilLen(P), the canonical plan estimate every tool agrees on,
the analytic profiles built from GPU and model specs (planner/hardware.py), and the timing fit.

Canonical estimate (docs/formats.md): a micro-batch of lengths l_i on scheme P costs sum(a*l_i^2 + b*l_i) + c;
a pipeline with micro-batches m_1..m_V costs sum_v t(m_v) + (pp-1) * max_v t(m_v); an iteration costs
the max over its pipelines.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from hydraplan.errors import UserError
from hydraplan.fileio import load_model, write_model
from hydraplan.hardware import FRAMEWORK, GPUS, MODELS, FrameworkSpec, GPUSpec, ModelSpec
from hydraplan.paths import PROFILES_DIR
from hydraplan.schema import GPUInfo, ModelInfo, Network, Profile, ProfileMemory, Scheme, SchemeMemory, TimeCoeffs


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


def pipeline_time(scheme: Scheme, micro_batches: Iterable[Iterable[int]]) -> float:
    """Canonical latency of one pipeline running the given micro-batches (lists of lengths)."""
    return pipeline_time_from_mb([micro_batch_time(scheme, mb) for mb in micro_batches], scheme.pp)


# --------------------------------------------------------------------------------- profiles / MaxLen
def max_len_for_gpus(profile: Profile, scheme: Scheme, gpus: int) -> int:
    """MaxLen of a scheme when the fp32 optimizer states are sharded over `gpus` GPUs.

    A scheme without memory constants (hand-written or measured) keeps its stated max_len for any N.
    """
    if scheme.memory is None or profile.memory is None:
        return scheme.max_len
    return max_len_from_memory(profile.memory.capacity_bytes, scheme.memory, gpus)


def max_len_from_memory(capacity_bytes: float, m: SchemeMemory, gpus: int) -> int:
    """Appendix C.1: the l at which sharded/N + local + per_token*l reaches the usable capacity."""
    free = capacity_bytes - m.sharded_bytes / gpus - m.local_bytes
    return max(0, int(free // m.act_bytes_per_token))


MAX_JOB_GPUS = 1 << 16  # how far for_gpus looks for the smallest job a profile's model fits in


def for_gpus(profile: Profile, gpus: int) -> Profile:
    """The profile as seen by a job of `gpus` GPUs: schemes that fit, MaxLen recomputed for N."""
    if gpus < 1:
        raise UserError(f"--gpus must be positive (got {gpus})")
    schemes = []
    for s in profile.schemes:
        if s.gpus > gpus:
            continue
        ml = max_len_for_gpus(profile, s, gpus)
        if ml > 0:
            schemes.append(s.model_copy(update={"max_len": ml, "util_len": min(s.util_len, ml)}))
    if not schemes:  # too few GPUs for any scheme, or for the sharded weights and optimizer states
        need = next((n for n in range(gpus + 1, MAX_JOB_GPUS + 1)
                     if any(s.gpus <= n and max_len_for_gpus(profile, s, n) > 0 for s in profile.schemes)), None)
        smallest = f" (the smallest job it fits has {need} GPUs)" if need else ""
        raise UserError(f"profile {profile.name}: no scheme fits in {gpus} GPUs{smallest}")
    return profile.model_copy(update={"schemes": schemes})


def bundled_profiles() -> list[Path]:
    return sorted(PROFILES_DIR.glob("*.json"))


def load_profile(name_or_path: str) -> Profile:
    """A bundled profile by name (e.g. h100-llama2-7b) or a path to a profile JSON."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        return load_model(Profile, path)
    bundled = PROFILES_DIR / f"{name_or_path}.json"
    if bundled.exists():
        return load_model(Profile, bundled)
    names = ", ".join(p.stem for p in bundled_profiles())
    raise UserError(f"unknown profile {name_or_path!r}: not a file, and not a bundled profile ({names})")


# ------------------------------------------------------------------------------- FLOPs and utilization
def model_flops(model: ModelInfo, lengths: np.ndarray | Sequence[int] | int) -> np.ndarray:
    """Training FLOPs (forward + backward = 3x forward) per sequence, vectorized.

    6 FLOPs per GEMM weight per token (decoder layers with SwiGLU, and the LM head; the embedding lookup
    and norms do no GEMM work) plus causal attention, 3 * 2*2*h*l^2/2 per layer. A model without `ffn`
    is taken as LLaMA-shaped (ffn = 8h/3, 12h^2 GEMM weights per layer); without `vocab`, 32000.
    """
    h = model.hidden
    ffn = model.ffn if model.ffn is not None else 8 * h / 3
    vocab = model.vocab if model.vocab is not None else 32000
    weights = model.layers * (4 * h * h + 3 * h * ffn) + vocab * h
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


# ------------------------------------------------------------------------------------------- fitting
class TimeFit(NamedTuple):
    a: float
    b: float
    c: float
    r2: float
    worst_rel_err: float


def fit_time_coeffs(lengths: np.ndarray | Sequence[float], seconds: np.ndarray | Sequence[float]) -> TimeFit:
    """Nonnegative least-squares fit of T(l) = a*l^2 + b*l + c to measured timings (appendix C.2).

    Minimizes the squared *relative* error, so short micro-batches (milliseconds) weigh as much as long
    ones (seconds). Exact NNLS: the optimum is the unconstrained fit on some subset of the three terms,
    so every subset is tried and the best nonnegative one kept (no scipy needed).
    """
    l = np.asarray(lengths, dtype=np.float64).ravel()
    return _fit_terms(l * l, l, seconds)


def fit_micro_batches(micro_batches: Sequence[Sequence[int]], seconds: np.ndarray | Sequence[float]) -> TimeFit:
    """`fit_time_coeffs` on timings of packed micro-batches: T(m) = a*sum(l_i^2) + b*sum(l_i) + c. Packings
    of equal total length pin the linear term, which single sequences alone leave to noise."""
    sq = np.array([float(np.sum(np.square(np.asarray(m, dtype=np.float64)))) for m in micro_batches])
    lin = np.array([float(np.sum(m)) for m in micro_batches], dtype=np.float64)
    return _fit_terms(sq, lin, seconds)


def _fit_terms(sq: np.ndarray, lin: np.ndarray, seconds: np.ndarray | Sequence[float]) -> TimeFit:
    l = lin
    y = np.asarray(seconds, dtype=np.float64).ravel()
    if l.size != y.size or l.size == 0:
        raise ValueError(f"fit_time_coeffs: need equally many lengths and timings (got {l.size} and {y.size})")
    if np.any(y <= 0) or np.any(l <= 0):
        raise ValueError("fit_time_coeffs: lengths and timings must be positive")
    X = np.column_stack([sq, l, np.ones_like(l)]) / y[:, None]
    scale = np.abs(X).max(axis=0)
    Xs = X / scale
    ones = np.ones_like(y)
    best_coef, best_sse = np.zeros(3), float(ones @ ones)
    for cols in ((0, 1, 2), (0, 1), (0, 2), (1, 2), (0,), (1,), (2,)):
        sub, *_ = np.linalg.lstsq(Xs[:, cols], ones, rcond=None)
        if np.any(sub < 0):
            continue
        resid = ones - Xs[:, cols] @ sub
        sse = float(resid @ resid)
        if sse < best_sse:
            best_sse = sse
            best_coef = np.zeros(3)
            best_coef[list(cols)] = sub
    a, b, c = (best_coef / scale).tolist()
    pred = a * sq + b * l + c
    sst = float(((y - y.mean()) ** 2).sum())
    sse_abs = float(((y - pred) ** 2).sum())
    r2 = 1.0 - sse_abs / sst if sst > 0 else float(sse_abs == 0.0)
    return TimeFit(a, b, c, r2, float(np.max(np.abs(pred - y) / y)))


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


def analytic_memory(model: ModelSpec, tp: int, pp: int, cp: int, fw: FrameworkSpec = FRAMEWORK) -> SchemeMemory:
    """Appendix C.1 per-GPU memory of the worst stage, as a linear function of the packed length.

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
    embeddings = 2 * vocab * h + h if pp == 1 else vocab * h + h
    stage_params = layers * model.layer_params + embeddings
    local = (fw.local_bytes_per_param * stage_params + 2 * model.layer_matmul_params) / tp
    return SchemeMemory(
        sharded_bytes=float(fw.sharded_bytes_per_param * model.params),
        local_bytes=float(round(local)),
        act_bytes_per_token=_sig(max(first, last) * fw.fragmentation),
    )


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
        memory = analytic_memory(model, tp, pp, cp, fw)
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
        model=ModelInfo(name=model.key, layers=model.layers, hidden=model.hidden, ffn=model.ffn,
                        heads=model.heads, vocab=model.vocab, params=model.params),
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
        "generator": "hydraplan profiles generate (hydraplan.costmodel.analytic_profile); do not edit by hand",
        "time": "T(l) = a*l^2 + b*l + c seconds: fwd+bwd of one micro-batch of l packed tokens on the last "
                "stage (layers/pp decoder layers + LM head + loss). a: causal FlashAttention; b: GEMMs, "
                "elementwise kernels, TP all-gather/reduce-scatter, CP K/V ring, PP p2p (NVLink inside a node, "
                "IB when the group spans nodes); c: short-GEMM under-utilization, launches, latencies",
        "max_len": f"appendix C.1: (capacity - sharded/N - local) / act_bytes_per_token, stored for N = "
                   f"{REFERENCE_GPUS}; schemes with MaxLen < {MIN_MAX_LEN} at that N are omitted",
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
    return notes


def analytic_profiles() -> list[Profile]:
    return [analytic_profile(g, m) for g in GPUS.values() for m in MODELS.values()]


def write_analytic_profiles(out_dir: Path = PROFILES_DIR) -> list[Path]:
    """Regenerate the bundled analytic profiles (deterministic: same bytes every run)."""
    paths = []
    for profile in analytic_profiles():
        path = Path(out_dir) / f"{profile.name}.json"
        write_model(path, profile)
        paths.append(path)
    return paths


# ------------------------------------------------------------------------------------- listing / show
@dataclass(frozen=True)
class ProfileEntry:
    name: str  # what --profile accepts
    gpu: str
    model: str
    schemes: int
    source: str
    path: str


def list_bundled() -> list[ProfileEntry]:
    entries = []
    for path in bundled_profiles():
        p = load_model(Profile, path)
        entries.append(ProfileEntry(path.stem, p.gpu.name, p.model.name, len(p.schemes), p.source, str(path)))
    return entries


def tokens_per_gpu_s(scheme: Scheme, length: int) -> float | None:
    """Steady-state tokens/s per GPU of micro-batches of `length` tokens; None if they do not fit."""
    if length > scheme.max_len:
        return None
    return length / (seq_time(scheme, length) * scheme.gpus)
