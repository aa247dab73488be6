"""The planner (engine/planner.py) and its run loop: strategy resolution, selection, the Planner API,
determinism and --resume."""

import gc
import itertools
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import Interrupt, StopAfter, partitions, tiny_profile, write_run_inputs

from hydraplan.app.config import PackConfig
from hydraplan.app.pack import run_pack
from hydraplan.app.validate import check_plan, validate_path
from hydraplan.core.batch import as_batch
from hydraplan.core.cluster import Cluster
from hydraplan.core.cost import pipeline_estimate, pipeline_time
from hydraplan.core.errors import UserError
from hydraplan.engine.assemble import solver_seed
from hydraplan.engine.candidate import ResolvedCandidate, candidate_bound
from hydraplan.engine.planner import Planner
from hydraplan.engine.strategies import resolve_strategies, with_static_candidate
from hydraplan.schema import (
    GPUInfo,
    ModelInfo,
    Plan,
    Profile,
    Scheme,
    Strategies,
    TimeCoeffs,
)
from hydraplan.solve import packing
from hydraplan.store.fileio import model_json


def strategies(ranks: bool = True) -> Strategies:
    def p(tp, pp, r):
        return {"tp": tp, "pp": pp, "cp": 1, **({"ranks": r} if ranks else {})}

    return Strategies(candidates=[
        {"name": "mixed", "pipelines": [p(2, 1, [0, 1]), p(1, 1, [2]), p(1, 1, [3])]},
        {"name": "tp2", "pipelines": [p(2, 1, [0, 1]), p(2, 1, [2, 3])]},
        {"name": "pp2", "pipelines": [p(1, 2, [0, 1]), p(1, 2, [2, 3])]},
    ])


# ------------------------------------------------------------------------------------- pure helpers
def test_pipeline_estimate_matches_costmodel():
    s = tiny_profile().schemes[2]
    lengths = np.array([100, 2000, 37, 900, 5])
    groups = [np.array([1]), np.array([0, 3]), np.array([2, 4])]
    expected = pipeline_time(s, [lengths[g].tolist() for g in groups])
    assert pipeline_estimate(s, lengths, groups) == pytest.approx(expected, rel=1e-12)


def test_solver_seed_depends_on_seed_and_iteration_only():
    assert solver_seed(3, 7) == solver_seed(3, 7)
    seeds = {solver_seed(s, i) for s, i in itertools.product(range(3), range(3))}
    assert len(seeds) == 9 and all(0 <= s < 2**31 for s in seeds)


def test_as_batch_numbers_plain_lengths_and_rejects_bad_ones():
    b = as_batch([5, 7, 9], iteration=4)
    assert b.iteration == 4 and b.ids.tolist() == [0, 1, 2] and b.docs is None
    with pytest.raises(UserError):
        as_batch([5, 0])


def test_resolve_places_missing_ranks_disjointly():
    out = resolve_strategies(strategies(ranks=False), Cluster.of(tiny_profile(), 4))
    assert out.gpus == 4 and out.profile == "tiny"
    for cand in out.candidates:
        ranks = [r for p in cand.pipelines for r in p.ranks]
        assert sorted(ranks) == list(range(4))
        assert all(len(p.ranks) == p.tp * p.pp * p.cp for p in cand.pipelines)
    assert [c.max_len for c in out.candidates] == [4096, 4096, 4096]


def test_static_candidate_is_added_once_with_placed_ranks():
    cluster = Cluster.of(tiny_profile(), 4)
    base = resolve_strategies(strategies(), cluster)
    tp2, pp2, tp1 = (cluster.scheme(k) for k in [(2, 1, 1), (1, 2, 1), (1, 1, 1)])
    # the layout is there already (2x<2,1,1> is "tp2", 2x<1,2,1> is "pp2"): nothing added
    assert with_static_candidate(base, tp2, cluster, None) == base
    assert with_static_candidate(base, pp2, cluster, None) == base
    added = with_static_candidate(base, tp1, cluster, None)
    assert [c.name for c in added.candidates] == ["mixed", "tp2", "pp2", "static"]
    static = added.candidates[-1]
    assert [p.key for p in static.pipelines] == [(1, 1, 1, "none")] * 4
    assert sorted(r for p in static.pipelines for r in p.ranks) == [0, 1, 2, 3]
    assert with_static_candidate(added, tp1, cluster, None) == added  # resume adds nothing


