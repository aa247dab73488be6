"""Seq1F1B executor: split attention against full attention, gradients against unsplit training (fp64,
stages run in one process in the schedule's dependency order), live activations against the schedule's
prediction, plan checks, and a real torchrun replay of a Seq1F1B plan with --verify."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from ranks import launch

from hydraplan.core.errors import UserError
from hydraplan.core.schedules import check_schedule, schedule_seq1f1b
from hydraplan.runtime.attention import varlen_attention
from hydraplan.runtime.batches import TokenData
from hydraplan.runtime.model import CONFIGS, StageModule, init_full, load_full, param_specs
from hydraplan.runtime.seq1f1b import Seq1F1BStage, cached_attention, check_splits, p2p_batches, run_in_process, split_views
from hydraplan.schema import BatchSeq, Estimate, MicroBatch, Plan, PlanPipeline
from hydraplan.solve.seqsplit import computation_splits
from hydraplan.store.fileio import write_model

TINY = CONFIGS["tiny"]
DT = torch.float64


def make_plan(iteration: int, pipelines, gpus: int = 4, first_id: int = 0, splits=None) -> Plan:
    """pipelines: (tp, pp, ranks, micro-batches as lists of lengths); splits: per pipeline, per
    micro-batch offsets (or None for plain 1F1B). Sequence ids are numbered from first_id."""
    batch, out, sid = [], [], first_id
    for n, (tp, pp, ranks, mbs) in enumerate(pipelines):
        micro = []
        for j, lengths in enumerate(mbs):
            sp = None if splits is None or splits[n] is None else splits[n][j]
            micro.append(MicroBatch(seqs=list(range(sid, sid + len(lengths))), splits=sp))
            batch += [BatchSeq(id=sid + k, length=x) for k, x in enumerate(lengths)]
            sid += len(lengths)
        out.append(PlanPipeline(tp=tp, pp=pp, cp=1, ranks=ranks, micro_batches=micro, estimate_s=0.0))
    return Plan(iteration=iteration, profile="cpu-tiny", gpus=gpus, batch=batch, strategy="Q", pipelines=out,
                estimate=Estimate(propagation_s=0.0))


def packed(mb_lengths: list[list[int]]):
    data, sid, out = TokenData(TINY.vocab), 0, []
    for lengths in mb_lengths:
        out.append(data.pack([BatchSeq(id=sid + i, length=n) for i, n in enumerate(lengths)]))
        sid += len(lengths)
    return out


def full_params():
    return [init_full(s, i, 7, DT) for i, s in enumerate(param_specs(TINY))]


# ------------------------------------------------------------------------------------- attention
@pytest.mark.parametrize("lengths,bounds", [
    ([5, 9, 3], [0, 7, 11, 17]),        # doc 1 crosses two boundaries
    ([17], [0, 2, 3, 10, 17]),          # one document, four splits
    ([4, 4, 4], [0, 4, 8, 12]),         # boundaries on document edges: no cached context used
    ([6, 2], [0, 3, 3, 8]),             # an empty split
])
def test_split_attention_equals_full_causal_attention(lengths, bounds):
    gen = torch.Generator().manual_seed(1)
    T, H, D = sum(lengths), 2, 4
    q, k, v = (torch.randn(T, H, D, generator=gen, dtype=DT, requires_grad=True) for _ in range(3))
    mb = packed([lengths])[0]
    full = varlen_attention(q, k, v, mb.cu_seqlens, mb.max_seqlen)
    parts = []
    for view in split_views(mb, bounds):
        assert view.tokens == view.hi - view.lo
        if view.tokens:
            parts.append(cached_attention(q[view.lo:view.hi], k[view.key_lo:view.hi], v[view.key_lo:view.hi], view))
    split = torch.cat(parts)
    torch.testing.assert_close(split, full, rtol=0, atol=1e-12)
    w = torch.randn(T, H, D, generator=gen, dtype=DT)
    g_full = torch.autograd.grad((full * w).sum(), (q, k, v))
    g_split = torch.autograd.grad((split * w).sum(), (q, k, v))
    for a, b in zip(g_split, g_full):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_split_views_key_window_starts_at_the_crossing_document():
    views = split_views(packed([[5, 9, 3]])[0], [0, 7, 11, 17])
    assert [(v.lo, v.hi, v.key_lo) for v in views] == [(0, 7, 0), (7, 11, 5), (11, 17, 5)]
    # split 2 holds the last 3 tokens of doc 1 (keys: all 9 of it) and doc 2 whole
    assert views[2].cu_q.tolist() == [0, 3, 6] and views[2].cu_k.tolist() == [0, 9, 12]
    assert views[2].batch.positions.tolist() == [6, 7, 8, 0, 1, 2]


# ------------------------------------------------------------------------------- pipeline, 1 proc
def run_stages(P: int, mbs, splits, loss_scale: float, full, recompute: str = "none"):
    stages = []
    for r in range(P):
        mod = StageModule(TINY, pp=P, stage=r, dtype=DT, recompute=recompute)
        load_full(mod, full)
        stages.append(Seq1F1BStage(mod, mbs, splits, loss_scale))
    run_in_process(stages)
    return stages


def reference_grads(mbs, loss_scale, full):
    mod = StageModule(TINY, dtype=DT)
    load_full(mod, full)
    loss = sum(mod(None, mb) * loss_scale for mb in mbs)
    loss.backward()
    return {n: p.grad for n, p in mod.named_parameters()}, float(loss.detach())


CASES = [
    # (P, micro-batch documents, K)
    (2, [[7, 5, 9], [12, 4], [6, 6, 3]], 2),
    (2, [[11, 8], [3, 14, 2]], 3),
    (2, [[9, 9, 2], [20]], 4),
    (4, [[7, 5, 9], [12, 4], [6, 6, 3], [10, 1], [5, 13]], 2),
    (4, [[11, 8], [3, 14, 2], [16]], 3),
    (4, [[9, 9, 2], [20], [4, 4, 4, 5], [13, 6]], 4),
]


@pytest.mark.parametrize("P,docs,K,recompute", [(*c, "none") for c in CASES]
                         + [(*CASES[1], "selective"), (*CASES[4], "full"), (*CASES[2], "full")])
def test_seq1f1b_gradients_equal_unsplit_training(P, docs, K, recompute):
    """Also under selective and full recomputation (the cached K/V of earlier splits kept, a layer re-run)."""
    full = full_params()
    mbs = packed(docs)
    # computation-wise splits (the planner's), cost weights chosen so boundaries cut documents
    splits = [computation_splits(np.array(d), 0.02, 1.0, K).bounds.tolist() for d in docs]
    cut = [b for d, sp in zip(docs, splits) for b in sp[1:-1] if b not in np.cumsum(d)]
    assert cut, "the case must cut documents"
    scale = 1.0 / sum(map(sum, docs))
    stages = run_stages(P, mbs, splits, scale, full, recompute)
    want, want_loss = reference_grads(mbs, scale, full)
    for st in stages:
        assert st.live == 0  # every activation and K/V stash released
        for name, p in st.module.named_parameters():
            torch.testing.assert_close(p.grad, want[name], rtol=0, atol=1e-12, msg=name)
    assert float(stages[-1].loss) == pytest.approx(want_loss, rel=1e-12)


@pytest.mark.parametrize("P,docs,K", CASES)
def test_live_activations_follow_the_schedule(P, docs, K):
    splits = [computation_splits(np.array(d), 0.02, 1.0, K).bounds.tolist() for d in docs]
    stages = run_stages(P, packed(docs), splits, 1.0, full_params())
    predicted = check_schedule(schedule_seq1f1b(P, len(docs), K)).peak_live
    assert [st.peak_live for st in stages] == predicted
    assert predicted[0] == min(P - 1 + K, len(docs) * K)  # seq1f1b.txt Eq. (4) warm-up + 1


def test_an_empty_split_is_skipped_consistently():
    docs = [[2, 1], [9]]
    splits = [[0, 1, 3, 3], [0, 3, 6, 9]]
    full = full_params()
    mbs = packed(docs)
    stages = run_stages(2, mbs, splits, 0.1, full)
    want, _ = reference_grads(mbs, 0.1, full)
    for st in stages:
        for name, p in st.module.named_parameters():
            torch.testing.assert_close(p.grad, want[name], rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------- communication
def rendezvous_deadlocks(batches_per_stage) -> bool:
    """Run every stage's p2p batches where a batch completes only once every peer posted the matching
    operation (NCCL-like: a send waits for its receive). True if the stages get stuck."""
    P = len(batches_per_stage)
    ptr, posted = [0] * P, set()
    while True:
        for r in range(P):
            if ptr[r] < len(batches_per_stage[r]):
                posted |= {(t.send, r, t.peer, t.tag) for t in batches_per_stage[r][ptr[r]]}
        moved = False
        for r in range(P):
            if ptr[r] < len(batches_per_stage[r]) and all(
                    (not t.send, t.peer, r, t.tag) in posted for t in batches_per_stage[r][ptr[r]]):
                ptr[r] += 1
                moved = True
        if all(ptr[r] == len(batches_per_stage[r]) for r in range(P)):
            return False
        if not moved:
            return True


def stage_batches(P, M, K, empty=frozenset()):
    sched = schedule_seq1f1b(P, M, K)
    tokens = lambda m, s: 0 if (m, s) in empty else 5  # noqa: E731
    return [p2p_batches(sched.stages[r], r, P, K, tokens) for r in range(P)]


@pytest.mark.parametrize("P", [1, 2, 3, 4, 6, 8])
def test_p2p_batches_never_deadlock_even_when_sends_wait_for_receives(P):
    for M in range(1, 11):
        for K in range(1, 5):
            assert not rendezvous_deadlocks(stage_batches(P, M, K)), (P, M, K)
    assert not rendezvous_deadlocks(stage_batches(P, 4, 3, empty={(1, 2), (3, 0)}))


def test_the_deadlock_check_catches_unpaired_blocking_sends():
    one_op_each = [[[t] for batch in st for t in batch] for st in stage_batches(2, 4, 2)]
    assert rendezvous_deadlocks(one_op_each)


def test_p2p_batches_pair_each_send_with_the_next_receive():
    sched = schedule_seq1f1b(2, 2, 2)
    b = p2p_batches(sched.stages[1], 1, 2, 2, lambda m, s: 5)
    # last stage: F0.0 F0.1 B0.1 F1.0 B0.0 F1.1 B1.1 B1.0 -> receives activations, sends gradients back
    assert [[(t.send, t.tag) for t in x] for x in b] == [
        [(False, 0)], [(False, 2)], [], [(True, 3), (False, 4)], [], [(True, 1), (False, 6)], [], [(True, 7)], [(True, 5)]]
    assert all(t.peer == 0 for x in b for t in x)


# ------------------------------------------------------------------------------------- plan checks
@pytest.mark.parametrize("splits,message", [
    ([[0, 3, 9], None], ": .*same K"),
    ([[0, 3, 9], [0, 2, 4, 5]], ": .*same K"),
    ([[0, 3, 8], [0, 2, 5]], r"\.0\.splits: \[0, 3, 8\] is not"),
    ([[0, 5, 3, 9], [0, 2, 4, 5]], r"\.0\.splits: \[0, 5, 3, 9\] is not"),
    ([[0, 3, 9], [1, 2, 5]], r"\.1\.splits: \[1, 2, 5\] is not"),
])
def test_check_splits_names_the_bad_field(splits, message):
    plan = make_plan(0, [(1, 2, [0, 1], [[4, 5], [5]])], gpus=2, splits=[splits])
    with pytest.raises(UserError, match=rf"^p\.json: field pipelines\.0\.micro_batches{message}"):
        check_splits(plan, "p.json")


def test_check_splits_accepts_planner_splits():
    plan = make_plan(0, [(1, 2, [0, 1], [[4, 5], [5]])], gpus=2, splits=[[[0, 3, 9], [0, 2, 5]]])
    check_splits(plan, "p.json")


# ----------------------------------------------------------------------------------------- four ranks
@pytest.mark.slow
def test_four_ranks_replay_seq1f1b_plans_exactly(tmp_path):
    """run_plan on 4 ranks (as torchrun starts them: tests/ranks.py): Seq1F1B on <1,4,1> with K = 3; two <1,2,1>
    with K = 2 and 4; <2,2,1> (TP inside the stages); Seq1F1B next to a plain 1F1B pipeline."""
    plans = [
        make_plan(0, [(1, 4, [0, 1, 2, 3], [[7, 5, 9], [12, 4], [6, 6, 3], [10, 1], [5, 13]])],
                  splits=[[[0, 10, 15, 21], [0, 6, 11, 16], [0, 7, 12, 15], [0, 5, 8, 11], [0, 7, 13, 18]]]),
        make_plan(1, [(1, 2, [2, 0], [[11, 8], [3, 14, 2]]), (1, 2, [1, 3], [[9, 9, 2], [20]])], first_id=100,
                  splits=[[[0, 12, 19], [0, 9, 19]], [[0, 8, 12, 16, 20], [0, 9, 13, 17, 20]]]),
        make_plan(2, [(2, 2, [0, 1, 2, 3], [[6, 6], [9], [5, 2]])], first_id=200,
                  splits=[[[0, 7, 12], [0, 5, 9], [0, 4, 7]]]),
        make_plan(3, [(1, 2, [0, 1], [[6, 6], [9]]), (1, 2, [2, 3], [[4, 4], [8]])], first_id=300,
                  splits=[[[0, 7, 12], [0, 5, 9]], None]),
    ]
    for p in plans:
        write_model(tmp_path / f"iter_{p.iteration:06d}.json", p)
    res = launch(4, [str(tmp_path), "--dtype", "fp64", "--verify", "--timeout-s", "60"])
    assert res.returncode == 0, res.stdout + res.stderr
    diffs = [float(x) for x in re.findall(r"^verify: iteration \d+ max_abs_param_diff=(\S+)$", res.stdout, re.M)]
    assert len(diffs) == 4 and max(diffs) <= 1e-9
