"""Computation-wise splits and Seq1F1B planning."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hydraplan.core.cost import micro_batch_time, pipeline_time
from hydraplan.core.schedules import schedule_1f1b, schedule_seq1f1b, simulate
from hydraplan.schema import Scheme, SchemeMemory, TimeCoeffs
from hydraplan.solve.seqsplit import (
    auto_seq1f1b,
    computation_splits,
    cumulative_cost,
    plan_seq1f1b,
    seq1f1b_max_len,
    seq1f1b_split_cap,
    split_quantum,
)

A, B, C = 2.054e-9, 9.671e-5, 0.06518  # A800 LLaMA-2 7B <2,1,1>


def scheme(tp=2, pp=4, cp=1, max_len=22_000) -> Scheme:
    return Scheme(tp=tp, pp=pp, cp=cp, max_len=max_len, util_len=4096, time=TimeCoeffs(a=A, b=B, c=C),
                  memory=SchemeMemory(sharded_bytes=1e9, local_bytes=1e9, act_bytes_per_token=1e6))


def brute_cum(lengths, a, b) -> np.ndarray:
    per_token = [a * (2 * p - 1) + b for l in lengths for p in range(1, l + 1)]
    return np.concatenate([[0.0], np.cumsum(per_token)])


def test_cumulative_cost_matches_per_token_sum() -> None:
    lengths = np.array([5, 1, 9, 3])
    x = np.arange(lengths.sum() + 1)
    assert np.allclose(cumulative_cost(lengths, 0.3, 2.0, x), brute_cum(lengths, 0.3, 2.0))
    # a whole document costs a*l^2 + b*l
    assert cumulative_cost(lengths, 0.3, 2.0, np.array([5]))[0] == pytest.approx(0.3 * 25 + 2 * 5)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("K", [2, 4, 8])
def test_split_costs_equal_within_one_percent(seed: int, K: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(200, 30_000, size=rng.integers(1, 12))
    sp = computation_splits(lengths, A, B, K, quantum=8)
    assert sp.bounds[0] == 0 and sp.bounds[-1] == lengths.sum()
    assert np.all(np.diff(sp.bounds) > 0) and np.all(sp.bounds[:-1] % 8 == 0)
    assert sp.costs.max() <= 1.01 * sp.costs.min()
    # the splits add up to the micro-batch's canonical cost without its constant
    s = scheme()
    assert sp.costs.sum() == pytest.approx(micro_batch_time(s, lengths) - C)


def test_single_long_document_front_loads_tokens() -> None:
    # attention-dominated: equal cost means the first split holds far more tokens than the last
    sp = computation_splits([64_000], 1e-9, 1e-6, 4)
    assert sp.tokens[0] > 1.5 * sp.tokens[-1]
    assert sp.costs.max() <= 1.01 * sp.costs.min()


def test_splits_against_brute_force_minmax() -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        lengths = rng.integers(1, 9, size=rng.integers(1, 4))
        n, K = int(lengths.sum()), 3
        if n < K:
            continue
        cum = brute_cum(lengths, 0.5, 1.0)
        best = min(max(cum[x] - cum[w] for w, x in zip((0, *cut), (*cut, n)))
                   for cut in itertools.combinations(range(1, n), K - 1))
        sp = computation_splits(lengths, 0.5, 1.0, K)
        token_max = np.max(np.diff(cum))
        assert sp.costs.max() <= best + token_max + 1e-9


def test_short_micro_batch_gets_empty_splits_not_overlaps() -> None:
    sp = computation_splits([5], 1.0, 1.0, 4, quantum=2)  # 5 tokens cannot make 4 non-empty even splits
    assert sp.bounds[0] == 0 and sp.bounds[-1] == 5 and np.all(np.diff(sp.bounds) >= 0)
    assert sp.costs.sum() == pytest.approx(25 + 5)


def test_split_cap_and_quantum() -> None:
    s = scheme(tp=4, cp=2)
    assert split_quantum(s) == 4 and split_quantum(scheme(tp=2, cp=3)) == 6 and split_quantum(scheme(tp=8)) == 8
    sp = computation_splits([60_000], 1e-9, 1e-6, 4, quantum=4, max_split_tokens=16_000)
    assert sp.tokens.max() <= 16_000 and sp.bounds[-1] == 60_000
    assert np.all(sp.bounds[:-1] % 4 == 0)


def test_raised_max_len_fits_the_1f1b_activation_budget() -> None:
    # token weight act/P per stage; compare simulated peak bytes of both schedules (first stage)
    s = scheme(pp=8, max_len=20_000)
    P, K, M = 8, 4, 12
    L = seq1f1b_max_len(s, K)
    assert L == 4 * (20_000 * 8 // 11 // 2 * 2) and L > 2.5 * s.max_len  # tp = 2: even split bounds
    one = simulate(schedule_1f1b(P, M), 1.0, 2.0, act_bytes=float(s.max_len) / P)
    seq = simulate(schedule_seq1f1b(P, M, K), 1.0, 2.0, act_bytes=float(L // K) / P)
    assert max(seq.peak_live_bytes) <= max(one.peak_live_bytes)
    assert seq1f1b_split_cap(s, K) * (P - 1 + K) <= s.max_len * P


def test_plan_and_auto() -> None:
    s = scheme(pp=4)
    rng = np.random.default_rng(3)
    mbs = [rng.integers(1000, 8000, size=3) for _ in range(8)]
    plans = {k: plan_seq1f1b(s, mbs, k) for k in (1, 2, 4, 8)}
    assert plans[1].canonical_s == pytest.approx(pipeline_time(s, mbs))
    uniform = plan_seq1f1b(s, [np.array([5000])] * 8, 1)
    assert uniform.estimate_s == pytest.approx(uniform.canonical_s)  # K = 1 is exactly 1F1B
    assert plans[4].estimate_s < plans[1].estimate_s  # fewer bubbles with long micro-batches
    assert all(len(b) == 5 and b[-1] == mb.sum() for b, mb in zip(plans[4].splits, mbs))
    best = auto_seq1f1b(s, mbs)
    assert best.estimate_s == min(p.estimate_s for p in plans.values())
    # short micro-batches: the per-split overhead c dominates, so auto keeps K = 1
    tiny = [np.array([64]) for _ in range(8)]
    assert auto_seq1f1b(s, tiny).K == 1
    # a micro-batch longer than the 1F1B MaxLen forces a K whose raised MaxLen holds it
    big = [np.array([30_000])] + mbs
    assert seq1f1b_max_len(s, auto_seq1f1b(s, big).K) >= 30_000


def test_parse_and_raised_scheme() -> None:
    from hydraplan.core.errors import UserError
    from hydraplan.solve.seqsplit import parse_seq1f1b, seq1f1b_scheme

    assert parse_seq1f1b("4") == 4 and parse_seq1f1b("auto") == "auto"
    for bad in ("0", "x", "-2"):
        with pytest.raises(UserError, match="^seq1f1b must"):
            parse_seq1f1b(bad)
    s = scheme(pp=4, max_len=22_000)
    assert seq1f1b_scheme(s, 4).max_len == seq1f1b_max_len(s, 4) == 4 * (22_000 * 4 // 7 // 2 * 2)
    assert seq1f1b_scheme(s, "auto").max_len == seq1f1b_max_len(s, 8)
    assert seq1f1b_scheme(scheme(pp=1), 4).max_len == 22_000  # no pipeline, no Seq1F1B


def test_refine_plan_records_splits_estimates_and_cp_ranges() -> None:
    from hydraplan.schema import Estimate, MicroBatch, Plan, PlanPipeline
    from hydraplan.solve.seqsplit import refine_plan

    lengths = np.array([9000, 3000, 500, 12_000, 4000, 700, 2048])
    s_pp, s_cp = scheme(tp=2, pp=4), scheme(tp=2, pp=1, cp=2)
    groups = [[np.array([0, 1]), np.array([3])], [np.array([2, 4, 5, 6])]]
    pipes = [
        PlanPipeline(tp=sc.tp, pp=sc.pp, cp=sc.cp, ranks=list(range(8 * k, 8 * k + 8)),
                     micro_batches=[MicroBatch(seqs=g.tolist()) for g in gs],
                     estimate_s=pipeline_time(sc, [lengths[g] for g in gs]))
        for k, (sc, gs) in enumerate(zip((s_pp, s_cp), groups))
    ]
    plan = Plan(iteration=0, profile="t", gpus=16, batch=[], strategy="S", pipelines=pipes,
                estimate=Estimate(propagation_s=max(p.estimate_s for p in pipes)))
    refine_plan(plan, [s_pp, s_cp], groups, lengths, 2, True)
    pp_pipe, cp_pipe = plan.pipelines
    assert pp_pipe.seq1f1b_splits == 2
    want = plan_seq1f1b(s_pp, [lengths[g] for g in groups[0]], 2)
    assert pp_pipe.seq1f1b_estimate_s == pytest.approx(want.estimate_s)
    assert [mb.splits for mb in pp_pipe.micro_batches] == [b.tolist() for b in want.splits]
    assert pp_pipe.micro_batches[1].splits[-1] == 12_000
    assert cp_pipe.seq1f1b_estimate_s is None and cp_pipe.micro_batches[0].splits is None  # pp = 1
    assert plan.estimate.seq1f1b_estimate_s == pytest.approx(max(want.estimate_s, cp_pipe.estimate_s))
    shard = cp_pipe.micro_batches[0].cp_shard
    covered = sorted(t for rank in shard.ranges for s, e in rank for t in range(s, e))
    assert covered == list(range(int(lengths[groups[1][0]].sum())))
    assert pp_pipe.micro_batches[0].cp_shard is None  # cp = 1
    # the extra fields survive a JSON round trip through the plan model
    from hydraplan.store.fileio import model_json

    back = Plan.model_validate_json(model_json(plan))
    assert back.pipelines[0].seq1f1b_splits == 2 and back.pipelines[1].micro_batches[0].cp_shard.strategy == shard.strategy


def test_planner_plans_seq1f1b_and_cp_shards() -> None:
    from hydraplan.core.cost import pipeline_time
    from hydraplan.core.errors import UserError
    from hydraplan.engine.planner import Planner
    from hydraplan.schema import Candidate, GPUInfo, ModelInfo, PipelineSpec, Profile, Strategies

    pp4, cp2 = scheme(tp=2, pp=4, max_len=22_000), scheme(tp=2, pp=1, cp=2, max_len=30_000)
    profile = Profile(name="t", gpu=GPUInfo(name="g", memory_gib=80), model=ModelInfo(name="m", layers=32, hidden=4096),
                      schemes=[pp4, cp2])
    strategies = Strategies(candidates=[Candidate(name="S", pipelines=[PipelineSpec(tp=2, pp=4, cp=1),
                                                                        PipelineSpec(tp=2, pp=1, cp=2)])])
    rng = np.random.default_rng(0)
    lengths = np.concatenate([[40_000], rng.integers(200, 9000, size=30)])
    with pytest.raises(UserError, match="40000"):
        Planner(profile, strategies, 12).plan(lengths)  # longer than every 1F1B MaxLen
    plan = Planner(profile, strategies, 12, seq1f1b="4", cp_shard=True).plan(lengths)
    by_id = {s.id: s.length for s in plan.batch}
    canon = []
    for pipe, sc in zip(plan.pipelines, (pp4, cp2)):
        mbs = [np.array([by_id[i] for i in mb.seqs]) for mb in pipe.micro_batches]
        assert pipe.estimate_s == pytest.approx(pipeline_time(sc, mbs))  # canonical estimate untouched
        canon.append(pipe.estimate_s)
        for mb, ls in zip(pipe.micro_batches, mbs):
            if sc.pp > 1:
                assert len(mb.splits) == 5 and mb.splits[0] == 0 and mb.splits[-1] == ls.sum()
                assert ls.sum() <= seq1f1b_max_len(sc, 4)
            if sc.cp > 1:
                assert sum(e - s for r in mb.cp_shard.ranges for s, e in r) == ls.sum()
    assert 40_000 in [by_id[i] for mb in plan.pipelines[0].micro_batches for i in mb.seqs]
    assert plan.pipelines[0].seq1f1b_splits == 4 and plan.pipelines[0].seq1f1b_estimate_s > 0
    assert plan.estimate.propagation_s == pytest.approx(max(canon))
    assert plan.estimate.seq1f1b_estimate_s == pytest.approx(max(plan.pipelines[0].seq1f1b_estimate_s, canon[1]))
    # splits are capped from the plain 1F1B MaxLen, not from the raised one packing used
    assert plan.pipelines[0].seq1f1b_max_len == seq1f1b_max_len(pp4, 4)
    cap = seq1f1b_split_cap(pp4, 4)
    assert all(np.diff(mb.splits).max() <= cap for mb in plan.pipelines[0].micro_batches)
