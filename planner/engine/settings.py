"""How the engine plans each batch: the solver settings, one typed object built and validated once."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt, ValidationError

from hydraplan.core.errors import UserError
from hydraplan.solve.dispatch_methods import GREEDY, DispatchName
from hydraplan.solve.dispatch_methods import HELP as DISPATCH_HELP
from hydraplan.solve.packing import DEFAULT_TIME_LIMIT_S

# CP-SAT deterministic seconds for all packing of one iteration, shared equally by the candidates: a budget per
# (candidate, pipeline) call instead grows with candidates x pipelines.
ITERATION_PACK_BUDGET_S = 2.0


class PlanSettings(BaseModel):
    """Everything besides the cluster and the candidates that decides a plan. Plans depend only on these,
    the cluster, the candidates and the batch: solver seeds derive from (seed, iteration), never from call
    order or worker count."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dispatch: DispatchName = Field(GREEDY.name, description=DISPATCH_HELP)
    seed: NonNegativeInt = 0
    seq1f1b: str | None = Field(None, description="K|auto: Seq1F1B splits for pp > 1 pipelines (raises their MaxLen)")
    cp_shard: bool = Field(False, description="record WLB-LLM adaptive CP sharding for cp > 1 pipelines")
    # on by default with either objective: a strategy is dispatched only when the relaxation shows one beating the
    # best candidate (solve/synthesis.py), so it costs one LP on the batches the candidates already serve well
    synthesize: bool = Field(True, description="also make a strategy for each batch")
    cad: bool = Field(False, description="also plan core-attention disaggregation, kept when faster")
    prune: bool = Field(True, description="abandon a candidate once a lower bound proves it cannot win (same plans)")
    pack_budget_s: PositiveFloat = Field(ITERATION_PACK_BUDGET_S, description="CP-SAT deterministic seconds per iteration")
    pack_time_limit_s: PositiveFloat = Field(DEFAULT_TIME_LIMIT_S, description="CP-SAT deterministic seconds per pack call")
    pack_rel_gap: PositiveFloat = 1e-3
    refine: bool = Field(True, description="local search after dispatch and packing on plans that can still win")
    bound: bool = Field(False, description="also compute the batch's any-strategy lower bound (summary bound_s)")
    refine_steps: PositiveInt = Field(200, description="kept changes per local search (deterministic work cap)")
    dispatch_trials: PositiveInt = 32
    dispatch_time_limit_s: PositiveFloat = 10.0

    @classmethod
    def of(cls, options: dict[str, Any]) -> PlanSettings:
        """Settings from keyword options (the `Planner(...)` keywords); a bad one is a UserError naming it."""
        try:
            return cls(**options)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise UserError(f"Planner: option {where}: {first['msg']} (got {first.get('input')!r})") from None
