"""A planned run's configuration, declared once: `RunConfig` holds what decides a run's plans (its PackArgs
record, which summary.json keeps and `--resume` compares) with the planner's settings nested as `plan`
(engine/settings.py PlanSettings). Each field's `Opt` makes it an option of `hydraplan pack` and of the
runtime's planning while training (core/options.py), so adding an option is one field here or there.

Validation happens here, once: `build` turns flat option values into the typed config (`seq1f1b` into K or
"auto", `synthesize` left to its default when neither flag is given), or one UserError naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator

from hydraplan.core.errors import UserError
from hydraplan.core.options import ContextLen, DatasetName, Gpus, ObjectiveOpt, Opt, ProfileName, TokensPerIter, nest
from hydraplan.engine.settings import PlanSettings

if TYPE_CHECKING:  # loaded when used: declaring the options (`hydraplan --help`) loads no file model
    from hydraplan.core.schema import PackArgs

C = TypeVar("C", bound=BaseModel)
POSITIVE = {"context_len": "a positive number of tokens"}


def build(cls: type[C], **values: Any) -> C:
    """The config, or a UserError about its first bad value, naming the field (`gpus must be a positive integer
    (got 0)`, `dispatch must be 'greedy' or 'ilp' (got 'x')`), which a command line shows as its flag
    (core/errors.py cli_message). A value of None is an option not given: the model's default."""
    from hydraplan.core.cluster import MAX_GPUS

    gpus = values.get("gpus")
    if isinstance(gpus, int) and gpus > MAX_GPUS:
        raise UserError(f"gpus must be at most {MAX_GPUS:,}, the largest size benchmarked (got {gpus:,})", "gpus")
    try:
        return cls(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as e:
        err = e.errors()[0]
        if err["type"] == "value_error":
            raise UserError(str(err["ctx"]["error"])) from None
        field = str(err["loc"][-1])  # the option: the innermost name of a nested field
        got = err.get("input")
        if err["type"] in ("greater_than", "greater_than_equal"):
            raise UserError(f"{field} must be {POSITIVE.get(field, 'a positive integer')} (got {got})", field) from None
        if err["type"] == "literal_error":
            raise UserError(f"{field} must be {err['ctx']['expected']} (got {got!r})", field) from None
        raise UserError(f"{field}: {err['msg']} (got {got!r})", field) from None


class RunConfig(BaseModel):
    """A run's plans: every field but `iterations` is recorded (`args`); `iterations` says how many (the last
    one drains any outlier queue). `pack` adds its output options (app/config.py PackConfig). Built from flat
    options (`RunConfig(profile=..., seq1f1b="4")`): the planner's settings land in `plan`."""

    model_config = ConfigDict(extra="forbid")

    profile: ProfileName
    dataset: DatasetName
    gpus: Gpus
    tokens_per_iter: TokensPerIter
    iterations: Annotated[PositiveInt, Opt("iterations to plan", online=False)]
    strategies: Annotated[Path | None, Opt(
        "candidates (ranks optional); default: propose them. The static baseline's homogeneous layout joins as "
        "candidate 'static' unless present; the run's set is written to OUT/strategies.json")] = None
    context_len: ContextLen = None
    outlier_delay: Annotated[bool, Opt(
        "queue the rare long sequences and train them together once they hold an iteration's tokens (WLB-LLM "
        "outlier delay; plans record sampled_iteration, all drained by the last iteration)")] = False
    objective: ObjectiveOpt = "end-to-end"
    static: Annotated[bool, Opt("do not add the static baseline's layout as candidate 'static' (so a hand-written "
                                "--strategies file is used as given)")] = True
    plan: PlanSettings = Field(default_factory=PlanSettings)

    @model_validator(mode="before")
    @classmethod
    def _nested(cls, values: Any) -> Any:
        return nest(cls, values) if isinstance(values, dict) else values

    @field_validator("strategies")
    @classmethod
    def _absolute(cls, v: Path | None) -> Path | None:
        return None if v is None else v.resolve()

    @property
    def seed(self) -> int:
        """The sampling seed, which is also the solvers' (plan.seed)."""
        return self.plan.seed

    def args(self, profile_sha256: str) -> PackArgs:
        """What summary.json records: the fields that decide the run's plans, as text where a file keeps text."""
        from hydraplan.core.schema import PackArgs

        flat = {**self.model_dump(exclude={"plan"}), **self.plan.model_dump()}
        flat.update(strategies=None if self.strategies is None else str(self.strategies),
                    seq1f1b=None if self.plan.seq1f1b is None else str(self.plan.seq1f1b), profile_sha256=profile_sha256)
        return PackArgs.model_validate({k: v for k, v in flat.items() if k in PackArgs.model_fields})
