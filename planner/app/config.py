"""One config per command: the options of `propose`, `pack` and `compare` as pydantic models, built once
(by the CLI from its flags, or by a user in Python), validated once, and passed whole. A bad value is one
UserError naming the flag, as the CLI conventions say (app/cliopts.py)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, NonNegativeInt, PositiveInt

from hydraplan.core.cluster import Objective
from hydraplan.job.planrun import RunConfig, build

__all__ = ["PackConfig", "ProposeConfig", "RunConfig", "build"]


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProposeConfig(_Config):
    """`hydraplan propose`."""

    profile: str
    dataset: str
    gpus: PositiveInt
    out: Path
    context_len: PositiveInt | None = None
    gpus_per_node: PositiveInt | None = None
    tokens_per_iter: PositiveInt | None = None
    max_candidates: NonNegativeInt | None = None
    objective: Objective = "end-to-end"


class PackConfig(RunConfig):
    """`hydraplan pack`: the run (job/planrun.py RunConfig: its PackArgs part is what summary.json records and
    `--resume` compares) and where it goes; out, workers and resume only steer this invocation."""

    out: Path
    workers: PositiveInt | None = None
    resume: bool = False
    bound: bool = False  # each batch's any-strategy lower bound in summary.json (does not change the plans)
