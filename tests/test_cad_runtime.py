"""CAD plans replayed under torchrun (4 CPU ranks, fp64) train exactly like one process (runtime/cad.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_run_plan import _replay_verified

from hydraplan.core.batch import as_batch
from hydraplan.core.cluster import Cluster
from hydraplan.core.errors import UserError
from hydraplan.engine.cad_plan import cad_plan
from hydraplan.runtime.model import CONFIGS
from hydraplan.runtime.plans import check_plan
from hydraplan.schema import CADPiece, CADSection, CADStep, CADTask, Plan
from hydraplan.solve.cad import best_cad, plan_cad
from hydraplan.store.profiles import load_profile

TINY = CONFIGS["tiny"]


def _planned(lengths: list[int], iteration: int, key: tuple[int, int, int], steps: int) -> Plan:
    # without a network the transfers are free, so the planner moves attention wherever it balances best
    prof = load_profile("cpu-tiny").model_copy(update={"network": None})
    cluster = Cluster.of(prof, 4)
    b = as_batch(np.array(lengths), iteration)
    b = type(b)(iteration=iteration, ids=b.ids + 100 * iteration, lengths=b.lengths)
    r = plan_cad(cluster, cluster.scheme(key), b.lengths, steps, exact=False, ids=b.ids.tolist())
    assert r is not None
    return cad_plan(b, r, cluster)


def _moved(plan: Plan) -> int:
    return sum(t.rank != t.home for s in plan.cad.steps for t in s.tasks)


def _handmade() -> Plan:
    """Replica 3 executes nothing, replica 0 runs a task whose keys sit on all four replicas, and a query
    chunk is split into two tasks run on different replicas."""
    base = _planned([10, 10, 10, 10], 9, (1, 1, 1), 1)
    pieces = [CADPiece(seq=900, start=0, end=9, rank=0), CADPiece(seq=900, start=9, end=14, rank=1),
              CADPiece(seq=900, start=14, end=20, rank=2), CADPiece(seq=901, start=0, end=4, rank=1),
              CADPiece(seq=900, start=20, end=26, rank=3), CADPiece(seq=902, start=0, end=7, rank=2)]
    tasks = [CADTask(seq=900, start=0, end=9, home=0, rank=1), CADTask(seq=900, start=9, end=12, home=1, rank=2),
             CADTask(seq=900, start=12, end=14, home=1, rank=1), CADTask(seq=900, start=14, end=20, home=2, rank=2),
             CADTask(seq=901, start=0, end=4, home=1, rank=0), CADTask(seq=900, start=20, end=26, home=3, rank=0),
             CADTask(seq=902, start=0, end=7, home=2, rank=1)]
    step = CADStep(pieces=pieces, tasks=tasks, compute_s=[0.0] * 4, comm_s=[0.0] * 4, time_s=0.0)
    from hydraplan.schema import BatchSeq, MicroBatch

    plan = base.model_copy(deep=True)
    plan.batch = [BatchSeq(id=900, length=26), BatchSeq(id=901, length=4), BatchSeq(id=902, length=7)]
    for j, p in enumerate(plan.pipelines):
        p.micro_batches = [MicroBatch(seqs=sorted({pc.seq for pc in pieces if pc.rank == j}))]
    plan.cad = CADSection(tp=1, pp=1, cp=1, replicas=4, budget=1.0, steps=[step], estimate_s=0.0)
    return plan


def test_check_plan_refuses_cad_tasks_that_do_not_cover_the_queries():
    plan = _handmade()
    check_plan(plan, "p.json", 4, TINY)
    plan.cad.steps[0].tasks.pop()
    with pytest.raises(UserError, match="tasks"):
        check_plan(plan, "p.json", 4, TINY)


@pytest.mark.slow
def test_cad_plans_train_exactly_like_one_process(tmp_path):
    plans = [
        _planned([60, 9, 25, 6, 17, 3, 30, 12], 0, (1, 1, 1), 1),  # 4 replicas, documents split over replicas
        _planned([41, 8, 5, 22, 13, 7, 19, 2, 11], 1, (1, 1, 1), 2),  # two steps
        _planned([50, 6, 14, 9, 3], 2, (2, 1, 1), 1),  # TP = 2: two exchange groups of two replicas
        _handmade(),
    ]
    assert all(_moved(p) > 0 for p in plans)  # attention really runs away from home
    out, diffs = _replay_verified(tmp_path, plans)
    assert len(diffs) == 4 and max(diffs) <= 1e-9
    balance = re.findall(r"^cad: iteration (\d+) attention imbalance per layer call \(measured max/mean-1\): ([\d. ]+);",
                         out, re.M)
    assert [int(i) for i, _ in balance] == [0, 1, 2, 9]
    assert all(len(b.split()) == TINY.layers * (len(p.cad.steps)) for (_, b), p in zip(balance, plans, strict=True))


def _recomputing(plan: Plan, mode: str) -> Plan:
    plan.cad.recompute = mode
    for p in plan.pipelines:
        p.recompute = mode
    return plan


@pytest.mark.slow
def test_cad_plans_with_recomputation_train_exactly_like_one_process(tmp_path):
    """Full recomputation re-runs the layers' attention exchanges in the backward (all replicas alike);
    selective recomputes the SwiGLU intermediates, with TP 2 (sequence parallel) inside the replicas."""
    plans = [
        _recomputing(_planned([60, 9, 25, 6, 17, 3, 30, 12], 0, (1, 1, 1), 1), "full"),
        _recomputing(_planned([41, 8, 5, 22, 13, 7, 19, 2, 11], 1, (1, 1, 1), 2), "full"),
        _recomputing(_planned([50, 6, 14, 9, 3], 2, (2, 1, 1), 1), "selective"),
        _recomputing(_planned([50, 6, 14, 9, 3], 3, (2, 1, 1), 1), "full"),
    ]
    assert all(_moved(p) > 0 for p in plans)
    _, diffs = _replay_verified(tmp_path, plans)
    assert len(diffs) == 4 and max(diffs) <= 1e-9


def test_best_cad_on_the_tiny_profile_is_valid():
    from hydraplan.app.validate import check_plan as validate_plan

    prof = load_profile("cpu-tiny")
    b = as_batch(np.array([60, 9, 25, 6, 17, 3, 30, 12]))
    r = best_cad(Cluster.of(prof, 4), b.lengths)
    assert r is not None
    plan = cad_plan(b, r, Cluster.of(prof, 4))
    assert validate_plan(plan, prof) == []
