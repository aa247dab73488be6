"""compare: metrics on hand-built plans, simulator vs closed form, and one tiny end-to-end run."""

import itertools
import json

import numpy as np
import pytest
from helpers import hp

from hydraplan.app.report import write_report
from hydraplan.core.cluster import Cluster
from hydraplan.core.cost import model_flops
from hydraplan.methods import baselines as bl
from hydraplan.methods import compare as cp
from hydraplan.schema import CompareResult, GPUInfo, ModelInfo, Profile, Scheme, TimeCoeffs


def scheme(tp=1, pp=1, c=0.0, b=1.0, max_len=100) -> Scheme:
    return Scheme(tp=tp, pp=pp, cp=1, max_len=max_len, util_len=1, time=TimeCoeffs(a=0.0, b=b, c=c))


def run_of(s: Scheme, mb_times: list[float]) -> bl.PipelineRun:
    lengths = np.asarray(mb_times, dtype=np.int64)  # b = 1, c = 0: a micro-batch of one sequence of length t
    return bl.run_pipeline(s, lengths, [np.array([i]) for i in range(lengths.size)])


def test_latency_gap_weights_phases_and_counts_empty_pipelines():
    s = scheme()
    one = bl.IterationPlan("x", "", np.array([4, 2]), (bl.Phase("p", (run_of(s, [4]), run_of(s, [2])), 0),))
    assert cp.latency_gap(one) == pytest.approx(0.5)
    two = bl.IterationPlan("x", "", np.array([4, 2]), (
        bl.Phase("p", (run_of(s, [4]), run_of(s, [2])), 0),
        bl.Phase("q", (run_of(s, [1]), run_of(s, [1])), 0),
    ))
    assert cp.latency_gap(two) == pytest.approx((2 + 0) / (4 + 1))
    idle = bl.IterationPlan("x", "", np.array([3]), (bl.Phase("p", (run_of(s, [3]), run_of(s, [])), 0),))
    assert cp.latency_gap(idle) == pytest.approx(1.0)


def test_idle_gpu_seconds_and_mfu_by_hand():
    s = scheme(tp=1, pp=2)  # 2 GPUs per pipeline
    a, b = run_of(s, [1, 1]), run_of(s, [1])  # latencies 1+1+1 = 3 and 1+1 = 2
    lengths = np.array([1, 1, 1])
    plan = bl.IterationPlan("x", "", lengths, (bl.Phase("p", (a, b), idle_gpus=2),))
    model = ModelInfo(name="m", layers=1, hidden=1, ffn=1, vocab=1)
    view = Profile(name="t", gpu=GPUInfo(name="g", memory_gib=1), model=model, schemes=[s])
    flops = 3 * (6 * 8 * 1 + 6 * 1)  # 8 GEMM weights (4h^2 + 3h*ffn + vocab*h), attention 6*L*h*l^2
    assert float(model_flops(model, lengths).sum()) == pytest.approx(flops)
    m = cp.iteration_metrics(plan, Cluster.of(view, 6, "propagation"), peak_flops=flops / 36.0)
    assert m.estimate_s == pytest.approx(3.0)
    assert m.idle_gpu_s == pytest.approx(6 * 3 - (2 * 2 + 2 * 1))
    assert m.mfu == pytest.approx(flops / (6 * (flops / 36.0) * 3.0))
    assert m.tokens == 3


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("n_mb", [1, 2, 5, 8])
def test_simulator_matches_closed_form_for_uniform_micro_batches(pp, n_mb):
    plan = bl.IterationPlan("x", "", np.ones(n_mb, dtype=np.int64),
                            (bl.Phase("p", (run_of(scheme(pp=pp), [7] * n_mb),), 0),))
    assert cp.simulated_s(plan) == pytest.approx(plan.estimate_s, rel=1e-12)
    assert plan.estimate_s == pytest.approx((n_mb + pp - 1) * 7, rel=1e-12)


def test_simulator_differs_from_closed_form_with_slow_micro_batches_at_both_ends():
    # pp=3, T = [3, 1, 1, 3]: the closed form charges the (pp-1)*max bubble once (8 + 2*3 = 14); 1F1B
    # exposes it in warm-up and cool-down, F = T/3 and B = 2T/3 give 18 (hand-traced timeline)
    plan = bl.IterationPlan("x", "", np.array([3, 1, 1, 3]), (bl.Phase("p", (run_of(scheme(pp=3), [3, 1, 1, 3]),), 0),))
    assert plan.estimate_s == pytest.approx(14.0)
    assert cp.simulated_s(plan) == pytest.approx(18.0)


