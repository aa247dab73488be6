"""Tensor- and context-parallel process groups of the plans' pipelines, created once and reused across iterations."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import NoReturn

import torch.distributed as dist

from hydraplan.core.schema import Plan


class GroupCache:
    """torch.distributed.new_group is collective over the whole job: every rank walks the plan's stages
    in the same order and creates each missing TP group (a stage's ranks at one CP rank) and CP group (its
    ranks at one TP rank), even groups it is not part of. A strategy seen before creates nothing, so
    switching strategies between iterations needs no restart."""

    def __init__(self, timeout: timedelta):
        self.timeout = timeout
        self._groups: dict[tuple[int, ...], dist.ProcessGroup] = {}

    def ensure(self, plan: Plan) -> None:
        for p in plan.pipelines:
            for s in range(p.pp):
                stage = p.ranks[s * p.tp * p.cp:(s + 1) * p.tp * p.cp]  # CP-major, TP fastest
                tp_groups = [tuple(stage[c * p.tp:(c + 1) * p.tp]) for c in range(p.cp)]
                cp_groups = [tuple(stage[t::p.tp]) for t in range(p.tp)]
                for ranks in tp_groups + cp_groups:
                    if len(ranks) > 1 and ranks not in self._groups:
                        self._groups[ranks] = dist.new_group(list(ranks), timeout=self.timeout)
        if plan.cad is not None:  # the replicas' ranks at each TP rank exchange attention tasks (runtime/cad.py)
            for t in range(plan.pipelines[0].tp):
                ranks = tuple(sorted(p.ranks[t] for p in plan.pipelines))
                if ranks not in self._groups:
                    self._groups[ranks] = dist.new_group(list(ranks), timeout=self.timeout)

    def get(self, ranks: tuple[int, ...]) -> dist.ProcessGroup:
        return self._groups[ranks]


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