def test_resolve_places_only_the_pipelines_without_ranks():
    data = strategies().model_dump(by_alias=True, exclude_none=True)
    data["candidates"][0]["pipelines"][1].pop("ranks")  # <1,1,1> between [0, 1] and [3]
    out = resolve_strategies(Strategies.model_validate(data), Cluster.of(tiny_profile(), 4))
    assert [p.ranks for p in out.candidates[0].pipelines] == [[0, 1], [2], [3]]


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c[0]["pipelines"][0].update(tp=8, ranks=list(range(8))), "scheme <8,1,1> is not in profile"),
    (lambda c: c[1]["pipelines"][1].update(ranks=[1, 2]), "rank 1 also used by pipeline 0"),
    (lambda c: c[1]["pipelines"][1].update(ranks=[2, 9]), "out of range"),
    (lambda c: c[2].update(name="tp2"), "duplicate candidate name"),
    (lambda c: c[0]["pipelines"].append({"tp": 1, "pp": 1, "cp": 1, "ranks": [4]}), "uses 5 GPUs, the run has 4"),
])
def test_resolve_rejects_bad_strategies_with_one_line(mutate, message):
    data = strategies().model_dump(by_alias=True, exclude_none=True)
    mutate(data["candidates"])
    with pytest.raises(UserError, match=message) as e:
        resolve_strategies(Strategies.model_validate(data), Cluster.of(tiny_profile(), 4), source="s.json")
    assert "\n" not in str(e.value) and str(e.value).startswith("s.json: field candidates.")


# ------------------------------------------------------------------------------------------ Planner
def test_planner_plan_validates_and_picks_the_lowest_candidate():
    rng = np.random.default_rng(1)
    lengths = np.concatenate([rng.integers(16, 1500, 40), [3500, 3000]])
    planner = Planner(tiny_profile(), strategies(), 4, prune=False)
    result = planner.solve(lengths, iteration=3)
    plan = result.plan
    assert isinstance(plan, Plan) and plan.iteration == 3
    assert check_plan(plan, tiny_profile()) == []
    est = result.summary.candidates_s
    assert all(v is not None for v in est.values()) and list(est)[:3] == ["mixed", "tp2", "pp2"]
    assert all(k.startswith("batch:") for k in list(est)[3:])  # strategies made for this batch
    assert plan.strategy == min(est, key=lambda k: est[k])
    assert plan.synthesized == plan.strategy.startswith("batch:") or plan.synthesized is None
    assert plan.estimate.propagation_s == pytest.approx(min(est.values()), rel=1e-12)
    # same iteration, same plan; a planner built twice agrees (no hidden state)
    again = Planner(tiny_profile(), strategies(), 4, prune=False).plan(lengths, iteration=3)
    assert model_json(again) == model_json(plan)


def test_pruning_never_changes_the_plan():
    full = Planner(tiny_profile(), strategies(), 4, prune=False)
    pruned = Planner(tiny_profile(), strategies(), 4)
    rng = np.random.default_rng(5)
    skipped = 0
    for it in range(12):
        lengths = rng.integers(8, 4096, int(rng.integers(3, 40)))
        a, b = full.solve(lengths, it), pruned.solve(lengths, it)
        assert model_json(a.plan) == model_json(b.plan)
        for c in b.summary.candidates:
            assert c.bound_s <= a.summary.candidates_s[c.name] * (1 + 1e-9)
            if c.pruned:
                skipped += 1
                assert c.bound_s >= b.plan.estimate.propagation_s * (1 - 1e-9)
    assert skipped > 0


def brute_force(schemes, lengths) -> float:
    """The best canonical estimate over every dispatch and every packing."""
    best = np.inf
    for assign in itertools.product(range(len(schemes)), repeat=len(lengths)):
        worst = 0.0
        for j, s in enumerate(schemes):
            mine = [int(l) for l, a in zip(lengths, assign) if a == j]
            packs = [pipeline_time(s, p) for p in partitions(mine) if all(sum(m) <= s.max_len for m in p)]
            worst = max(worst, min(packs, default=np.inf) if mine else 0.0)
        best = min(best, worst)
    return best


def test_candidate_bound_is_below_the_brute_force_optimum():
    planner = Planner(tiny_profile(), strategies(), 4, prune=False)
    rng = np.random.default_rng(9)
    for _ in range(6):
        lengths = rng.integers(100, 4000, 5)
        for cand in planner.candidates:
            opt = brute_force(cand.schemes, lengths)
            bound = candidate_bound(cand, lengths)
            assert bound <= opt * (1 + 1e-12)
            # exact for one sequence: it runs alone on the pipeline where it is cheapest
            one = lengths[:1]
            assert candidate_bound(cand, one) == pytest.approx(brute_force(cand.schemes, one), rel=1e-12)


