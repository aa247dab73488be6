"""The tensor-, context-parallel and CAD process groups of a run: made once, before the first iteration.

torch.distributed.new_group is collective over the whole job: every rank calls it for every group, in one
global order, and only the members set a communicator up (a non-member's call is tens of microseconds).
`use_local_synchronization`, where only members call, is no way out: the name it gives a group hashes how
many groups the caller already has, so members with different histories wait under different names. So
the runtime walks the whole family once at start-up (solve/placement.py `family`: a few groups per rank
and scheme width) and no plan creates a group later. NCCL would set a communicator up at its first collective,
inside the first iteration that uses it while LNK traffic is in flight on others; so the default group is bound to
the rank's GPU (`init_process_group(device_id=...)`: its communicator made at once, subgroups split from it) and
`warm_up` runs one collective on every group of the run before the first iteration (on gloo too). Pipeline p2p
connections are still made at a pair's first send.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from hydraplan.core.schema import Plan
from hydraplan.solve.placement import process_groups

RankSet = tuple[int, ...]


def plan_cad_groups(plan: Plan) -> list[RankSet]:
    """A CAD plan's exchange groups: the replicas' ranks at each TP rank (runtime/cad.py)."""
    if plan.cad is None:
        return []
    return [tuple(sorted(p.ranks[t] for p in plan.pipelines)) for t in range(plan.pipelines[0].tp)]


def plan_groups(plans: Iterable[Plan]) -> list[RankSet]:
    """Every group these plans use (TP, CP, CAD: more than one rank), in a fixed order."""
    out: set[RankSet] = set()
    for plan in plans:
        out |= process_groups(plan.pipelines)  # type: ignore[arg-type]  # PlanPipeline has PipelineSpec's fields
        out.update(g for g in plan_cad_groups(plan) if len(g) > 1)
    return sorted(out)


class GroupCache:
    """Process groups by rank set. `create` makes a family at start-up (every rank calls new_group for every
    group, in the family's order); `ensure` then only meets what the family lacks (a plan on hand-written
    ranks), created when every rank reaches that plan and counted in `late`."""

    def __init__(self, timeout: timedelta):
        self.timeout = timeout
        self.rank = dist.get_rank()
        self._groups: dict[RankSet, dist.ProcessGroup] = {}
        self._known: set[RankSet] = set()
        self.late = 0

    def create(self, sets: Sequence[RankSet]) -> int:
        """Make every group of `sets` (collective); returns how many this rank belongs to."""
        before = len(self._groups)
        for ranks in sets:
            self._make(ranks)
        return len(self._groups) - before

    def _make(self, ranks: RankSet) -> bool:
        """Create the group if it is new (collective: every rank calls); returns whether it was new."""
        if len(ranks) < 2 or ranks in self._known:
            return False
        self._known.add(ranks)
        group = dist.new_group(list(ranks), timeout=self.timeout)
        if self.rank in ranks:
            self._groups[ranks] = group
        return True

    def ensure(self, plan: Plan) -> None:
        for ranks in plan_groups([plan]):
            self.late += self._make(ranks)

    def get(self, ranks: RankSet) -> dist.ProcessGroup:
        return self._groups[ranks]

    @property
    def mine(self) -> int:
        """Groups this rank belongs to."""
        return len(self._groups)

    def ordered(self) -> list[dist.ProcessGroup]:
        """This rank's groups in the order they were made (one global order)."""
        return list(self._groups.values())


def warm_up(groups: Sequence[dist.ProcessGroup | None], dev: torch.device) -> float:
    """One all-reduce on each group (None: the default group), in the given order, which must be one global
    order (then no two ranks wait for each other crosswise); returns the seconds, device work included."""
    t0 = time.perf_counter()
    one = torch.ones(1, device=dev)
    for group in groups:
        dist.all_reduce(one, group=group)
    one.cpu()
    return time.perf_counter() - t0


def exit_process(code: int) -> NoReturn:
    """End a distributed worker process: flush its output and leave without the interpreter's finalization.

    After the last collective, a gloo worker thread may still hold that collective's work and with it the
    last reference to a tensor; dropping it takes the GIL, and a thread that takes the GIL once finalization
    has begun is unwound inside C++, which aborts the process (SIGABRT, "terminate called without an active
    exception": seen in about one run in fifteen here, results already written). Call after
    dist.destroy_process_group(), as the last thing a worker does."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
