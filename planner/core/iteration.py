"""A whole training iteration of a homogeneous job (the layouts others publish measurements of), from the project's
own estimators plus the physical terms an iteration has that the canonical estimate leaves out:

- propagation: the canonical cost model's micro-batch time (hydraplan.core.cost) in the pipeline formula, or for
  interleaved 1F1B (vp > 1) the schedule simulator (hydraplan.core.schedules);
- data-parallel traffic: the parameter all-gather and gradient reduce-scatter of a distributed optimizer, one each
  per iteration, as hydraplan.core.sync prices LNK's pull and push (a pull hidden behind the forward, a push behind
  the backward), over the DP x CP replicas that share a slice; or, for DDP without a distributed optimizer and
  without overlap (`ddp_allreduce_s`), one all-reduce of every gradient after the backward, nothing hiding it;
- FSDP's per-layer gathers (`fsdp_exposed_s`): parameters gathered before each layer's forward and again before its
  backward, gradients reduce-scattered after it, each hidden behind the neighbouring layer's compute;
- the optimizer step (`optimizer_s`): AdamW over the parameters a GPU owns (all of its stage's under DDP), at HBM
  bandwidth;
- FP8 weight casts (`fp8_weight_cast_s`): Transformer Engine casts each weight to fp8 (and its transpose) once per
  iteration, on the first micro-batch.

Pure functions: the fidelity bench (bench/bench_fidelity.py) composes them for every published training job, and
`iteration_from_propagation` adds them to a propagation an executor scored (Megatron's dynamic-CP benchmark).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from hydraplan.core import collectives as nccl
from hydraplan.core import sync
from hydraplan.core.cost import pipeline_time_from_mb, seq_cost
from hydraplan.core.frameworks import FrameworkSpec
from hydraplan.core.hardware import GPUSpec, ModelSpec
from hydraplan.core.schedules import build_schedule, fb_split, simulate
from hydraplan.core.schema import Scheme

FORWARD_SHARE = sync.FORWARD_SHARE
GradSync = Literal["distributed-optimizer", "ddp"]
GRAD_REDUCE_BYTES = 4
"""Bytes per gradient DDP all-reduces: Megatron under --bf16 keeps fp32 main gradients (--main-grads-dtype fp32, the
default) and so accumulates and all-reduces them in fp32 (accumulate_allreduce_grads_in_fp32 set in validate_args;
megatron/training/arguments.py, Megatron-LM dev at d48bd6b)."""


@dataclass(frozen=True)
class Job:
    """A homogeneous training job: every pipeline one <tp, pp, cp> scheme, `dp` replicas, micro-batches of
    `micro_batch` sequences of `seq_len` tokens, `global_batch` sequences per iteration."""

    gpus: int
    gpus_per_node: int
    tp: int
    pp: int
    cp: int
    dp: int
    seq_len: int
    global_batch: int
    micro_batch: int
    vp: int = 1
    fsdp: bool = False
    grad_sync: GradSync = "distributed-optimizer"  # or "ddp": every GPU all-reduces every gradient, steps every parameter

    @property
    def micro_batches(self) -> int:
        """Micro-batches each pipeline runs per iteration (gradient accumulation steps)."""
        return max(1, self.global_batch // (self.micro_batch * self.dp))

    @property
    def tokens(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def replicas(self) -> int:
        """GPUs that share one parameter slice and reduce its gradients: the DP x CP group."""
        return self.dp * self.cp


@dataclass(frozen=True)
class IterationTime:
    """Seconds of one iteration, term by term."""

    propagation_s: float
    dp_sync_s: float  # gradient traffic not hidden: a distributed optimizer's gather and reduce-scatter, DDP's all-reduce
    fsdp_s: float  # FSDP's per-layer gathers and reduce-scatters that compute does not hide
    optimizer_s: float
    fp8_cast_s: float

    @property
    def total_s(self) -> float:
        return self.propagation_s + self.dp_sync_s + self.fsdp_s + self.optimizer_s + self.fp8_cast_s


def micro_batch_s(scheme: Scheme, job: Job) -> float:
    """The canonical time of one micro-batch of `micro_batch` sequences of `seq_len` tokens."""
    return float(seq_cost(scheme, [job.seq_len] * job.micro_batch).sum()) + scheme.time.c


def propagation_s(scheme: Scheme, job: Job, p2p_s: float = 0.0) -> float:
    """One pipeline's forward and backward of every micro-batch: the pipeline formula (sum + (pp-1) max) for 1F1B;
    for interleaved 1F1B the simulated schedule, each of vp chunks taking T/vp and every hop between devices p2p_s."""
    t = micro_batch_s(scheme, job)
    m = job.micro_batches
    if job.vp <= 1 or job.pp == 1:
        return pipeline_time_from_mb(np.full(m, t), job.pp)
    schedule = build_schedule(job.pp, m, 1, job.vp)
    return simulate(schedule, *fb_split(np.full(m, t), job.vp), p2p_s=p2p_s).latency_s


def group_gpus_per_node(job: Job) -> int:
    """Members of one DP x CP group inside a node: ranks are ordered TP fastest, then CP and DP (Megatron's order),
    so a node of g GPUs holds g / tp of them."""
    return max(1, min(job.replicas, job.gpus_per_node // job.tp))


def dp_transfer_s(params: int, gpu: GPUSpec, job: Job) -> float:
    """One direction (parameter gather or gradient reduce-scatter) of a GPU's slice, as sync.transfer_s prices it
    at the ring bus bandwidth of the n-replica group (collectives.group_bus_bytes_s), times (n-1)/n (what a ring
    moves; 0 with one replica)."""
    n = job.replicas
    if n <= 1:
        return 0.0
    bw = nccl.group_bus_bytes_s(gpu, n, group_gpus_per_node(job), job.gpus_per_node) / 1e9
    return float(sync.transfer_s(params, bw, job.tp, job.pp)) * (n - 1) / n


def dp_sync_s(params: int, gpu: GPUSpec, job: Job, window: float) -> float:
    """The distributed optimizer's traffic that the propagation `window` does not hide (sync.exposed_s: the gather
    behind its forward third, the reduce-scatter behind its backward two thirds)."""
    return float(sync.exposed_s(dp_transfer_s(params, gpu, job), window))


def ddp_allreduce_s(params: int, gpu: GPUSpec, job: Job, grad_bytes: int = GRAD_REDUCE_BYTES) -> float:
    """DDP without a distributed optimizer and without overlap (Megatron's defaults: no --use-distributed-optimizer,
    no --overlap-grad-reduce, which makes its gradient buffer one bucket): after the backward, one all-reduce of the
    stage's gradients (its tp x pp slice, `grad_bytes` each) over the DP x CP replicas, as NCCL runs it
    (collectives.collective_s: NVLS inside a node, the hierarchical tree across nodes), nothing hiding it."""
    return nccl.collective_s(gpu, "all_reduce", job.replicas, group_gpus_per_node(job),
                             params / (job.tp * job.pp) * grad_bytes)


def optimizer_s(params: int, job: Job, gpu: GPUSpec, fw: FrameworkSpec) -> float:
    """AdamW over the parameters one GPU owns (sharded over the pipeline's tp x pp and, with a distributed
    optimizer, the DP x CP replicas; under DDP every replica steps its whole slice): framework.optimizer_bytes_per_param
    each at HBM bandwidth."""
    owned = params / (job.tp * job.pp * (job.replicas if job.grad_sync == "distributed-optimizer" else 1))
    return owned * fw.optimizer_bytes_per_param / (gpu.hbm_gb_s * 1e9 * fw.memory_efficiency)


def fp8_weight_cast_s(model: ModelSpec, job: Job, gpu: GPUSpec, fw: FrameworkSpec) -> float:
    """Transformer Engine's per-iteration casts of the stage's layer weights to fp8 and their transposes: read bf16
    (2 bytes), write fp8 twice (2 bytes)."""
    weights = model.layers / job.pp * model.layer_matmul_params / job.tp
    return weights * 4 / (gpu.hbm_gb_s * 1e9 * fw.memory_efficiency)


def fsdp_exposed_s(model: ModelSpec, job: Job, gpu: GPUSpec, layer_compute_s: float, gather_bytes: float = 2,
                   reduce_bytes: float = 4) -> float:
    """FSDP's per-layer traffic compute does not hide, per iteration: each layer's parameters (its TP shard) are
    all-gathered over the dp shards before its forward and again before its backward (resharded after the forward),
    and its gradients reduce-scattered after the backward (`reduce_bytes` per value: fp32), every micro-batch. Each
    collective overlaps the neighbouring layer's compute (prefetch), so per layer and pass max(0, comm - compute) is
    exposed, plus the first gather, which nothing hides. layer_compute_s: one layer's forward and backward of one
    micro-batch."""
    n = job.dp
    if n <= 1:
        return 0.0
    layer_params = model.layer_params / job.tp
    gpn = group_gpus_per_node(job)
    gather = nccl.collective_s(gpu, "all_gather", n, gpn, layer_params * gather_bytes)
    reduce = nccl.collective_s(gpu, "reduce_scatter", n, gpn, layer_params * reduce_bytes)
    fwd, bwd = layer_compute_s * FORWARD_SHARE, layer_compute_s * (1 - FORWARD_SHARE)
    per_layer = max(0.0, gather - fwd) + max(0.0, gather + reduce - bwd)
    layers = model.layers / job.pp
    return job.micro_batches * layers * per_layer + gather


def iteration_from_propagation(prop: float, model: ModelSpec, job: Job, gpu: GPUSpec, fw: FrameworkSpec, fp8: bool,
                               fsdp_s: float = 0.0) -> IterationTime:
    """One iteration of `job` whose propagation took `prop` seconds (the canonical estimate's, or an executor's):
    its gradient traffic by `job.grad_sync` (none beside FSDP's own `fsdp_s`), the optimizer step, FP8's casts."""
    if job.fsdp:
        sync_s = 0.0
    elif job.grad_sync == "ddp":
        sync_s = ddp_allreduce_s(model.params, gpu, job)
    else:
        sync_s = dp_sync_s(model.params, gpu, job, prop)
    return IterationTime(
        propagation_s=prop,
        dp_sync_s=sync_s,
        fsdp_s=fsdp_s,
        optimizer_s=optimizer_s(model.params, job, gpu, fw),
        fp8_cast_s=fp8_weight_cast_s(model, job, gpu, fw) if fp8 else 0.0,
    )


def iteration_time(scheme: Scheme, model: ModelSpec, job: Job, gpu: GPUSpec, fw: FrameworkSpec,
                   fp8: bool, p2p_s: float = 0.0) -> IterationTime:
    """Every term of one iteration of `job` on `scheme` (the profile's T(l) for its layout)."""
    prop = propagation_s(scheme, job, p2p_s)
    fsdp = 0.0
    if job.fsdp:
        fsdp = fsdp_exposed_s(model, job, gpu, micro_batch_s(scheme, job) / (model.layers / job.pp))
    return iteration_from_propagation(prop, model, job, gpu, fw, fp8, fsdp)
