"""CAD plans replayed under torchrun (4 CPU ranks, fp64) train exactly like one process (runtime/cad.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from test_run_plan import _replay_verified

from hydraplan.core.batch import as_batch
from hydraplan.core.cluster import Cluster
from hydraplan.core.errors import UserError
from hydraplan.engine.cad_plan import cad_plan
from hydraplan.runtime.model import CONFIGS
from hydraplan.runtime.plan_roles import check_plan
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


def _recomputing(plan: Plan, mode: str) -> Plan:
    plan.cad.recompute = mode
    for p in plan.pipelines:
        p.recompute = mode
    return plan


@pytest.mark.slow
def test_cad_plans_train_exactly_like_one_process(tmp_path):
    """One job replays, without recomputation (iterations 0-2 and 9): 4 replicas with documents split over them,
    two steps, TP 2 (two exchange groups of two replicas) and the handmade plan; then with recomputation
    (iterations 10-13): full re-runs each layer's projections, output projection and MLP around its attention
    exchanges in the backward (the ping-pong keeps what the exchanges delivered); selective recomputes the
    SwiGLU intermediates, with TP 2 (sequence parallel) inside the replicas."""
    plain = [
        _planned([60, 9, 25, 6, 17, 3, 30, 12], 0, (1, 1, 1), 1),  # 4 replicas, documents split over replicas
        _planned([41, 8, 5, 22, 13, 7, 19, 2, 11], 1, (1, 1, 1), 2),  # two steps
        _planned([50, 6, 14, 9, 3], 2, (2, 1, 1), 1),  # TP = 2: two exchange groups of two replicas
        _handmade(),
    ]
    recomputed = [
        _recomputing(_planned([60, 9, 25, 6, 17, 3, 30, 12], 10, (1, 1, 1), 1), "full"),
        _recomputing(_planned([41, 8, 5, 22, 13, 7, 19, 2, 11], 11, (1, 1, 1), 2), "full"),
        _recomputing(_planned([50, 6, 14, 9, 3], 12, (2, 1, 1), 1), "selective"),
        _recomputing(_planned([50, 6, 14, 9, 3], 13, (2, 1, 1), 1), "full"),
    ]
    assert all(_moved(p) > 0 for p in plain + recomputed)  # attention really runs away from home
    out, diffs = _replay_verified(tmp_path, plain + recomputed)
    assert len(diffs) == 8 and max(diffs) <= 1e-9
    balance = re.findall(r"^cad: iteration (\d+) attention imbalance per layer call \(measured max/mean-1\): ([\d. ]+);",
                         out, re.M)[:4]
    assert [int(i) for i, _ in balance] == [0, 1, 2, 9]
    assert all(len(b.split()) == TINY.layers * (len(p.cad.steps)) for (_, b), p in zip(balance, plain, strict=True))


def test_best_cad_on_the_tiny_profile_is_valid():
    from hydraplan.app.validate import check_plan as validate_plan

    prof = load_profile("cpu-tiny")
    b = as_batch(np.array([60, 9, 25, 6, 17, 3, 30, 12]))
    r = best_cad(Cluster.of(prof, 4), b.lengths)
    assert r is not None
    plan = cad_plan(b, r, Cluster.of(prof, 4))
    assert validate_plan(plan, prof) == []


# ------------------------------------------------------------------ the exchange plans against brute force
def _reference_check(plan: Plan) -> bool:
    """Token by token, what check_cad must accept: every task's queries on its home, its key prefix held in
    the step, and the tasks covering every held token's query exactly once."""
    d = plan.cad.replicas
    for step in plan.cad.steps:
        if any(not 0 <= pc.rank < d for pc in step.pieces) or any(not (0 <= t.rank < d and 0 <= t.home < d)
                                                                   for t in step.tasks):
            return False
        tokens = [(pc.seq, p) for pc in step.pieces for p in range(pc.start, pc.end)]
        held = {(pc.seq, p): pc.rank for pc in step.pieces for p in range(pc.start, pc.end)}
        if len(held) != len(tokens) or {pc.rank for pc in step.pieces} != set(range(d)):
            return False
        for t in step.tasks:
            if any(held.get((t.seq, p)) != t.home for p in range(t.start, t.end)):
                return False
            if any((t.seq, p) not in held for p in range(t.end)):
                return False
        if sorted((t.seq, p) for t in step.tasks for p in range(t.start, t.end)) != sorted(held):
            return False
    return True


