"""One pipeline stage's forward and backward as named physical terms, and their canonical form a*l^2 + b*l + c.

T(l) is the last stage's (layers/pp decoder layers, the LM head and the loss: the slowest stage sets the 1F1B rate)
forward and backward of one micro-batch holding one sequence of l tokens. Each term is what one physical cost adds
to a, b or c (`Term`); its meaning and source are in `TERM_NOTES`, which the profiles' notes carry as time.NAME:

a  attention          causal attention at the kernel's asymptotic rate (hydraplan.core.kernelrates), forward 2, backward 5
                      (2.5x), full recomputation's forward again, divided over TP x CP
b  attention_rows     per query row and attention call, the kernel's fixed cost and the causal diagonal tile; a CP rank
                      calls its kernel once per ring step, so its rows pay it cp times: short chunks attend slower
   gemm               the decoder layers' GEMMs, 6 FLOPs per weight per token at the dtype's peak and an efficiency that
                      falls with narrow TP shards; full recomputation's forward again
   gemm_head          the LM head's GEMM (bf16 also under FP8)
   elementwise        norms, residuals, rotary, SwiGLU and the cross-entropy at HBM bandwidth (their recomputation)
   fp8_cast           FP8: the casts and transposes of each GEMM input and output gradient
   tp_comm            TP's all-gathers and reduce-scatters (sequence parallel) at NVLink's bus bandwidth
   pp_p2p             PP: the activation sent on and its gradient received
   cp_merge           CP: each ring step's merge of the partial output (forward) and dQ, dK/dV (backward)
c  gemm_short         short GEMMs' under-utilization: efficiency m/(m+m_half) at m tokens is exactly m_half tokens' time
   kernel_gaps        every kernel's fixed cost on the GPU (the gap before it starts, its last partial wave)
   tp_latency         TP collectives' launch and ring hops
   pp_latency         PP's two sends' latency
+  cp_ring_exposed    CP: the K/V ring (K and V forward, K, V, dK, dV backward: one step per CP rank but the first)
                      where the step's attention does not hide it; a step's send (its latency and bytes) runs beside
                      the step before, so per layer and pass (cp-1) * max(0, send - attention/cp) is exposed
   launch_exposed     the launch floor: the host launches every kernel (the layers', FP8's, CP's ring steps', the
                      head's) at launch_s each and the GPU cannot run ahead of it, so max(0, floor - work) is exposed
The last two are no polynomial in l: they are fitted as nonnegative increments of a, b, c over the lengths the scheme
serves (`fit_increments`). The closed-form terms are exact, so a, b and c are at least their sum (floors no fit
moves), and no fit zeroes a physical term or moves it into another.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hydraplan.core import collectives as nccl
from hydraplan.core.fit import fit_increments
from hydraplan.core.frameworks import FrameworkSpec
from hydraplan.core.hardware import GPUSpec, ModelSpec
from hydraplan.core.kernelrates import BACKWARD_FLOPS, CAUSAL_TILE, attention_rate
from hydraplan.core.schema import TimeCoeffs

FORWARD_COLLECTIVES = 4  # per layer under SP: all-gather into and reduce-scatter out of attention and MLP
BACKWARD_COLLECTIVES = 6  # their reverse, plus the inputs gathered again for the weight gradients
FP8_GATHERS = (2, 2)  # of those, the gathers of GEMM inputs (forward, backward's re-gather): fp8 under FP8 GEMMs
HEAD_COLLECTIVES = 3  # the LM head's input all-gather, its re-gather and reduce-scatter in the backward
DTYPES = ("bf16", "fp8")


@dataclass(frozen=True)
class Term:
    """What one physical cost adds to T(l) = a*l^2 + b*l + c of a scheme, in seconds."""

    name: str
    a: float = 0.0
    b: float = 0.0
    c: float = 0.0


@dataclass(frozen=True)
class StageSpec:
    """Everything T(l) of one scheme depends on."""

    gpu: GPUSpec
    model: ModelSpec
    fw: FrameworkSpec
    tp: int
    pp: int
    cp: int
    recompute: str = "none"
    dtype: str = "bf16"

    @property
    def layers(self) -> int:
        """Decoder layers of the slowest stage (pp dividing the layers unevenly leaves some stages one more)."""
        return -(-self.model.layers // self.pp)

    @property
    def full(self) -> bool:
        return self.recompute == "full"

    @property
    def fp8(self) -> bool:
        return self.dtype == "fp8"


def fp8_speedup(gpu: GPUSpec) -> float:
    """How much faster a long, wide GEMM runs in fp8 than in bf16 (the asymptotic rates' ratio)."""
    assert gpu.fp8_tflops is not None and gpu.fp8_gemm_efficiency is not None
    return gpu.fp8_tflops * gpu.fp8_gemm_efficiency / (gpu.peak_tflops * gpu.gemm_efficiency)


def gemm_efficiency(gpu: GPUSpec, fw: FrameworkSpec, weights_per_gpu: float, fp8: bool) -> float:
    """Asymptotic (long-M) GEMM efficiency of the dtype's peak; narrow TP shards leave SMs idle: efficiency halves at
    weight_half weights per GPU, whose fixed time an fp8 GEMM pays as a bf16 one does (so at fp8_speedup times the
    weights)."""
    eff = gpu.fp8_gemm_efficiency if fp8 else gpu.gemm_efficiency
    assert eff is not None
    half = fw.weight_half * (fp8_speedup(gpu) if fp8 else 1.0)
    return eff * weights_per_gpu / (weights_per_gpu + half)


def _gemm_per_token(s: StageSpec) -> tuple[float, float]:
    """Seconds per token (one GPU, no CP split) of the stage's decoder-layer GEMMs and of the LM head, fwd+bwd."""
    gpu, model, fw = s.gpu, s.model, s.fw
    rated = gpu.fp8_tflops if s.fp8 else gpu.peak_tflops
    assert rated is not None  # fp8 only on GPUs with FP8 tensor cores (analytic_profile refuses the others)
    peak = rated * 1e12 * gpu.power_factor
    w_layer = model.layer_matmul_params / s.tp
    w_head = model.vocab * model.hidden / s.tp
    layers = 6 * s.layers * w_layer / gemm_efficiency(gpu, fw, w_layer, s.fp8) / peak
    head = 6 * w_head / gemm_efficiency(gpu, fw, w_head, False) / (gpu.peak_tflops * 1e12 * gpu.power_factor)
    again = s.full / 3 + (s.recompute == "selective") * fw.selective_gemm_share / 3  # forward GEMMs re-run
    return layers * (1 + again), head


def gqa_bytes(model: ModelSpec, per_h: float, kv_share: float) -> float:
    """Bytes per token per layer per_h*h of which kv_share*h are K (and V) tensors, with those kv_dim wide under
    grouped-query attention: per_h*h - kv_share*(h - kv_dim) (= per_h*h without GQA)."""
    return per_h * model.hidden - kv_share * (model.hidden - model.kv_dim)


def attention_seconds(s: StageSpec) -> tuple[tuple[float, float], tuple[float, float]]:
    """((a, b) forward, (a, b) backward) of one layer's attention on one rank: a per l^2, b per l (the row costs).
    Forward 2*h*l^2 causal FLOPs, split over TP heads and CP's load-balanced chunks; a CP rank runs cp calls of l/cp
    queries (one per ring step, only the first with the diagonal tile), so its rows pay the fixed cost cp times."""
    rate = attention_rate(s.gpu.key, s.fw.attention_kernel)
    peak = s.gpu.peak_tflops * 1e12 * s.gpu.power_factor
    h, tp, cp = s.model.hidden, s.tp, s.cp
    out = []
    for eff, half, mult in ((rate.fwd_efficiency, rate.fwd_half, 1.0), (rate.bwd_efficiency, rate.bwd_half, BACKWARD_FLOPS)):
        per_key = 4 * h / tp * mult / (peak * eff)  # seconds per (query row x key) over the rank's heads
        out.append((per_key / (2 * cp), per_key * (CAUSAL_TILE / (2 * cp) + half)))
    return out[0], out[1]


def closed_form(s: StageSpec) -> list[Term]:
    """The terms exact in l (the module docstring lists them); zero terms are left out."""
    gpu, model, fw = s.gpu, s.model, s.fw
    h, f, kv, vocab, gpn, layers = model.hidden, model.ffn, model.kv_dim, model.vocab, gpu.gpus_per_node, s.layers
    tp, pp, cp, full = s.tp, s.pp, s.cp, s.full
    passes_fwd = 1 + full
    (fa, fb), (ba, bb) = attention_seconds(s)
    gemm_layers, gemm_head = _gemm_per_token(s)
    hbm = gpu.hbm_gb_s * 1e9 * fw.memory_efficiency
    # rotary on Q and K: 8 bytes per element each (framework.elementwise), K kv_dim wide
    elementwise = layers * (gqa_bytes(model, fw.elementwise_h, 8) + fw.elementwise_f * f) * (1 + full * fw.forward_share)
    elementwise += layers * 6 * f * (s.recompute == "selective")  # the SwiGLU product recomputed: read g, u, write p
    terms = [
        Term("kernel_gaps", c=launches(s) * fw.kernel_gap_s),
        Term("attention", a=layers * (passes_fwd * fa + ba)),
        Term("attention_rows", b=layers * (passes_fwd * fb + bb)),
        Term("gemm", b=gemm_layers / cp),
        Term("gemm_head", b=gemm_head / cp),
        Term("elementwise", b=(elementwise + 16 * vocab) / (tp * cp) / hbm),
        Term("gemm_short", c=(gemm_layers * (fp8_speedup(gpu) if s.fp8 else 1.0) + gemm_head) * gpu.gemm_m_half),
    ]
    if s.fp8:
        casts = (3 * h + f) * passes_fwd + (3 * h + 2 * kv + 2 * f)  # GEMM inputs (forward again), output gradients
        terms.append(Term("fp8_cast", b=layers * casts * fw.fp8_cast_bytes / (tp * cp) / hbm))
    if tp > 1:
        bw = nccl.ring_bytes_s(gpu, tp, gpn)
        n_layer = FORWARD_COLLECTIVES * passes_fwd + BACKWARD_COLLECTIVES
        fp8_gathers = (FP8_GATHERS[0] * passes_fwd + FP8_GATHERS[1]) * s.fp8
        bytes_per_token = layers * (2 * n_layer - fp8_gathers) * h + HEAD_COLLECTIVES * 2 * h  # bf16, fp8 gathers 1 B
        comm = bytes_per_token * (tp - 1) / tp / cp / bw
        lat = (n_layer * layers + HEAD_COLLECTIVES) * nccl.latency_s(gpu, tp, gpn)
        if fw.tp_overlap:  # pipelined with the GEMMs beside it: the first of tp chunks and what the GEMMs cannot cover
            comm = comm / tp + max(0.0, comm * (tp - 1) / tp - gemm_layers / cp)
            lat /= tp
        terms += [Term("tp_comm", b=comm), Term("tp_latency", c=lat)]
    if pp > 1:
        bw, lat = nccl.p2p(gpu, tp * cp * pp > gpn)
        terms += [Term("pp_p2p", b=2 * 2 * h / (tp * cp) / bw), Term("pp_latency", c=2 * lat)]
    if cp > 1:
        terms.append(Term("cp_merge", b=layers * (cp - 1) / cp * h / tp * fw.cp_merge_bytes / hbm))
    return [t for t in terms if t.a or t.b or t.c]


def launches(s: StageSpec) -> float:
    """Kernels the stage launches for one micro-batch, forward and backward: its layers' (recomputation's forward
    share again; FP8's casts and amax kernels), CP's ring steps' and the head's."""
    fw, layers, full = s.fw, s.layers, s.full
    per_layer = fw.kernels_per_layer + fw.fp8_kernels_per_layer * s.fp8
    kernels = per_layer * layers * (1 + full * fw.forward_share) + 2 * layers * (s.recompute == "selective")
    if s.cp > 1:
        kernels += layers * s.cp * (2 + full) * fw.cp_kernels_per_step / 2
    return kernels + fw.kernels_head


def launch_exposed(s: StageSpec, closed: np.ndarray, ring: np.ndarray) -> np.ndarray:
    """The launch floor: a stage cannot finish before the host has launched its kernels (launches x launch_s; the GPU
    runs behind the host's queue), so what the GPU's work (the closed-form terms and the ring's wait) leaves of it is
    exposed: max(0, floor - work)."""
    return np.maximum(0.0, launches(s) * s.fw.launch_s - closed - ring)


def ring_exposed(s: StageSpec, lengths: np.ndarray) -> np.ndarray:
    """Seconds of the CP ring's sends that attention does not hide, for one sequence of each length: per layer and
    pass (cp-1) * max(0, send - step attention), a step's send (K and V of l/cp tokens, kv_dim wide; dK and dV too in
    the backward) running beside the step before. 0 without CP."""
    if s.cp == 1:
        return np.zeros(np.shape(lengths))
    kv, tp, cp = s.model.kv_dim, s.tp, s.cp
    bw, lat = nccl.p2p(s.gpu, tp * cp > s.gpu.gpus_per_node)
    l = np.asarray(lengths, dtype=np.float64)
    (fa, fb), (ba, bb) = attention_seconds(s)
    kv_bytes = 2 * 2 * kv / tp * l / cp  # K and V of one chunk, bf16
    fwd = np.maximum(0.0, lat + kv_bytes / bw - (fa * l + fb) * l / cp)
    bwd = np.maximum(0.0, lat + 2 * kv_bytes / bw - (ba * l + bb) * l / cp)
    return s.layers * (cp - 1) * ((1 + s.full) * fwd + bwd)


def totals(terms: list[Term]) -> tuple[float, float, float]:
    return sum(t.a for t in terms), sum(t.b for t in terms), sum(t.c for t in terms)


TERM_NOTES = {
    "attention": "causal attention FLOPs (forward 2*h*l^2 per layer, backward 2.5x, full recomputation's forward again) "
                 "over TP x CP at the attention kernel's asymptotic rate (notes.attention, hydraplan.core.kernelrates)",
    "attention_rows": "per query row and attention call, the kernel's fixed cost (its `half`: loading Q, rescaling, "
                      "writing O) and the causal diagonal tile (64 keys); a CP rank calls its kernel once per ring step "
                      "(cp times on l/cp queries), so it pays the fixed cost cp times and short chunks attend slower",
    "gemm": "the decoder layers' GEMMs: 6 FLOPs per weight per token (8 under full recomputation) at the dtype's peak x "
            "gemm_efficiency x w/(w + weight_half), w the layer's GEMM weights per GPU (narrow TP shards idle SMs)",
    "gemm_head": "the LM head's GEMM, bf16 (also under FP8 GEMMs)",
    "elementwise": "norms, residual adds, rotary, SwiGLU (framework.elementwise) and the cross-entropy at HBM bandwidth "
                   "x memory_efficiency, split over TP x CP (sequence parallel); recomputation's share again",
    "fp8_cast": "FP8 GEMMs: each GEMM input (QKV, O, FC1, FC2) and output gradient cast to fp8 with a transposed copy "
                "for the weight gradient (framework.fp8)",
    "tp_comm": "TP's all-gathers and reduce-scatters around attention and MLP (sequence parallel: 4 forward, 6 backward, "
               "4 more under full recomputation, 3 for the head), (tp-1)/tp of 2*h bytes per token each (fp8 gathers of "
               "GEMM inputs: h) at NCCL's bus bandwidth (hydraplan.core.collectives; NVLink inside a node)",
    "pp_p2p": "PP: the stage's output activation sent on and its gradient received, 2*h bytes per token each over the "
              "link between the stages (NVLink, or InfiniBand when the pipeline spans nodes)",
    "cp_merge": "CP: every ring step after the first merges its partial output and log-sum-exp into the output "
                "(forward) and accumulates dQ, dK/dV (backward): framework.cp_step bytes per query element at HBM bandwidth",
    "gemm_short": "short GEMMs: efficiency m/(m + gemm_m_half) at m tokens per GPU costs exactly gemm_m_half tokens' "
                  "bf16 GEMM time per micro-batch (fp8 GEMMs pay the same fixed time)",
    "tp_latency": "TP: each collective's latency (the fastest NCCL protocol's on NVLink, gpu.nccl); pipelined with "
                  "the GEMMs (framework.tp_overlap) only the first of tp chunks waits",
    "kernel_gaps": "every kernel the stage launches (launch_exposed lists them) costs framework.kernel_gap_s on the GPU "
                   "whatever its work: the gap between dependent kernels and a short kernel's last partial wave",
    "pp_latency": "PP: the two sends' latency (gpu.nccl)",
    "launch_exposed": "the launch floor: the host launches each kernel at framework.launch_s (the layers' "
                      "framework.kernels_per_layer, FP8's casts and amax kernels, CP's framework.cp_step launches per "
                      "ring step, the head's) and the GPU cannot run ahead of its queue, so a stage lasts at least "
                      "launches x launch_s: max(0, floor - work) is exposed where the work is short, fitted as "
                      "nonnegative increments of a, b, c (fit_worst_rel_err)",
    "cp_ring_exposed": "CP: the K/V ring's sends (K and V of l/cp tokens forward, with dK and dV backward, over NVLink or "
                       "InfiniBand when tp*cp spans nodes; each send's latency and bytes) where the step's attention does "
                       "not hide them: per layer and pass (cp-1) * max(0, send - attention/cp), no polynomial in l, fitted "
                       "as nonnegative increments of a, b, c over the lengths the scheme serves (fit_worst_rel_err)",
}

FIT_POINTS = 24  # single-sequence lengths the exposed ring is evaluated at before fitting its increments
FIT_MIN_LEN = 1024


@dataclass(frozen=True)
class StageTime:
    """A scheme's T(l): its coefficients, their terms, and the worst relative error of the canonical form against
    the model over the lengths fitted (0 when every term is exact)."""

    time: TimeCoeffs
    terms: list[Term]
    fit_rel_err: float


def stage_time(s: StageSpec, fit_range: tuple[int, int] = (FIT_MIN_LEN, 4 * FIT_MIN_LEN)) -> StageTime:
    """T(l) of the scheme: the closed-form terms, plus the exposed ring and launch floor fitted as nonnegative
    increments of a, b, c over single sequences in `fit_range` (the lengths the scheme serves)."""
    terms = closed_form(s)
    lo = max(FIT_MIN_LEN, fit_range[0])
    l = np.unique(np.geomspace(lo, max(fit_range[1], 4 * lo), FIT_POINTS).round())
    a, b, c = totals(terms)
    base = (a * l + b) * l + c
    ring = ring_exposed(s, l)
    floor = launch_exposed(s, base, ring)
    worst = 0.0
    for name, exposed, rest in (("cp_ring_exposed", ring, floor), ("launch_exposed", floor, ring)):
        if np.any(exposed > 0):
            fit = fit_increments(l, base + rest, exposed)
            terms.append(Term(name, a=fit.a, b=fit.b, c=fit.c))
    a, b, c = totals(terms)
    if np.any(ring > 0) or np.any(floor > 0):
        worst = float(np.max(np.abs((a * l + b) * l + c - (base + ring + floor)) / (base + ring + floor)))
    return StageTime(_coeffs(terms, worst), [t for t in terms if t.a or t.b or t.c], worst)


def _coeffs(terms: list[Term], fit_rel_err: float) -> TimeCoeffs:
    a, b, c = totals(terms)
    return TimeCoeffs(a=sig(a), b=sig(b), c=sig(c), a_terms=_named(terms, "a"), b_terms=_named(terms, "b"),
                      c_terms=_named(terms, "c"), fit_rel_err=sig(fit_rel_err, 3))


def _named(terms: list[Term], part: str) -> dict[str, float] | None:
    out = {t.name: sig(getattr(t, part)) for t in terms if getattr(t, part)}
    return out or None


def sig(x: float, digits: int = 6) -> float:
    """Round to significant digits so the generated files are short and byte-for-byte reproducible."""
    return float(f"{x:.{digits}g}")
