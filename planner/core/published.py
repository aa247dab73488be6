"""Published GPU measurements as data (data/published/*.json): the file format, one pydantic model per part.

Each file holds the numbers of one source (a paper, a documentation table, a repository's benchmark page, an issue
thread) with where each number sits in it and the exact configuration it was measured in, so the cost model can be
asked to predict the same quantity (`python -m bench fidelity`). Numbers only: never a source's text.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

PUBLISHED_SCHEMA: Final = "hydraplan.published/v1"

Dtype = Literal["bf16", "fp16", "fp8"]
Quantity = Literal[
    "tflops",  # a kernel's achieved TFLOP/s on one GPU (the source's FLOP count, e.g. FlashAttention's)
    "tflops_per_gpu",  # a training iteration's model TFLOP/s per GPU, by the source's FLOP formula (`flops`)
    "tokens_per_s_per_gpu",  # training throughput: global batch tokens / iteration seconds / GPUs
    "mfu",  # model FLOPs utilization as a fraction (0.45, not 45), by the source's FLOP formula and peak
    "iteration_s",  # seconds per training iteration
    "busbw_GBps",  # nccl-tests bus bandwidth, GB/s (1e9 bytes)
    "algbw_GBps",  # nccl-tests algorithm bandwidth, GB/s
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Source(_Model):
    """Where the numbers come from."""

    title: str = Field(description="what the source is, e.g. 'FlashAttention-3 (Shah et al. 2024)'")
    document: str = Field(description="URL, arXiv id, or repository and path")
    version: str = Field(description="arXiv version, release, or the commit the file was read at")
    date: str = Field(description="the source's date (YYYY-MM-DD or YYYY-MM), as it states or as committed")
    notes: str | None = Field(None, description="what holds for every point: hardware details, software versions")


class KernelConfig(_Model):
    """One kernel benchmark: an attention kernel's forward or backward pass on one GPU."""

    kind: Literal["kernel"] = "kernel"
    kernel: str = Field(description="flash-attention-2, flash-attention-3, cudnn, pytorch, triton, ...")
    gpu: str = Field(description="a key of hydraplan.core.hardware.GPUS: h100, h200, a100, a800")
    dtype: Dtype
    direction: Literal["forward", "backward", "forward+backward"]
    causal: bool
    head_dim: PositiveInt
    seqlen: PositiveInt
    batch: PositiveInt | None = Field(None, description="sequences per call")
    heads: PositiveInt | None = Field(None, description="query heads per call")
    hidden: PositiveInt | None = Field(None, description="heads x head_dim, where the source states it instead")
    details: str | None = Field(None, description="anything else the source states that bears on the rate")


class IterationConfig(_Model):
    """One training job's steady-state iteration."""

    kind: Literal["iteration"] = "iteration"
    framework: str = Field(description="nemo, megatron-lm, torchtitan, ...")
    model: str = Field(description="a Hugging Face config under data/models/ or data/models/published/ (file stem), "
                                   "or a bundled model key")
    gpu: str = Field(description="a key of hydraplan.core.hardware.GPUS")
    gpus: PositiveInt
    gpus_per_node: PositiveInt = 8
    tp: PositiveInt = 1
    pp: PositiveInt = 1
    cp: PositiveInt = 1
    vp: PositiveInt | None = Field(None, description="virtual pipeline stages per rank (interleaved 1F1B)")
    dp: PositiveInt = Field(description="data-parallel replicas (FSDP shards count here)")
    fsdp: bool = Field(False, description="parameters sharded and gathered per layer (FSDP / ZeRO-3)")
    seq_len: PositiveInt
    global_batch: PositiveInt = Field(description="sequences per iteration")
    micro_batch: PositiveInt = Field(description="sequences per micro-batch")
    dtype: Dtype = Field(description="GEMM precision: bf16, or fp8 (Transformer Engine / torchao, attention in bf16)")
    recompute: str = Field("none", description="none, selective, full, or the source's words")
    flops: str | None = Field(None, description="the FLOP formula behind tflops_per_gpu or mfu: nemo, megatron, "
                                                "torchtitan, 6n (6 x parameters per token), ...")
    details: str | None = Field(None, description="anything else the source states that bears on the time")


class CollectiveConfig(_Model):
    """One collective at one size: nccl-tests' busbw or algbw."""

    kind: Literal["collective"] = "collective"
    op: Literal["all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv"]
    gpu: str = Field(description="a key of hydraplan.core.hardware.GPUS")
    gpus: PositiveInt
    gpus_per_node: PositiveInt = 8
    fabric: str = Field(description="nvlink (one node), infiniband or roce (across nodes)")
    bytes: PositiveInt = Field(description="message size in bytes, as nccl-tests' size column")
    dtype: str = "float"
    details: str | None = None


Config = Annotated[KernelConfig | IterationConfig | CollectiveConfig, Field(discriminator="kind")]


class Point(_Model):
    """One published number."""

    id: str = Field(description="unique within the file, e.g. fa3-fwd-causal-hd128-4k")
    where: str = Field(description="table, figure or line in the source, e.g. 'Figure 5(b)'")
    read_off_plot: bool = Field(False, description="the value is read off a plot, not printed")
    quantity: Quantity
    value: float = Field(gt=0)
    config: Config


class PublishedFile(_Model):
    """data/published/NAME.json: one source's measurements."""

    schema_: Literal["hydraplan.published/v1"] = Field(PUBLISHED_SCHEMA, alias="schema")
    source: Source
    points: list[Point] = Field(min_length=1)