def test_strategy_relaxation_admits_the_best_plan_and_rules_out_below():
    """bound.strategy_meets, the LP that prunes a candidate before its dispatch: feasible at the brute-force
    optimum of every candidate (so it never rules out a latency a plan reaches), and infeasible somewhere
    below it (so it can rule candidates out)."""
    from hydraplan.solve.bound import strategy_meets

    planner = Planner(tiny_profile(), strategies(), 4, prune=False)
    rng = np.random.default_rng(13)
    below = 0
    for _ in range(6):
        lengths = rng.integers(100, 4000, 5)
        for cand in planner.candidates:
            opt = brute_force(cand.schemes, lengths)
            uniq, counts, _ = cand.kinds
            assert strategy_meets(lengths, uniq, counts, opt * (1 + 1e-9))
            below += not strategy_meets(lengths, uniq, counts, opt * 0.9)
    assert below > 0


def test_single_micro_batch_pipelines_are_found_without_search():
    """pp = 1 pipelines whose tokens fit MaxLen (and empty ones) get their one micro-batch at once: exactly
    their sequences, longest first then by position (pack's order); pp > 1 or over-full ones are left to pack."""
    from hydraplan.engine.candidate import _single_micro_batches

    planner = Planner(tiny_profile(), strategies(), 4, prune=False)
    rng = np.random.default_rng(21)
    for _ in range(20):
        cand = planner.candidates[int(rng.integers(len(planner.candidates)))]
        lengths = rng.integers(1, 1500, int(rng.integers(1, 12)))
        assign = rng.integers(0, len(cand.schemes), lengths.size)
        got = _single_micro_batches(cand, lengths, assign)
        for j, s in enumerate(cand.schemes):
            mine = [i for i in range(lengths.size) if assign[i] == j]
            easy = not mine or (s.pp == 1 and lengths[mine].sum() <= s.max_len)
            assert (j in got) == easy
            if easy:
                assert got[j].tolist() == sorted(mine, key=lambda i: (-lengths[i], i))


def test_candidate_that_cannot_hold_a_sequence_is_skipped():
    # 3000 tokens fit <2,1,1> and <1,2,1> (4096) but not "only-small" (2048)
    s = Strategies(candidates=[
        {"name": "only-small", "pipelines": [{"tp": 1, "pp": 1, "cp": 1, "ranks": [i]} for i in range(4)]},
        {"name": "tp2", "pipelines": [{"tp": 2, "pp": 1, "cp": 1}, {"tp": 2, "pp": 1, "cp": 1}]},
    ])
    result = Planner(tiny_profile(), s, 4).solve([100, 3000, 200])
    assert result.summary.candidates_s["only-small"] is None
    assert "3000" in result.summary.candidates[0].infeasible
    assert result.plan.strategy == "tp2"


def test_no_candidate_can_hold_the_batch():
    with pytest.raises(UserError, match=r"length 5000 \(the largest MaxLen is 4096\)"):
        Planner(tiny_profile(), strategies(), 4).plan([100, 5000])


# --------------------------------------------------------------------------------------- run_pack
@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory):
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(6.0, 1.2, 3000).astype(np.int64) + 1, 4096)
    return write_run_inputs(tmp_path_factory.mktemp("inputs"), lengths, strategies(ranks=False))


def opts(run_inputs, out: Path, **kw) -> PackConfig:
    profile, data, strat = run_inputs
    base = dict(profile=str(profile), dataset=str(data), gpus=4, tokens_per_iter=20000, iterations=6, out=out,
                strategies=strat, seed=11, workers=1)
    return PackConfig(**{**base, **kw})


def plan_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.json")) if p.name != "summary.json"}


@pytest.fixture(scope="module")
def full_run(run_inputs, tmp_path_factory):
    """opts()'s run (6 iterations, one worker), planned once for the tests that compare with it or start from it
    (they read it or copy it, never write it)."""
    out = tmp_path_factory.mktemp("full") / "run"
    return out, run_pack(opts(run_inputs, out))


