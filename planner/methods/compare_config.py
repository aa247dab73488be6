"""`hydraplan compare`'s config, apart from the comparison so that the command line can declare its options
(core/options.py) without loading the methods."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt

from hydraplan.core.options import ContextLen, DatasetName, Gpus, ObjectiveOpt, Opt, ProfileName, TokensPerIter


class CompareConfig(BaseModel):
    """`hydraplan compare`: built once (by the CLI or in Python), validated once (app.config.build for the CLI's
    one-line errors)."""

    model_config = ConfigDict(extra="forbid")

    profile: ProfileName
    dataset: DatasetName
    gpus: Gpus
    tokens_per_iter: TokensPerIter
    iterations: Annotated[PositiveInt, Opt("iterations to sample and compare")]
    context_len: ContextLen = None
    seed: Annotated[NonNegativeInt, Opt("sampling and solver seed")] = 0
    methods: tuple[str, ...] | None = Field(None, description="None: every method")
    wlb_queues: PositiveInt = 2
    switch_bandwidth_gbs: PositiveFloat = 50.0
    objective: ObjectiveOpt = "end-to-end"
