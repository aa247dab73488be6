"""One config per command: the options of `propose`, `pack` and `compare` as pydantic models, built once
(by the CLI from its flags, or by a user in Python), validated once, and passed whole. A field with an `Opt`
(core/options.py) is the command's option: its flag, type, default and help come from here (app/cliopts.py
`config_command`). A bad value is one UserError naming the flag, as the CLI conventions say (app/cliopts.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, NonNegativeInt, PositiveInt

from hydraplan.core.options import ContextLen, DatasetName, Gpus, ObjectiveOpt, Opt, ProfileName
from hydraplan.job.config import RunConfig, build

__all__ = ["PackConfig", "ProposeConfig", "RunConfig", "build"]


class ProposeConfig(BaseModel):
    """`hydraplan propose`."""

    model_config = ConfigDict(extra="forbid")

    profile: ProfileName
    dataset: DatasetName
    gpus: Gpus
    out: Annotated[Path, Opt("strategies file to write (hydraplan.strategies/v1)")]
    context_len: ContextLen = None
    gpus_per_node: Annotated[PositiveInt | None, Opt("node size for rank placement (default: the profile's)")] = None
    tokens_per_iter: Annotated[PositiveInt | None, Opt("nominal batch the expected cost is taken on (default: 4096 "
                                                       "per GPU)")] = None
    max_candidates: Annotated[NonNegativeInt | None, Opt(
        "keep at most this many candidates, preferring the L' ranges that most often hold an iteration's longest "
        "sequence (0: all; default: all while candidates x sequences per iteration stay within a budget, so fewer "
        "only at thousands of GPUs)")] = None
    objective: ObjectiveOpt = "end-to-end"


class PackConfig(RunConfig):
    """`hydraplan pack`: the run (job/config.py RunConfig: what summary.json records and `--resume` compares)
    and where it goes; out, workers, resume and bound only steer this invocation (bound is a planner setting
    that never changes a plan)."""

    out: Annotated[Path, Opt("run folder: iter_NNNNNN.json (or .parquet), strategies.json, summary.json")]
    workers: Annotated[PositiveInt | None, Opt("solver processes (default: the core count); never changes a plan")] = None
    resume: Annotated[bool, Opt("continue an interrupted run (same arguments required)")] = False
    format: Annotated[Literal["json", "compact"], Opt(
        "plan files: json (readable) or compact (Parquet, iter_NNNNNN.parquet: a tenth of the bytes at thousands of "
        "GPUs; docs/formats.md)")] = "json"