def _broken(plan: Plan, rng: np.random.Generator) -> Plan:
    """The plan with one random defect (or none)."""
    out = plan.model_copy(deep=True)
    step = out.cad.steps[int(rng.integers(len(out.cad.steps)))]
    kind = int(rng.integers(5))
    if kind == 0 and step.tasks:
        step.tasks.pop(int(rng.integers(len(step.tasks))))
    elif kind == 1:
        t = step.tasks[int(rng.integers(len(step.tasks)))]
        t.home = (t.home + 1) % out.cad.replicas
    elif kind == 2:
        pc = step.pieces[int(rng.integers(len(step.pieces)))]
        pc.rank = (pc.rank + 1) % out.cad.replicas
    elif kind == 3:
        t = step.tasks[int(rng.integers(len(step.tasks)))]
        if t.end - t.start > 1:
            t.end -= 1
    return out


@pytest.mark.parametrize("seed", range(8))
def test_check_cad_agrees_with_the_token_by_token_check(seed):
    from hydraplan.runtime.cad import check_cad

    rng = np.random.default_rng(seed)
    base = _planned(rng.integers(2, 60, size=int(rng.integers(4, 12))).tolist(), seed, (1, 1, 1), int(rng.integers(1, 3)))
    for plan in [base, _handmade()] + [_broken(base, rng) for _ in range(12)]:
        assert (check_cad(plan, "p.json") is None) == _reference_check(plan)


def _local_tokens(step_pieces, replica: int) -> list[tuple[int, int]]:
    return [(int(s), p) for s, a, b, r in step_pieces if r == replica for p in range(int(a), int(b))]


@pytest.mark.parametrize("seed", range(6))
def test_exchange_plans_deliver_each_task_its_queries_and_key_window_and_bring_outputs_home(seed):
    """Every replica's exchange plan of every half (runtime/cad.py half_context), routed through an in-memory
    all_to_all of token labels: an executor receives exactly the Q of its tasks' queries and picks exactly each
    task's key window [0, e) out of the K/V it received, K/V rows never repeat per source and executor, and
    outputs come back to the rows of their tokens on the home replica."""
    from hydraplan.runtime.cad import StepArrays, half_context, halves

    rng = np.random.default_rng(seed)
    plan = _planned(rng.integers(2, 70, size=int(rng.integers(5, 14))).tolist(), seed, (1, 1, 1), 2)
    d = plan.cad.replicas
    group = [int(x) for x in rng.permutation(d)]  # the replica of each group rank: any order
    for step in plan.cad.steps:
        a = StepArrays.of(step)
        parts = halves(a, d)
        assert sorted(int(s) for h in parts for s in h) == sorted({pc.seq for pc in step.pieces})
        for seqs in parts:
            h = a.subset(seqs)
            pieces = list(zip(h.p_seq, h.p_start, h.p_end, h.p_rank))
            ctx = {r: half_context(h, r, group, None) for r in range(d)}
            local = {r: _local_tokens(pieces, r) for r in range(d)}
            sent = {}
            for r, c in ctx.items():
                q = [local[r][i] for i in c.q_send.tolist()]
                kv = [local[r][i] for i in c.kv_send.tolist()]
                qo = np.cumsum([0] + c.q_send_counts)
                ko = np.cumsum([0] + c.kv_send_counts)
                for g, dst in enumerate(group):
                    sent[r, dst] = (q[qo[g]:qo[g + 1]], kv[ko[g]:ko[g + 1]])
                    assert len(set(sent[r, dst][1])) == len(sent[r, dst][1])
            for r, c in ctx.items():
                q_recv = [t for src in group for t in sent[src, r][0]]
                kv_recv = [t for src in group for t in sent[src, r][1]]
                assert [len(sent[src, r][0]) for src in group] == c.q_recv_counts
                assert [len(sent[src, r][1]) for src in group] == c.kv_recv_counts
                mine = sorted((i for i in range(len(h.t_seq)) if h.t_rank[i] == r), key=lambda i: group.index(h.t_home[i]))
                assert q_recv == [(int(h.t_seq[i]), p) for i in mine for p in range(h.t_start[i], h.t_end[i])]
                assert [kv_recv[i] for i in c.k_index.tolist()] == [(int(h.t_seq[i]), p) for i in mine
                                                                    for p in range(h.t_end[i])]
                assert torch.diff(c.windows.cu_q).tolist() == [int(h.t_end[i] - h.t_start[i]) for i in mine]
                assert torch.diff(c.windows.cu_k).tolist() == [int(h.t_end[i]) for i in mine]
                oo = np.cumsum([0] + c.out_send_counts)
                sent[r, "out"] = {dst: q_recv[oo[g]:oo[g + 1]] for g, dst in enumerate(group)}
            for r, c in ctx.items():
                came = [t for ex in group for t in sent[ex, "out"][r]]
                assert [came[i] for i in c.out_place.tolist()] == local[r]
