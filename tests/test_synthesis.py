"""Per-batch strategy synthesis: its strategies fit the job and hold the batch, it never makes a plan worse
than the candidates alone, and its pipelines use only process groups of the family made at start-up."""

import numpy as np
from helpers import tiny_profile

from hydraplan.core.cluster import Cluster
from hydraplan.engine.planner import Planner
from hydraplan.schema import Candidate, PipelineSpec, Strategies
from hydraplan.solve.placement import family, process_groups
from hydraplan.solve.proposal import propose
from hydraplan.solve.synthesis import synthesize
from hydraplan.store.datasets import load_dataset, sample_iterations
from hydraplan.store.profiles import load_profile


def _strategies() -> Strategies:
    return Strategies(candidates=[
        Candidate(name="tp2", pipelines=[PipelineSpec(tp=2, pp=1, cp=1)] * 4),
        Candidate(name="pp2", pipelines=[PipelineSpec(tp=1, pp=2, cp=1)] * 4),
    ])


def test_synthesized_strategies_fit_the_job_and_hold_the_batch():
    schemes = tiny_profile().schemes
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(16, 1500, 60), [3900, 2500]])
    out = synthesize(lengths, schemes, 8)
    assert out
    for counts in out:
        assert sum(schemes[k].gpus * n for k, n in counts.items()) == 8  # leftover GPUs are used
        assert max(schemes[k].max_len for k in counts) >= lengths.max()


def test_synthesis_never_makes_the_plan_worse():
    rng = np.random.default_rng(3)
    both = Planner(tiny_profile(), _strategies(), 8, synthesize=True)
    only = Planner(tiny_profile(), _strategies(), 8, synthesize=False)
    made = 0
    for it in range(4):
        lengths = np.concatenate([rng.integers(16, 1800, 50), rng.integers(2000, 4000, 2)])
        a, b = both.solve(lengths, it), only.solve(lengths, it)
        assert a.plan.estimate.propagation_s <= b.plan.estimate.propagation_s
        made += bool(a.plan.synthesized)
        if a.plan.synthesized:
            assert a.plan.strategy.startswith("batch:")
            assert a.plan.estimate.propagation_s < b.plan.estimate.propagation_s
    assert made > 0  # the case is built so that a mixed strategy beats both homogeneous candidates


def test_synthesized_strategies_stay_on_the_family():
    rng = np.random.default_rng(3)
    planner = Planner(tiny_profile(), _strategies(), 8, synthesize=True)
    groups = family(planner.scheme_keys, 8)
    made = 0
    for it in range(4):
        plan = planner.solve(np.concatenate([rng.integers(16, 1800, 50), rng.integers(2000, 4000, 2)]), it).plan
        made += bool(plan.synthesized)
        assert process_groups(plan.pipelines) <= set(groups)
    assert made > 0


def test_synthesis_by_default_with_either_objective():
    """On by default end to end too (it dispatches only what the relaxation shows beating the candidates), and
    there it never makes the plan worse in the end-to-end estimate."""
    rng = np.random.default_rng(3)
    prop = Planner(tiny_profile(), _strategies(), 8, objective="propagation")
    e2e = Planner(tiny_profile(), _strategies(), 8)
    only = Planner(tiny_profile(), _strategies(), 8, synthesize=False)
    assert prop.synthesize and e2e.synthesize and not only.synthesize
    assert not Planner(tiny_profile(), _strategies(), 8, objective="propagation", synthesize=False).synthesize
    for it in range(4):
        lengths = np.concatenate([rng.integers(16, 1800, 50), rng.integers(2000, 4000, 2)])
        a, b = e2e.solve(lengths, it).plan, only.solve(lengths, it).plan
        assert a.estimate.iteration_s <= b.estimate.iteration_s * (1 + 1e-12)


def test_pruning_synthesized_strategies_before_dispatch_keeps_the_plan():
    """Contenders, the strategies made for the batch among them, face the best score's bounds (cheap, then the LP
    relaxation) before their dispatch; the plan is the one solving every strategy to the end gives (h100-llama2-7b, 16 GPUs, four
    wikipedia batches of 50K tokens, four proposed candidates)."""
    profile = load_profile("h100-llama2-7b")
    ds = load_dataset("builtin:wikipedia", 32768)
    strategies = propose(Cluster.of(profile, 16), ds, 32768, tokens_per_iter=50_000, max_candidates=4)
    pruned = Planner(profile, strategies, 16, context_len=32768, synthesize=True)
    full = Planner(profile, strategies, 16, context_len=32768, synthesize=True, prune=False)
    before_dispatch = made = 0
    for batch in sample_iterations(ds, 50_000, 4, 0):
        a, b = pruned.solve(batch), full.solve(batch)
        assert (a.plan.strategy, a.plan.estimate.propagation_s) == (b.plan.strategy, b.plan.estimate.propagation_s)
        made += any(c.name.startswith("batch:") for c in a.summary.candidates)
        before_dispatch += sum(c.pruned and not c.dispatch_solver for c in a.summary.candidates)
        assert not any(c.pruned for c in b.summary.candidates)
    assert made > 0 and before_dispatch > 0  # strategies were made, and some contenders never reached dispatch


