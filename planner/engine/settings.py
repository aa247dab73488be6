"""How the engine plans each batch: the solver settings, one typed object built and validated once."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt, ValidationError

from hydraplan.core.errors import UserError
from hydraplan.core.options import Opt
from hydraplan.solve.dispatch_methods import GREEDY, DispatchName
from hydraplan.solve.dispatch_methods import HELP as DISPATCH_HELP


def _splits(value: Any) -> Any:
    from hydraplan.solve.seqsplit import parse_seq1f1b  # loaded when used: the CLI declares these options at start-up

    return parse_seq1f1b(value) if isinstance(value, str) else value


def _pack_call_limit_s() -> float:
    from hydraplan.solve.packing import DEFAULT_TIME_LIMIT_S

    return DEFAULT_TIME_LIMIT_S


# Seq1F1B: K sub-sequences per micro-batch, or "auto"; given as text ("4"), parsed once, here
Seq1F1B = Annotated[PositiveInt | Literal["auto"] | None, BeforeValidator(_splits)]
# CP-SAT deterministic seconds for all packing of one iteration, shared equally by the candidates: a budget per
# (candidate, pipeline) call instead grows with candidates x pipelines.
ITERATION_PACK_BUDGET_S = 2.0


class PlanSettings(BaseModel):
    """Everything besides the cluster and the candidates that decides a plan. Plans depend only on these,
    the cluster, the candidates and the batch: solver seeds derive from (seed, iteration), never from call
    order or worker count. The fields with an `Opt` are options of `hydraplan pack` (core/options.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dispatch: Annotated[DispatchName, Opt(DISPATCH_HELP)] = GREEDY.name
    seed: Annotated[NonNegativeInt, Opt("sampling and solver seed: same seed, same plans")] = 0
    seq1f1b: Annotated[Seq1F1B, Opt(
        "K|auto: plan Seq1F1B for pp > 1 pipelines (K sub-sequences per micro-batch; raises their MaxLen; plans "
        "record splits and seq1f1b_estimate_s)")] = None
    cp_shard: Annotated[bool, Opt("record adaptive WLB-LLM CP sharding (per-rank token ranges) for cp > 1 pipelines")] = False
    # on by default with either objective: a strategy is dispatched only when the relaxation shows one beating the
    # best candidate (solve/synthesis.py), so it costs one LP on the batches the candidates already serve well
    synthesize: Annotated[bool, Opt(
        "also make strategies for each batch from the any-strategy relaxation when it shows one beating the "
        "candidates (plans marked synthesized; the default), or use only the candidates", off="--candidates-only")] = True
    cad: Annotated[bool, Opt(
        "also plan core-attention disaggregation (DistCA: attention tasks balanced across the replicas of one "
        "homogeneous layout) and keep it in iterations where it is faster; plans record `cad`")] = False
    prune: bool = Field(True, description="abandon a candidate once a lower bound proves it cannot win (same plans)")
    pack_budget_s: PositiveFloat = Field(ITERATION_PACK_BUDGET_S, description="CP-SAT deterministic seconds per iteration")
    pack_time_limit_s: PositiveFloat = Field(default_factory=_pack_call_limit_s,
                                             description="CP-SAT deterministic seconds per pack call")
    pack_rel_gap: PositiveFloat = 1e-3
    refine: Annotated[bool, Opt("skip the local search after dispatch and packing (sequences moved and swapped off the "
                                "slowest pipeline)")] = True
    bound: Annotated[bool, Opt("also compute every batch's any-strategy lower bound: summary.json records bound_s and "
                               "plan / bound (seconds of MILP per iteration)", online=False)] = False
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
