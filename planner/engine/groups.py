"""The process groups a run's plans create, counted in iteration order."""

from __future__ import annotations

from hydraplan.core.schema import PipelineSpec, Plan, Strategies
from hydraplan.solve.placement import place_reusing, process_groups


class GroupLedger:
    """The run's process groups in iteration order, and the rank lists already in use per scheme.

    `pack` re-places each synthesized plan's ranks in the parent, in iteration order, preferring the rank
    lists of the candidates and of earlier plans (ranks never change an estimate), so the run's output does
    not depend on the worker count and a strategy seen before creates no group."""

    def __init__(self, strategies: Strategies, gpus: int, gpus_per_node: int):
        self.known: list[PipelineSpec] = [p for c in strategies.candidates for p in c.pipelines]
        self.groups: set[tuple[int, ...]] = set()
        self.gpus, self.gpus_per_node = gpus, gpus_per_node

    @property
    def created(self) -> int:
        return len(self.groups)

    def record(self, plan: Plan, place: bool = True) -> bool:
        """Count the plan's groups (re-placing its ranks first if it is synthesized and `place`); returns
        whether it is synthesized."""
        specs = [PipelineSpec(tp=p.tp, pp=p.pp, cp=p.cp, recompute=p.recompute, ranks=p.ranks) for p in plan.pipelines]
        if plan.synthesized and place:
            bare = [s.model_copy(update={"ranks": None}) for s in specs]
            specs = place_reusing(bare, self.known, self.gpus, self.gpus_per_node)
            for p, s in zip(plan.pipelines, specs, strict=True):
                p.ranks = list(s.ranks or [])
        if plan.synthesized:
            seen = {(p.key, tuple(p.ranks or ())) for p in self.known}
            self.known += [s for s in specs if (s.key, tuple(s.ranks or ())) not in seen]
        self.groups |= process_groups(specs)
        return bool(plan.synthesized)
