"""One config per command: the options of `propose`, `pack` and `compare` as pydantic models, built once
(by the CLI from its flags, or by a user in Python), validated once, and passed whole. A bad value is one
UserError naming the flag, as the CLI conventions say (app/cliopts.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from hydraplan.core.cluster import Objective, default_synthesize
from hydraplan.core.errors import UserError
from hydraplan.core.schema import PackArgs
from hydraplan.engine.settings import DispatchMethod, PlanSettings
from hydraplan.solve.seqsplit import parse_seq1f1b

C = TypeVar("C", bound=BaseModel)
POSITIVE = {"context_len": "a positive number of tokens"}


def build(cls: type[C], **values: Any) -> C:
    """The config, or a UserError for its first bad value in the CLI's words: `--gpus must be a positive integer
    (got 0)`, `--dispatch must be 'greedy' or 'ilp' (got 'x')`."""
    try:
        return cls(**values)
    except ValidationError as e:
        err = e.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        flag = "--" + field.replace("_", "-")
        got = err.get("input")
        if err["type"] in ("greater_than", "greater_than_equal"):
            raise UserError(f"{flag} must be {POSITIVE.get(field, 'a positive integer')} (got {got})") from None
        if err["type"] == "literal_error":
            raise UserError(f"{flag} must be {err['ctx']['expected']} (got {got!r})") from None
        if err["type"] == "value_error":
            raise UserError(str(err["ctx"]["error"])) from None
        raise UserError(f"{flag}: {err['msg']} (got {got!r})") from None


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


class PackConfig(PackArgs):
    """`hydraplan pack`. Its PackArgs part (`args`) is what summary.json records and `--resume` compares;
    out, iterations, workers and resume only steer this invocation."""

    model_config = ConfigDict(extra="forbid")

    seed: NonNegativeInt = 0
    dispatch: DispatchMethod = "greedy"
    objective: Objective = "end-to-end"
    profile_sha256: str | None = None  # recorded once the profile is loaded (`args`)
    iterations: PositiveInt
    out: Path
    workers: PositiveInt | None = None
    resume: bool = False
    synthesize: bool | None = None  # None: the objective's default (core.cluster.default_synthesize), resolved here
    bound: bool = False  # each batch's any-strategy lower bound in summary.json (does not change the plans)

    @field_validator("strategies", mode="before")
    @classmethod
    def _absolute(cls, v: str | Path | None) -> str | None:
        return None if v is None else str(Path(v).resolve())

    @field_validator("seq1f1b")
    @classmethod
    def _splits(cls, v: str | None) -> str | None:
        if v is not None:
            parse_seq1f1b(v)
        return v

    @model_validator(mode="after")
    def _resolve_defaults(self) -> PackConfig:
        if self.synthesize is None:
            self.synthesize = default_synthesize(self.objective)
        return self

    @property
    def strategies_path(self) -> Path | None:
        return None if self.strategies is None else Path(self.strategies)

    def args(self, profile_sha256: str) -> PackArgs:
        """What summary.json records: the fields that decide the run's plans."""
        recorded = self.model_dump(include=set(PackArgs.model_fields))
        return PackArgs.model_validate({**recorded, "profile_sha256": profile_sha256})

    def settings(self) -> PlanSettings:
        return PlanSettings.model_validate(self.model_dump(include=set(PlanSettings.model_fields)))