# --------------------------------------------------------------------------------- tiny end-to-end run
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    opts = cp.CompareConfig(profile="h100-llama2-7b", dataset="builtin:prolong", gpus=16, tokens_per_iter=48_000,
                             iterations=3, seed=1, context_len=16384)
    outcome = cp.run_compare(opts)
    out = tmp_path_factory.mktemp("compare")
    paths = write_report(outcome, out)
    return outcome, out, paths


def test_tiny_run_every_method_plans_the_same_batches(tiny):
    outcome, _, _ = tiny
    assert set(outcome.runs) == set(cp.ALL_METHODS)
    sampled = [sorted(b.tolist()) for b in outcome.batches]
    for name, run in outcome.runs.items():
        assert len(run.plans) == 3
        for it, plan in enumerate(run.plans):
            trained = sorted(plan.lengths[np.concatenate(
                [mb for ph in plan.phases for p in ph.pipelines for mb in p.micro_batches])].tolist())
            assert trained == sorted(plan.lengths.tolist())  # every trained sequence in exactly one micro-batch
            if name not in ("wlb-llm", "hydraplan-delay"):
                assert trained == sampled[it], name
            for ph in plan.phases:
                assert sum(p.scheme.gpus for p in ph.pipelines) + ph.idle_gpus == 16
                for p in ph.pipelines:  # a CAD replica holds pieces of documents: MaxLen is checked on those
                    assert name in cp.CAD_METHODS and plan.strategy.startswith("cad") or all(
                        int(plan.lengths[mb].sum()) <= p.scheme.max_len for mb in p.micro_batches)
    wlb = outcome.runs["wlb-llm"].plans
    assert sum(int(p.lengths.sum()) for p in wlb) == sum(int(b.sum()) for b in outcome.batches)  # drained


def test_tiny_run_hydraplan_delay_trains_exactly_the_sampled_sequences(tiny):
    outcome, _, _ = tiny
    plans = outcome.runs["hydraplan-delay"].plans
    trained = [sorted(p.lengths.tolist()) for p in plans]
    sampled = [sorted(b.tolist()) for b in outcome.batches]
    assert sorted(sum(trained, [])) == sorted(sum(sampled, []))  # drained: nothing lost or duplicated
    assert trained != sampled  # something was delayed
    # waiting token-iterations = sum over iterations of tokens sampled so far but not yet trained
    waiting = np.cumsum([b.sum() for b in outcome.batches]) - np.cumsum([p.lengths.sum() for p in plans])
    assert (waiting >= 0).all() and waiting[-1] == 0
    assert sum(p.delayed_token_iters for p in plans) == waiting.sum() > 0
    result = outcome.result.methods["hydraplan-delay"]
    assert result.avg_delay_iters_per_token == pytest.approx(waiting.sum() / sum(sum(t) for t in trained))
    assert "hydraplan-delay" in outcome.result.notes


def test_tiny_run_json_is_consistent(tiny):
    outcome, out, _ = tiny
    result = CompareResult.model_validate(json.loads((out / "compare.json").read_text()))
    assert result.schema_ == "hydraplan.compare/v1"
    assert result.objective == "end-to-end"
    mega, mega_e2e = result.methods["megatron"].mean_estimate_s, result.methods["megatron"].mean_iteration_s
    cluster = outcome.cluster
    for name, m in result.methods.items():
        plans = outcome.runs[name].plans
        assert m.iterations_s == pytest.approx([p.estimate_s for p in plans], rel=1e-12)
        assert m.mean_estimate_s == pytest.approx(np.mean(m.iterations_s), rel=1e-12)
        # end to end: the same formula for every method, on its own schemes
        assert m.iteration_s == pytest.approx([bl.plan_iteration_s(p, cluster) for p in plans], rel=1e-12)
        assert m.sync_s == pytest.approx(np.array(m.iteration_s) - np.array(m.iterations_s), abs=1e-12)
        assert m.mean_iteration_s == pytest.approx(m.mean_estimate_s + m.mean_sync_s, rel=1e-12)
        assert len(m.sim_iterations_s) == len(m.gap) == len(m.mfu) == len(m.strategies) == 3
        assert m.speedup_vs_megatron == m.end_to_end_speedup_vs_megatron == pytest.approx(mega_e2e / m.mean_iteration_s,
                                                                                             rel=1e-12)
        assert m.propagation_speedup_vs_megatron == pytest.approx(mega / m.mean_estimate_s, rel=1e-12)
        assert all(0.0 <= g <= 1.0 for g in m.gap) and all(0.0 < u < 1.0 for u in m.mfu)
        assert all(i >= -1e-9 for i in m.idle_gpu_s)
    hydra, homo = result.methods["hydraplan"].iteration_s, result.methods["homo-pack"].iteration_s
    assert all(h <= o + 1e-12 for h, o in zip(hydra, homo))  # the homogeneous strategy is one of its candidates
    assert result.methods["wlb-llm"].imbalance and result.methods["wlb-llm"].avg_delay_iters_per_token is not None


