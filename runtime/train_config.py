"""run_plan's own options (the training side), declared once: every field with an `Opt` is a flag of
runtime/run_plan.py (core/options.py `add_flags`), so its name, type, default and help are written here only.
run_plan types its flags once into a `TrainConfig` (with, when it plans while it trains, the run it plans:
runtime/online.py OnlineConfig) and passes that, never the argparse namespace, to what runs the job."""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

from hydraplan.core.errors import UserError, flag_of
from hydraplan.core.options import Opt
from hydraplan.runtime.device import DTYPES
from hydraplan.runtime.liveness import DEFAULT_S
from hydraplan.runtime.model import CONFIGS
from hydraplan.runtime.online import OnlineConfig
from hydraplan.runtime.optim import DecayStyle, Schedule

RunDtype = Literal["bf16", "fp32", "fp64", "fp8"]
"""--dtype's names: the runtime's dtypes (device.DTYPES) and fp8, which it refuses (FP8_REFUSAL)."""
FP8_REFUSAL = (f"{flag_of('dtype')} fp8: FP8 GEMMs need Transformer Engine on a CUDA GPU, which this runtime does not "
               "drive (it trains bf16, fp32 or fp64; an fp8 profile plans Transformer Engine jobs)")


class TrainConfig(BaseModel):
    """What the job replays or plans, the model, the optimizer and how the job runs. `planning`: the run planned
    while training (no plan argument), typed from pack's flags; None when replaying plans."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    plan: Annotated[str | None, Opt(
        "a plan file, or a run folder of iter_*.json or .parquet (replayed in order); without it the job plans its "
        "own iterations while it trains, from pack's options below", positional=True)] = None
    iterations: Annotated[int | None, Opt(
        "replay only the first K plans; planning while training: the run's iterations (pack's)")] = None
    model: Annotated[str | None, Opt(f"model config: {', '.join(CONFIGS)} (default tiny)")] = None
    init_from: Annotated[str | None, Opt(
        "start from a local Hugging Face Llama checkpoint (config.json + safetensors); sets the model",
        metavar="DIR")] = None
    hf_config: Annotated[str | None, Opt(
        "the model of a Hugging Face config.json (Llama, Mistral, Qwen2), seeded initial weights", metavar="FILE")] = None
    save: Annotated[str | None, Opt("after the last iteration, save the sharded masters and AdamW states",
                                    metavar="DIR")] = None
    resume: Annotated[str | None, Opt(
        "continue a run saved with --save (same world size and model): the plans after its last iteration",
        metavar="DIR")] = None
    dtype: Annotated[RunDtype | None, Opt(
        "compute dtype (default bf16 on CUDA, fp32 on CPU; masters are fp32, fp64 for fp64; fp8 is refused: it "
        "needs Transformer Engine on a GPU)")] = None
    dataset: Annotated[str | None, Opt(
        "dataset the plans were (or are) sampled from; its token ids are trained on when it has them, else "
        "synthetic tokens per sequence id")] = None
    verify: Annotated[bool, Opt(
        "rank 0 also trains in one process in fp64 and compares parameters (fp64) or gradients (fp32, bf16)")] = False
    tolerance: Annotated[float | None, Opt(
        "--verify tolerance: max abs parameter difference (fp64, default 1e-9) or relative gradient error (fp32, "
        "bf16; default per iteration: an error model of the dtype, layers, TP and tokens, runtime/verify.py)")] = None
    compile: Annotated[bool, Opt(
        "torch.compile the elementwise blocks (RMSNorm, RoPE, SwiGLU, the loss; runtime/kernels.py)")] = False
    lr: Annotated[float, Opt("AdamW learning rate (the peak, with a schedule)")] = 1e-3
    lr_warmup_iters: Annotated[int, Opt("iterations of linear warmup to --lr")] = 0
    lr_decay_style: Annotated[DecayStyle, Opt(
        "after the warmup: constant, or linear / cosine decay to --min-lr")] = "constant"
    lr_decay_iters: Annotated[int | None, Opt(
        "iteration at which the decay reaches --min-lr (default: the run's last iteration + 1)")] = None
    min_lr: Annotated[float, Opt("learning rate at the end of the decay")] = 0.0
    clip_grad: Annotated[float, Opt("clip the global gradient L2 norm to this (0: no clipping)")] = 1.0
    init_seed: Annotated[int, Opt("parameter initialisation seed")] = 0
    memory: Annotated[bool, Opt(
        "measure each rank's peak bytes during every step (CPU: glibc heap statistics; CUDA: max_memory_allocated) "
        "and print them next to the plan's profile's memory model")] = False
    overlap: Annotated[bool, Opt(
        "pull everything before and push everything after the propagation (no communication hidden)")] = True
    timeout_s: Annotated[float, Opt("collective timeout: a stuck peer fails the job instead of hanging it")] = 300.0
    liveness_s: Annotated[float, Opt(
        "a rank whose heartbeat stops this long is named in one line and the job ends (0: off)")] = DEFAULT_S
    planning: OnlineConfig | None = None

    @field_validator("dtype")
    @classmethod
    def _no_fp8(cls, v: str | None) -> str | None:
        if v == "fp8":
            raise ValueError(FP8_REFUSAL)
        return v

    @field_validator("lr_warmup_iters", "min_lr", "clip_grad")
    @classmethod
    def _not_negative(cls, v: float, info: ValidationInfo) -> float:
        if v < 0:
            raise ValueError(f"{flag_of(str(info.field_name))}: {v} is negative")
        return v

    @model_validator(mode="after")
    def _one_model(self) -> TrainConfig:
        if self.verify and self.resume:
            raise ValueError("--verify and --resume: give one (the reference would start from the initial weights)")
        given = [flag_of(f) for f in ("model", "init_from", "hf_config") if getattr(self, f)]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)}: give one (--init-from and --hf-config take the model from a "
                             "config.json)")
        return self

    @property
    def torch_dtype(self) -> torch.dtype:
        """The compute dtype (run_plan resolves the device's default into `dtype` before anything reads it)."""
        assert self.dtype is not None and self.dtype != "fp8"
        return DTYPES[self.dtype]

    def schedule(self, iterations: int) -> Schedule:
        """The learning-rate schedule and clipping of the flags; the decay ends at the run's end (`iterations`,
        its last iteration + 1) by default."""
        decay = self.lr_decay_iters if self.lr_decay_iters is not None else iterations
        if self.lr_decay_style != "constant" and decay <= self.lr_warmup_iters:
            raise UserError(f"--lr-decay-iters: {decay} must exceed --lr-warmup-iters {self.lr_warmup_iters} "
                            f"for a {self.lr_decay_style} decay")
        return Schedule(self.lr, self.lr_warmup_iters, self.lr_decay_style, self.min_lr, decay, self.clip_grad)
