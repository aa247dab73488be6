"""The process groups of a run: the family its runtime creates at start-up, and the groups its plans use."""

from __future__ import annotations

from collections.abc import Iterable

from hydraplan.core.schema import Plan
from hydraplan.solve.placement import family, groups_per_rank, process_groups


class GroupLedger:
    """The family of TP and CP groups a run can use (placement's aligned blocks, for every scheme its
    strategies can take: solve/placement.py), which the runtime creates once before the first iteration,
    and in iteration order the groups its plans use. Groups outside the family (pipelines on hand-written
    ranks) are the only ones a runtime creates later, when a plan first needs them."""

    def __init__(self, keys: Iterable[tuple], gpus: int):
        self.family = family(keys, gpus)
        self.per_rank = int(groups_per_rank(self.family, gpus).max(initial=0))
        self._family = set(self.family)
        self.groups: set[tuple[int, ...]] = set()

    @property
    def created(self) -> int:
        """Distinct groups the plans recorded so far use."""
        return len(self.groups)

    @property
    def outside(self) -> int:
        """Of them, those the family lacks."""
        return len(self.groups - self._family)

    def record(self, plan: Plan) -> bool:
        """Count the plan's groups; returns whether its strategy was made for its batch."""
        self.groups |= process_groups(plan.pipelines)  # type: ignore[arg-type]  # PlanPipeline has PipelineSpec's fields
        return bool(plan.synthesized)