def test_tiny_run_report_embeds_every_plot(tiny):
    _, out, paths = tiny
    html = (out / "report.html").read_text()
    for name in ("latency", "methods", "lengths", "load", "gantt"):
        assert paths[name].stat().st_size > 10_000
        assert f'alt="{name}" src="data:image/png;base64,' in html
    assert "hydraplan" in html and "megatron" in html


def test_cli_bad_method_is_one_line_exit_2(tmp_path):
    r = hp("compare", "--profile", "h100-llama2-7b", "--dataset", "builtin:prolong", "--gpus", "16", "--tokens-per-iter",
           "10000", "--iterations", "1", "--context-len", "8192", "--methods", "megatron,nope", "--out", tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "nope" in r.stderr


def test_cli_json_prints_compare_json(tmp_path):
    r = hp("compare", "--profile", "h100-llama2-7b", "--dataset", "builtin:prolong", "--gpus", "16", "--tokens-per-iter",
           "20000", "--iterations", "2", "--context-len", "8192", "--methods", "megatron wlb-llm", "--out", tmp_path,
           "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data["methods"]) == {"megatron", "wlb-llm"}
    assert data["methods"]["megatron"]["speedup_vs_megatron"] == pytest.approx(1.0)
    assert json.loads((tmp_path / "compare.json").read_text()) == data


@pytest.mark.parametrize("bandwidth", [1e3, 50e9, 1e18])  # switching dominant, realistic, free
def test_hotspa_picks_the_best_scheme_combination_including_switching(bandwidth):
    # TP communication makes wide schemes less efficient per GPU: short documents prefer tp=1 when switching is free
    schemes = [Scheme(tp=tp, pp=1, cp=1, max_len=m, util_len=1024, time=TimeCoeffs(a=4e-10 * f / tp, b=1e-5 * f / tp, c=0.002))
               for tp, m, f in [(1, 8192, 1.0), (2, 20000, 1.3), (4, 40000, 1.6)]]
    view = Profile(name="p", gpu=GPUInfo(name="g", memory_gib=80, gpus_per_node=8),
                   model=ModelInfo(name="m", layers=2, hidden=64), schemes=schemes)
    rng = np.random.default_rng(5)
    batches = [np.minimum(rng.lognormal(7.5, 1.3, 40).astype(np.int64) + 1, 32768) for _ in range(6)]
    switch = bl.SwitchModel(2e9, bandwidth)
    got = sum(p.estimate_s for p in cp.run_hotspa(batches, Cluster.of(view, 8), 32768, switch))
    ranges = bl.hotspa_ranges(32768)
    options = [[s for s in schemes if s.max_len >= hi] for _, hi in ranges]
    brute = min(sum(bl.hotspa(b, list(zip(ranges, combo)), 8, switch).estimate_s for b in batches)
                for combo in itertools.product(*options))
    assert got == pytest.approx(brute, rel=1e-12)
    plans = cp.run_hotspa(batches, Cluster.of(view, 8), 32768, switch)
    switched = any(p.overhead_s > 0 for p in plans)
    assert switched == (bandwidth == 1e18)  # only free switching makes a second scheme worth it here


def test_the_registry_is_what_compare_report_and_help_use():
    """methods/registry.py names every method once: compare runs exactly those (baselines by BASELINE_RUNS),
    the report has a colour for each and `compare --help` lists them."""
    from hydraplan.app import report
    from hydraplan.methods import registry

    assert cp.ALL_METHODS == registry.NAMES and len(registry.BY_NAME) == len(registry.METHODS)
    assert cp.KNOWN_METHODS == registry.NAMES + registry.OPT_IN
    assert registry.OPT_IN and all(registry.BY_NAME[m].family == "seam" for m in registry.OPT_IN)
    assert set(cp.BASELINE_RUNS) == set(cp.BASELINE_METHODS) == set(registry.of_family("baseline"))
    assert set(report.COLORS) == set(registry.BY_NAME) and len(set(report.COLORS.values())) == len(registry.METHODS)
    r = hp("compare", "-h", env={"COLUMNS": "400"})
    help_text = " ".join(r.stdout.split())
    assert r.returncode == 0 and " ".join(registry.NAMES) in help_text and " ".join(registry.OPT_IN) in help_text
