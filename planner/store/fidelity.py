"""The published GPU measurements (data/published/*.json, hydraplan.core.published) and what hydraplan predicts for
each: an attention kernel's TFLOP/s from its rate (hydraplan.core.kernelrates), a collective's bus bandwidth from
the fabric (hydraplan.core.collectives), a training iteration's TFLOP/s, tokens/s, MFU or seconds from the analytic
profile the project generates for that model, GPU, dtype and framework (`hydraplan profiles generate`'s code) and the
iteration's terms (hydraplan.core.iteration), stated in the source's own FLOP convention (hydraplan.core.flopcount).
A point the model is not claimed to hold for is left out of the 15% set with the reason (`Prediction.excluded`) and
still predicted wherever it can be, with what the prediction assumes (`Prediction.predicted_as`), so the gap shows;
Megatron's dynamic-CP benchmark needs Megatron's schedulers, a layer up (hydraplan.methods.fidelity_dcp)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from hydraplan.core import collectives as nccl
from hydraplan.core.analytic import analytic_profile, analytic_scheme
from hydraplan.core.flopcount import flops_per_token
from hydraplan.core.hardware import FABRICS, GPUS, NCCL_LATENCY, Fabric, ModelSpec
from hydraplan.core.iteration import Job, iteration_time
from hydraplan.core.kernelrates import attention_rate, kernel_tflops
from hydraplan.core.published import CollectiveConfig, IterationConfig, KernelConfig, Point, PublishedFile
from hydraplan.core.schema import Profile, Scheme
from hydraplan.store.fileio import load_model
from hydraplan.store.paths import DATA_DIR
from hydraplan.store.profiles import framework_spec, model_by_name

PUBLISHED_DIR = DATA_DIR / "published"
FRAMEWORK_OF = {"nemo": "megatron", "megatron-lm": "megatron", "megatron-bridge": "megatron-bridge",
                "torchtitan": "torchtitan"}
"""The framework constants (core.frameworks) each source's training framework runs with."""
NEEDS_EXECUTOR = {"megatron-dcp-bench": "variable-length documents under Megatron's dynamic CP and dp_balanced "
                                        "schedulers: predicted by their executors (hydraplan.methods.fidelity_dcp), not "
                                        "as a homogeneous job"}
UNITS = {"tflops": "TFLOP/s", "tflops_per_gpu": "TFLOP/s per GPU", "tokens_per_s_per_gpu": "tokens/s per GPU",
         "mfu": "MFU", "iteration_s": "s", "busbw_GBps": "GB/s", "algbw_GBps": "GB/s"}


@dataclass(frozen=True)
class Prediction:
    source: str  # the file's stem under data/published/
    point: Point
    predicted: float | None  # None: not computable (a TFLOP/s by no stated formula, or left to an executor)
    excluded: str | None = None  # why the point is left out of the set the model is claimed to hold for
    scheme_in_profile: bool | None = None  # iterations: whether the bundled profile's scheme space holds the layout
    terms: dict[str, float] | None = None  # iterations: seconds per term
    predicted_as: str | None = None  # what the prediction assumes where the source is silent or the model differs

    @property
    def kind(self) -> str:
        return self.point.config.kind

    @property
    def ratio(self) -> float | None:
        return None if self.predicted is None else self.predicted / self.point.value


def published_files(folder: Path = PUBLISHED_DIR) -> list[tuple[str, PublishedFile]]:
    return [(path.stem, load_model(PublishedFile, path)) for path in sorted(folder.glob("*.json"))]


def convention(flops: str | None) -> str | None:
    """The FLOP convention a point's `flops` text names (core.flopcount.CONVENTIONS), None if it names none."""
    text = (flops or "").strip()
    for prefix, name in (("nemo:", "nemo"), ("megatron-bridge:", "megatron-bridge"), ("megatron (", "megatron"),
                         ("torchtitan (", "torchtitan")):
        if text.startswith(prefix):
            return name
    return "nemo" if "NeMo's later Model TFLOP/s formula" in text else None


def recompute_mode(words: str) -> str:
    """The scheme's recomputation for a source's words: none when not stated (or a few layers' blocks)."""
    w = words.lower()
    return "full" if w.startswith("full") else "selective" if w.startswith("selective") else "none"


def predict_kernel(c: KernelConfig) -> float:
    gpu = GPUS[c.gpu]
    rate = attention_rate(c.gpu, c.kernel, c.dtype, c.head_dim)
    peak = gpu.fp8_tflops if c.dtype == "fp8" else gpu.peak_tflops
    assert peak is not None  # attention_rate has no fp8 rate of a GPU without FP8 tensor cores
    return float(kernel_tflops(rate, peak, c.direction, c.causal, c.seqlen))