def test_run_pack_writes_valid_plans_identical_for_any_worker_count(tmp_path, run_inputs, full_run):
    w1, s1 = full_run
    s2 = run_pack(opts(run_inputs, tmp_path / "w2", workers=2))
    one, two = plan_bytes(w1), plan_bytes(tmp_path / "w2")
    assert len(one) == 7 and one == two  # 6 plans + strategies.json
    assert [i.strategy for i in s1.iterations] == [i.strategy for i in s2.iterations]
    report = validate_path(w1, tiny_profile())
    assert report.ok and report.plans == 6, report.violations
    assert s1.mean_estimate_s == pytest.approx(np.mean([i.estimate_s for i in s1.iterations]))
    # ids are positions in the run's sampled stream: unique across the whole run
    plans = [Plan.model_validate_json(f.read_text()) for f in sorted(w1.glob("iter_*.json"))]
    ids = [s.id for plan in plans for s in plan.batch]
    assert len(ids) == len(set(ids))


class _CollectorSeen:
    """Progress that records, per plan, whether the garbage collector would run on its own."""

    def __init__(self) -> None:
        self.enabled: list[bool] = []
        self.full_passes: list[int] = []  # the collector's full passes so far, at each plan

    def start(self, done: int, total: int) -> None:
        pass

    def advance(self, it: object) -> None:
        self.enabled.append(gc.isenabled())
        self.full_passes.append(sum(s["collections"] for s in gc.get_stats()))


@pytest.mark.parametrize("stop", [False, True])
def test_run_pack_collects_once_per_plan_and_leaves_the_collector_as_it_was(tmp_path, run_inputs, stop):
    """While planning the collector runs only between plans (engine.pool.plan_heap); afterwards, finished or
    interrupted, it is enabled again and nothing is left frozen in the caller's process."""
    assert gc.isenabled() and gc.get_freeze_count() == 0
    if stop:
        with pytest.raises(Interrupt):
            run_pack(opts(run_inputs, tmp_path / "run"), StopAfter(2))
    else:
        seen = _CollectorSeen()
        run_pack(opts(run_inputs, tmp_path / "run"), seen)
        assert seen.enabled == [False] * 6
        assert np.diff(seen.full_passes).tolist() == [1] * 5  # exactly one pass between plans, none inside one
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_resume_after_interruption_equals_an_uninterrupted_run(tmp_path, run_inputs, full_run):
    out = tmp_path / "cut"
    with pytest.raises(Interrupt):
        run_pack(opts(run_inputs, out), StopAfter(2))
    assert sorted(p.name for p in out.glob("iter_*.json")) == ["iter_000000.json", "iter_000001.json"]
    # a plan the interrupted run wrote without recording it in summary.json is redone, not trusted
    (out / "iter_000002.json").write_text("half-written garbage")
    summary = run_pack(opts(run_inputs, out, resume=True))
    assert [i.iteration for i in summary.iterations] == list(range(6))
    assert plan_bytes(out) == plan_bytes(full_run[0])


def test_resume_refuses_different_arguments(tmp_path, run_inputs):
    out = tmp_path / "run"
    with pytest.raises(Interrupt):
        run_pack(opts(run_inputs, out), StopAfter(1))
    with pytest.raises(UserError, match=r"args.seed: the run was started with 11, now 12"):
        run_pack(opts(run_inputs, out, seed=12, resume=True))
    with pytest.raises(UserError, match=r"args.tokens_per_iter"):
        run_pack(opts(run_inputs, out, tokens_per_iter=30000, resume=True))


def test_fresh_run_replaces_an_older_longer_run(tmp_path, run_inputs, full_run):
    out = tmp_path / "run"
    shutil.copytree(full_run[0], out)  # a finished 6-iteration run
    run_pack(opts(run_inputs, out, iterations=2, seed=5))
    assert sorted(p.name for p in out.glob("iter_*.json")) == ["iter_000000.json", "iter_000001.json"]
    assert validate_path(out, tiny_profile()).ok


def test_benchmark_lp_bound_is_below_the_brute_force_optimum():
    from bench.bench_pack import lp_lower_bound

    rng = np.random.default_rng(4)
    schemes = tiny_profile().schemes
    for k in range(12):
        cand = [schemes[0], schemes[2], schemes[int(rng.integers(0, 3))]]
        lengths = rng.integers(50, 1500 if k % 2 else 4000, 5)  # short ones share micro-batches
        opt = brute_force(cand, lengths)
        lb = lp_lower_bound(lengths, cand)
        assert lb <= opt * (1 + 1e-9)
        assert candidate_bound(ResolvedCandidate("x", (), tuple(cand), (0.0,) * len(cand)), lengths) <= opt * (1 + 1e-9)


