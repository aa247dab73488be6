"""Tensor-parallel process groups of the plans' pipelines, created once and reused across iterations."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from planner.schema import Plan


class GroupCache:
    """torch.distributed.new_group is collective over the whole job: every rank walks the plan's stages
    in the same order and creates each missing TP group, even groups it is not part of. A strategy seen
    before creates nothing, so switching strategies between iterations needs no restart."""

    def __init__(self, timeout: timedelta):
        self.timeout = timeout
        self._groups: dict[tuple[int, ...], dist.ProcessGroup] = {}

    def ensure(self, plan: Plan) -> None:
        for p in plan.pipelines:
            span = p.tp * p.cp
            for s in range(p.pp):
                ranks = tuple(p.ranks[s * span:(s + 1) * span])
                if len(ranks) > 1 and ranks not in self._groups:
                    self._groups[ranks] = dist.new_group(list(ranks), timeout=self.timeout)

    def get(self, ranks: tuple[int, ...]) -> dist.ProcessGroup:
        return self._groups[ranks]