def fabric_of(source: str, c: CollectiveConfig) -> Fabric:
    """The fabric a point ran on (its `fabric`'s first word: nvlink, or across nodes infiniband or gcp-a3-mega; efa,
    which hydraplan has no fabric for, as the GPU's InfiniBand: EFA_AS), with its system's NCCL latencies
    (hardware.NCCL_LATENCY)."""
    word = c.fabric.split()[0]
    gpu = GPUS[c.gpu]
    fab = (gpu.node_fabric if c.gpus <= c.gpus_per_node else gpu.net_fabric) if word in ("nvlink", "infiniband", "efa") \
        else FABRICS[word]
    k = NCCL_LATENCY.get(source, 1.0)
    return replace(fab, protocols=tuple(replace(p, latency_s=p.latency_s * k) for p in fab.protocols), hop_s=fab.hop_s * k)


def predict_collective(source: str, c: CollectiveConfig) -> float:
    """nccl-tests' algbw (GB/s) of the point's operation (the caller scales it to busbw)."""
    gpu = GPUS[c.gpu]
    fab = fabric_of(source, c)
    if c.gpus <= c.gpus_per_node:
        gpu = replace(gpu, node_fabric=fab)
    busbw = nccl.bus_bandwidth_GBps(gpu, c.op, c.gpus, c.gpus_per_node, c.bytes, fab)
    return busbw / nccl.bus_factor(c.op, c.gpus)


@lru_cache(maxsize=64)
def _profile(model: str, gpu: str, dtype: str, framework: str) -> Profile | None:
    """The analytic profile of the model on the GPU (None when no scheme holds MIN_MAX_LEN at the reference size)."""
    try:
        return analytic_profile(GPUS[gpu], model_by_name(model), framework_spec(framework), dtype=dtype)
    except ValueError:  # pydantic: a profile without schemes
        return None


def iteration_scheme(c: IterationConfig) -> tuple[ModelSpec, Scheme, bool]:
    """The scheme of the job's layout in the profile hydraplan generates for the job's model, GPU, dtype and
    framework, made by the same code (analytic_scheme) when that profile's scheme space leaves it out; and whether
    the profile holds it."""
    framework = FRAMEWORK_OF[c.framework]
    mode = recompute_mode(c.recompute)
    profile = _profile(c.model, c.gpu, c.dtype, framework)
    scheme = profile.scheme(c.tp, c.pp, c.cp, mode) if profile is not None else None
    spec = model_by_name(c.model)
    if scheme is not None:
        return spec, scheme, True
    made, _ = analytic_scheme(GPUS[c.gpu], spec, c.tp, c.pp, c.cp, mode, framework_spec(framework), c.dtype)
    return spec, made, False


def predict_iteration(c: IterationConfig, quantity: str) -> tuple[float, dict[str, float], bool]:
    spec, scheme, in_profile = iteration_scheme(c)
    job = Job(gpus=c.gpus, gpus_per_node=c.gpus_per_node, tp=c.tp, pp=c.pp, cp=c.cp, dp=c.dp, seq_len=c.seq_len,
              global_batch=c.global_batch, micro_batch=c.micro_batch, vp=c.vp or 1, fsdp=c.fsdp)
    gpu = GPUS[c.gpu]
    fw = framework_spec(FRAMEWORK_OF[c.framework])
    p2p = nccl.p2p(gpu, c.tp * c.cp * c.pp > c.gpus_per_node)[1]
    t = iteration_time(scheme, spec, job, gpu, fw, c.dtype == "fp8", p2p)
    terms = {"propagation_s": t.propagation_s, "dp_sync_s": t.dp_sync_s, "fsdp_s": t.fsdp_s,
             "optimizer_s": t.optimizer_s, "fp8_cast_s": t.fp8_cast_s}
    seconds = t.total_s
    if quantity == "iteration_s":
        return seconds, terms, in_profile
    if quantity == "tokens_per_s_per_gpu":
        return job.tokens / seconds / c.gpus, terms, in_profile
    conv = convention(c.flops)
    assert conv is not None
    tflops = flops_per_token(conv, spec, c.seq_len, c.tp) * job.tokens / seconds / c.gpus / 1e12
    return (tflops / gpu.peak_tflops if quantity == "mfu" else tflops), terms, in_profile


SFT = ("supervised fine-tuning on SQuAD packed into 4096-token sequences: the documents' lengths (attention, "
       "padding) and the layout's interleaving are not stated (the 13B row runs faster than its pretraining row at a "
       "quarter of the batch)")
SFT_AS = ("each 4096-token pack as one 4096-token sequence in the pretraining layout's terms (attention over the whole "
          "pack: more than its documents, which attend within themselves, do)")
NO_FORMULA = "the source states no FLOP formula for its TFLOP/s (its tokens/s are predicted)"


ROWWISE = ("torchao's rowwise-scaled FP8, a recipe the profiles have no GEMM rate for (the same layouts run 27-37% "
           "slower than with tensorwise scaling, which the dtype fp8 profiles model)")
ROWWISE_AS = "at the tensorwise FP8 GEMM rate of the dtype fp8 profile (rowwise scaling's own rate is not modelled)"