def test_aiming_below_the_best_candidate_only_adds_strategies(monkeypatch):
    """With an upper, synthesis also aims RETARGET below it (other schemes ranked, other MILP latencies): the
    strategies of the aim at the upper itself come first, none is lost, and here the lower aims add some
    (h100-llama2-13b, 64 GPUs, a 200K-token wikipedia batch of seed 2), unless the first strategy has more than
    RETARGET_PIPELINES pipelines; an upper nothing beats gives none."""
    from hydraplan.solve import synthesis

    schemes = list(Cluster.of(load_profile("h100-llama2-13b"), 64, "propagation").schemes)
    batch = next(iter(sample_iterations(load_dataset("builtin:wikipedia", 32768), 200_000, 1, 2)))
    lengths = np.asarray(batch.lengths)
    least = synthesis._aimed(lengths, schemes, 64, None, np.zeros(len(schemes)), [], None)[1]
    both = synthesize(lengths, schemes, 64, upper=1.1 * least.hi)
    monkeypatch.setattr(synthesis, "RETARGET", (1.0,))
    one = synthesize(lengths, schemes, 64, upper=1.1 * least.hi)
    assert one and both[:len(one)] == one and len(both) > len(one)
    monkeypatch.undo()
    monkeypatch.setattr(synthesis, "RETARGET_PIPELINES", min(sum(c.values()) for c in one) - 1)
    assert synthesize(lengths, schemes, 64, upper=1.1 * least.hi) == one  # more pipelines: the first aim only
    monkeypatch.undo()
    assert synthesize(lengths, schemes, 64, upper=0.9 * least.lo) == []


def _widths(*gpus: int) -> list:
    from hydraplan.core.schema import Scheme, TimeCoeffs

    return [Scheme(tp=g, pp=1, cp=1, max_len=4096 * g, util_len=256, time=TimeCoeffs(a=1e-9, b=1e-5, c=0.01))
            for g in gpus]


def test_neighbors_move_one_pipeline_and_leave_no_gpu_idle():
    """Schemes of 8, 2 and 1 GPUs on 64: one 8-GPU pipeline fewer is refilled with the 2-GPU pipelines the strategy
    has or with 1-GPU ones; one more takes its 8 GPUs from the narrowest pipelines; every neighbor keeps every
    GPU busy and is not the strategy itself."""
    from hydraplan.solve.synthesis import neighbors

    schemes = _widths(8, 2, 1)
    near = neighbors({0: 6, 1: 8}, schemes, 64)
    for c in near:
        used = sum(schemes[k].gpus * n for k, n in c.items())
        assert used == 64 and all(n > 0 for n in c.values()) and c != {0: 6, 1: 8}
    assert {0: 5, 1: 12} in near  # one 8-GPU pipeline fewer, as 2-GPU pipelines
    assert {0: 5, 1: 8, 2: 8} in near  # as 1-GPU pipelines
    assert {0: 7, 1: 4} in near  # one more, from four 2-GPU pipelines
    assert {0: 6, 1: 7, 2: 2} in near  # one 2-GPU pipeline fewer, as 1-GPU pipelines
    assert {0: 8} not in near  # two pipelines away
    assert neighbors({0: 8}, schemes, 64) == [{0: 7, 2: 8}]  # nothing narrower to give GPUs up: only fewer


def test_strategies_around_the_winner_only_add_contenders(monkeypatch):
    """Batches whose strategies synthesis makes: the winner's neighbors are tried after them (named on from them,
    none a strategy already tried), and each plan is at least as fast as without them."""
    from hydraplan.engine import synthesized

    rng = np.random.default_rng(3)
    planner = Planner(tiny_profile(), _strategies(), 8, synthesize=True)
    batches = [np.concatenate([rng.integers(16, 1800, 50), rng.integers(2000, 4000, 2)]) for _ in range(6)]
    near = [planner.select(b, it) for it, b in enumerate(batches)]
    monkeypatch.setattr(synthesized, "ROUNDS", 0)
    alone = [planner.select(b, it) for it, b in enumerate(batches)]
    tried = 0
    for sel, without in zip(near, alone, strict=True):
        made = [c for c in sel.contenders if c.synthesized]
        keys = [tuple(sorted(p.key for p in c.specs)) for c in made]
        assert len(set(keys)) == len(keys)
        assert [c.name for c in made] == [f"batch:{j}" for j in range(len(made))]
        n = len(without.contenders)  # the same contenders first, the neighbours after them
        assert [c.specs for c in sel.contenders[:n]] == [c.specs for c in without.contenders]
        assert sel.outcomes[sel.winner].score <= without.outcomes[without.winner].score
        tried += len(sel.contenders) > n
    assert tried > 0


def test_a_small_strategy_falls_back_to_the_whole_shortlist(monkeypatch):
    """When the MILP on the schemes the LP's point uses reaches no aim, a small strategy's MILP runs again on every
    scheme of the shortlist (a superset of them); a large one's does not."""
    from hydraplan.solve import synthesis

    schemes = list(Cluster.of(load_profile("h100-llama2-13b"), 64, "propagation").schemes)
    batch = next(iter(sample_iterations(load_dataset("builtin:wikipedia", 32768), 200_000, 1, 2)))
    lengths = np.asarray(batch.lengths)
    least = synthesis._aimed(lengths, schemes, 64, None, np.zeros(len(schemes)), [], None)[1]
    calls = []

    def integral(lengths, schemes, gpus, t, used, steps, small):
        calls.append(list(used))
        return [] if len(calls) == 1 else [{used[0]: 1}]

    monkeypatch.setattr(synthesis, "_integral", integral)
    got, _ = synthesis._aimed(lengths, schemes, 64, 1.1 * least.hi, np.zeros(len(schemes)), [], None)
    assert len(calls) == 2 and set(calls[0]) < set(calls[1]) and got == [{calls[1][0]: 1}]
    calls.clear()
    monkeypatch.setattr(synthesis, "NEAR_PIPELINES", 0)
    assert synthesis._aimed(lengths, schemes, 64, 1.1 * least.hi, np.zeros(len(schemes)), [], None)[0] == []
    assert len(calls) == 1