def test_benchmark_lp_bound_charges_every_pipeline_one_micro_batch():
    """Four 500-token sequences on two <1,1,1> (MaxLen 2048): two per pipeline in one micro-batch is optimal.
    Charging c only per token (c * 1000/2048 per pipeline) would leave the bound 0.5 c below it."""
    from bench.bench_pack import lp_lower_bound

    s = tiny_profile().schemes[0]
    lengths = np.full(4, 500)
    opt = brute_force([s, s], lengths)
    assert opt == pytest.approx(2 * (s.time.a * 500**2 + s.time.b * 500) + s.time.c)
    assert lp_lower_bound(lengths, [s, s]) == pytest.approx(opt, rel=1e-9)


def test_packing_cpsat_time_per_iteration_is_capped(cpsat_calls):
    """Every (candidate, pipeline) pack call used to get its own time limit, so an iteration's CP-SAT time
    grew with candidates x pipelines (minutes at 32 GPUs); now they share `pack_budget_s`."""
    pp4 = Scheme(tp=1, pp=4, cp=1, max_len=640, util_len=640, time=TimeCoeffs(a=6.6e-8, b=0.0, c=0.0022))
    profile = Profile(name="pp4", gpu=GPUInfo(name="g", memory_gib=80, gpus_per_node=8),
                      model=ModelInfo(name="m", layers=4, hidden=8), schemes=[pp4])
    four = Strategies(candidates=[{"name": "pp4x4", "pipelines": [{"tp": 1, "pp": 4, "cp": 1}] * 4}])
    lengths = np.random.default_rng(0).integers(20, 257, 300)
    budget, per_call = 0.3, 0.25
    runs = []
    for _ in range(2):
        packing._pack_sorted.cache_clear()
        cpsat_calls.clear()
        planner = Planner(profile, four, 16, pack_time_limit_s=per_call, pack_budget_s=budget)
        runs.append(planner.solve(lengths, 0))
        assert len(cpsat_calls) >= 2  # CP-SAT ran on more than one pipeline: uncapped it would spend ~4 x per_call
        assert sum(cpsat_calls) <= budget + 0.01 * len(cpsat_calls)  # a call may overrun its limit by a few ms
        assert check_plan(runs[-1].plan, profile) == []
    assert model_json(runs[0].plan) == model_json(runs[1].plan)  # deterministic, not wall-clock, budget


def _recompute_profile(slowdown: float) -> Profile:
    """<1,1,1> cannot hold 12K tokens, <4,1,1> holds them at twice the ideal GPU-seconds per token, and
    <1,1,1,full> holds them on one GPU, `slowdown` times slower than <1,1,1> (the forward it re-runs)."""
    one = TimeCoeffs(a=2e-9, b=1e-4, c=0.01)
    return Profile(
        name="recompute", gpu=GPUInfo(name="g", memory_gib=80, gpus_per_node=4), model=ModelInfo(name="m", layers=2, hidden=8),
        schemes=[Scheme(tp=1, pp=1, cp=1, max_len=2048, util_len=256, time=one),
                 Scheme(tp=4, pp=1, cp=1, max_len=16384, util_len=512, time=TimeCoeffs(a=1e-9, b=5e-5, c=0.01)),
                 Scheme(tp=1, pp=1, cp=1, recompute="full", max_len=16384, util_len=256,
                        time=TimeCoeffs(a=one.a * slowdown, b=one.b * slowdown, c=one.c))],
    )


@pytest.mark.parametrize("slowdown,uses_full", [(1.33, True), (2.0, False)])
def test_a_long_sequence_takes_a_recomputing_narrow_pipeline_only_where_it_is_faster(slowdown, uses_full):
    """The proposal and the per-iteration selection treat a recomputing scheme as one more scheme: a 12K-token
    sequence among short ones runs on a recomputing one-GPU pipeline next to three plain ones while
    recomputation costs a third more, and on a wide <4,1,1> once it costs twice as much."""
    from hydraplan.solve.proposal import propose

    profile = _recompute_profile(slowdown)
    cluster = Cluster.of(profile, 4, "propagation")
    lengths = np.array([12000] + [1000] * 30)
    cands = propose(cluster, lengths, 12000, tokens_per_iter=int(lengths.sum()))
    plan = Planner(profile, cands, 4, context_len=12000, objective="propagation", synthesize=False).plan(lengths)
    long_pipe = next(p for p in plan.pipelines if any(sid == 0 for mb in p.micro_batches for sid in mb.seqs))
    assert (long_pipe.label == "<1,1,1,full>") == uses_full, [p.label for p in plan.pipelines]
    assert check_plan(plan, profile) == []