TORCHTITAN_CP = (
    "PyTorch's experimental context parallelism under torchtitan 9dec370 (its all-gather rotation; "
    "torch.distributed.tensor.experimental._attention as read at pytorch 0123248a, later than the runs' torch 1963fc8: "
    "K/V all-gathered once beside the first step's attention, the round-robin load balancer, one SDPA call per step "
    "merged in fp32, dK/dV passed around the ring in fp32 by all-to-all): at these 32K-token chunks per rank its "
    "exchanges hide behind the steps' attention and its fp32 merges and accumulations are a few percent of a step, so "
    "no per-step cost of it explains the series. Per rank, every cost of this job is constant or linear "
    "in the CP degree n at a fixed chunk (n ring steps of one chunk's attention each, n-1 chunks gathered), so an "
    "iteration can at most double from CP 2 to CP 4; Llama 3.1 8B's published one grows 2.37x (2,540 to 1,071 "
    "tokens/s per GPU). The model predicts 1.1-1.3x the published throughput at CP 4-8 on both models and 0.90-1.13x "
    "at CP 2: a term bringing CP 4-8 within 15% would push 8B's CP 2 out of it")
UNSTATED_VP = "interleaved 1F1B with the stages per rank not stated (the bubble depends on them)"
TORCHTITAN_VP = 2
VP_AS = (f"with {TORCHTITAN_VP} stages per rank, torchtitan's default for an interleaved schedule given no split points "
         "(generate_split_points in torchtitan/parallelisms/pipelining_utils.py at 9dec370; the source states neither), "
         "as its micro-batches are torchtitan's default")


EFA = ("AWS EFA (SRD over Ethernet through the aws-ofi-nccl plugin), a fabric hydraplan's GPU specs do not model "
       "(they model NVLink and InfiniBand): NCCL's choice of algorithms over it at 32-256 GPUs is not the hierarchical "
       "tree and the rings of hydraplan.core.collectives (fitted on its own, half its points stay beyond 15%), its "
       "all-to-all runs at 70% of its all-gather's NIC rate, and the source's two 16-GPU runs differ 2x at 256 MB")
EFA_AS = ("over the H100's InfiniBand (NDR) fabric of hydraplan.core.hardware, the one network it has for the GPU, at the "
          "same 400 Gb/s per GPU as EFA's 32 devices per node")


def why_excluded(p: Point) -> str | None:
    c = p.config
    if isinstance(c, CollectiveConfig) and c.fabric.split()[0] == "efa":
        return EFA
    if isinstance(c, IterationConfig):
        if c.model in NEEDS_EXECUTOR:
            return NEEDS_EXECUTOR[c.model]
        if "-sft-" in p.id:
            return SFT + ("; " + NO_FORMULA if p.quantity in ("tflops_per_gpu", "mfu") else "")
        if "rowwise" in p.id:
            return ROWWISE
        if c.framework == "torchtitan" and c.cp > 1:
            return TORCHTITAN_CP
        if "interleaved" in p.id and c.vp is None and c.framework != "torchtitan":
            return UNSTATED_VP
        if p.quantity in ("tflops_per_gpu", "mfu") and convention(c.flops) is None:
            return NO_FORMULA
    return None


def assumed(p: Point) -> tuple[IterationConfig, str | None]:
    """The configuration a training point is predicted in and what that assumes beyond the source (None: nothing)."""
    c = p.config
    assert isinstance(c, IterationConfig)
    if "-sft-" in p.id:
        return c, SFT_AS
    if "rowwise" in p.id:
        return c, ROWWISE_AS
    if "interleaved" in p.id and c.vp is None and c.framework == "torchtitan":
        return c.model_copy(update={"vp": TORCHTITAN_VP}), VP_AS
    return c, None


def predict(source: str, p: Point) -> Prediction:
    """hydraplan's prediction of one published point, the reason if it is left out, and what the prediction assumes;
    no prediction only for a TFLOP/s or MFU by no stated formula and for the points an executor predicts."""
    excluded = why_excluded(p)
    c = p.config
    if isinstance(c, KernelConfig):
        return Prediction(source, p, predict_kernel(c), excluded)
    if isinstance(c, CollectiveConfig):
        value = predict_collective(source, c)
        return Prediction(source, p, value if p.quantity == "algbw_GBps" else value * nccl.bus_factor(c.op, c.gpus),
                          excluded, predicted_as=EFA_AS if c.fabric.split()[0] == "efa" else None)
    if c.model in NEEDS_EXECUTOR or (p.quantity in ("tflops_per_gpu", "mfu") and convention(c.flops) is None):
        return Prediction(source, p, None, excluded)
    config, predicted_as = assumed(p)
    value, terms, in_profile = predict_iteration(config, p.quantity)
    return Prediction(source, p, value, excluded, in_profile, terms, predicted_as)


def predictions(folder: Path = PUBLISHED_DIR) -> list[Prediction]:
    return [predict(source, p) for source, f in published_files(folder) for p in f.points]
