"""`hydraplan validate`: a hand-built plan passes, and each kind of violation is caught and located."""

import json
from pathlib import Path

import pytest
from helpers import hp

from hydraplan.app.validate import check_plan, validate_path
from hydraplan.schema import (
    BatchSeq,
    Estimate,
    GPUInfo,
    IterationSummary,
    MicroBatch,
    ModelInfo,
    Plan,
    PlanPipeline,
    Profile,
    Scheme,
    Strategies,
    Summary,
    TimeCoeffs,
)
from hydraplan.solve.placement import check_ranks
from hydraplan.store.fileio import model_json, write_model


def tiny_profile() -> Profile:
    t = TimeCoeffs(a=0.001, b=0.01, c=1.0)
    return Profile(
        name="tiny", gpu=GPUInfo(name="g", memory_gib=80), model=ModelInfo(name="m", layers=2, hidden=8),
        schemes=[Scheme(tp=1, pp=1, cp=1, max_len=100, util_len=10, time=t),
                 Scheme(tp=1, pp=2, cp=1, max_len=200, util_len=10, time=t)],
    )


def good_plan() -> Plan:
    """Costs by hand, cost(l) = 0.001 l^2 + 0.01 l, c = 1:
    pipeline 0 (pp=1): {50,40} = 4.1+0.9+1 = 6.0, {30} = 0.9+0.3+1 = 2.2          -> 8.2
    pipeline 1 (pp=2): {120} = 14.4+1.2+1 = 16.6, {60} = 3.6+0.6+1 = 5.2 -> 21.8 + 16.6 = 38.4"""
    lengths = {10: 50, 11: 40, 12: 30, 13: 120, 14: 60}
    return Plan(
        iteration=0, profile="tiny", gpus=4, strategy="S0",
        batch=[BatchSeq(id=i, doc=100 + i, length=l) for i, l in lengths.items()],
        pipelines=[
            PlanPipeline(tp=1, pp=1, cp=1, ranks=[0], estimate_s=8.2,
                         micro_batches=[MicroBatch(seqs=[10, 11]), MicroBatch(seqs=[12])]),
            PlanPipeline(tp=1, pp=2, cp=1, ranks=[1, 2], estimate_s=38.4,
                         micro_batches=[MicroBatch(seqs=[13]), MicroBatch(seqs=[14])]),
        ],
        estimate=Estimate(propagation_s=38.4),
    )


def kinds(plan: Plan) -> set[str]:
    return {v.kind for v in check_plan(plan, tiny_profile(), "p.json")}


def test_good_plan_has_no_violation():
    assert check_plan(good_plan(), tiny_profile()) == []


def test_estimate_within_relative_tolerance_passes_and_outside_fails():
    plan = good_plan()
    plan.pipelines[0].estimate_s = 8.2 * (1 + 1e-8)
    assert kinds(plan) == set()
    plan.pipelines[0].estimate_s = 8.2 * (1 + 1e-4)
    vs = check_plan(plan, tiny_profile(), "p.json")
    assert [(v.kind, v.pipeline) for v in vs] == [("estimate", 0)]


def test_wrong_propagation_estimate():
    plan = good_plan()
    plan.estimate.propagation_s = 8.2  # the min, not the max
    vs = check_plan(plan, tiny_profile(), "p.json")
    assert [v.kind for v in vs] == ["estimate"] and "38.4" in vs[0].message


def test_dropped_sequence():
    plan = good_plan()
    plan.pipelines[0].micro_batches[0].seqs = [10]
    vs = check_plan(plan, tiny_profile(), "p.json")
    cover = [v for v in vs if v.kind == "coverage"]
    assert len(cover) == 1 and "id 11" in cover[0].message and "no micro-batch" in cover[0].message


def test_duplicated_sequence_is_located():
    plan = good_plan()
    plan.pipelines[1].micro_batches[1].seqs = [14, 12]
    cover = [v for v in check_plan(plan, tiny_profile(), "p.json") if v.kind == "coverage"]
    assert len(cover) == 1 and "id 12" in cover[0].message
    assert (cover[0].pipeline, cover[0].micro_batch) == (1, 1)


def test_unknown_sequence_id():
    plan = good_plan()
    plan.pipelines[0].micro_batches[1].seqs = [12, 99]
    cover = [v for v in check_plan(plan, tiny_profile(), "p.json") if v.kind == "coverage"]
    assert [(v.pipeline, v.micro_batch) for v in cover] == [(0, 1)] and "99" in cover[0].message


def test_overfilled_micro_batch_is_located():
    plan = good_plan()
    plan.pipelines[0].micro_batches = [MicroBatch(seqs=[10, 11, 12])]  # 120 tokens > max_len 100
    plan.pipelines[0].estimate_s = 0.001 * (2500 + 1600 + 900) + 0.01 * 120 + 1.0
    vs = check_plan(plan, tiny_profile(), "p.json")
    assert [(v.kind, v.pipeline, v.micro_batch) for v in vs] == [("capacity", 0, 0)]
    assert "120 tokens > max_len 100" in vs[0].message


def test_seq1f1b_splits_raise_the_capacity_of_pp_pipelines():
    plan = good_plan()
    plan.batch.append(BatchSeq(id=15, length=100))
    plan.pipelines[1].micro_batches = [MicroBatch(seqs=[13, 14, 15])]  # 280 tokens > 1F1B max_len 200
    # 0.001*(14400+3600+10000) + 0.01*280 + 1 = 31.8; pp=2: 31.8 + 31.8
    plan.pipelines[1].estimate_s = plan.estimate.propagation_s = 63.6
    assert kinds(plan) == {"capacity"}
    # Seq1F1B with K splits on P stages: MaxLen * K*P / (P-1+K) = 200 * 8/5 = 320 for K=4, 266 for K=2
    plan.pipelines[1].seq1f1b_splits = 4
    assert kinds(plan) == set()
    plan.pipelines[1].seq1f1b_splits = 2
    assert kinds(plan) == {"capacity"}
    plan.pipelines[1].seq1f1b_splits, plan.pipelines[1].seq1f1b_max_len = 4, 999
    assert kinds(plan) == {"seq1f1b"}


def test_overlapping_and_out_of_range_ranks():
    plan = good_plan()
    plan.pipelines[1].ranks = [0, 2]
    vs = check_plan(plan, tiny_profile(), "p.json")
    assert [(v.kind, v.pipeline) for v in vs] == [("ranks", 1)] and "pipeline 0" in vs[0].message
    plan.pipelines[1].ranks = [1, 4]
    assert kinds(plan) == {"ranks"}


def test_too_many_gpus_and_wrong_rank_count():
    plan = good_plan()
    plan.gpus = 2  # pipelines need 3
    assert "gpus" in kinds(plan)
    plan = good_plan()
    plan.pipelines[1].ranks = [1, 2, 3]
    assert kinds(plan) == {"ranks"}


def test_scheme_not_in_profile_and_profile_mismatch():
    plan = good_plan()
    plan.pipelines[0].tp = 4
    plan.pipelines[0].ranks = [0, 3, 4, 5]
    plan.gpus = 8
    assert "scheme" in kinds(plan)
    plan = good_plan()
    plan.profile = "other"
    assert kinds(plan) == {"profile"}


def test_check_ranks_reports_each_problem():
    assert check_ranks([[0, 1], [2, 3]], 4) == []
    assert check_ranks([[0, 0]], 4) == [(0, "rank 0 listed 2 times")]
    assert check_ranks([[0, 1], [1, 2]], 4) == [(1, "rank 1 also used by pipeline 0")]
    assert check_ranks([[0, 5]], 4) == [(0, "ranks [5] out of range [0, 4)")]


# ---------------------------------------------------------------------------------- run folders / CLI
def write_run(tmp_path: Path, plan: Plan) -> tuple[Path, Path]:
    run = tmp_path / "run"
    write_model(run / "iter_000000.json", plan)
    strategies = Strategies(candidates=[{"name": "S0", "pipelines": [
        {"tp": 1, "pp": 1, "cp": 1, "ranks": [0]}, {"tp": 1, "pp": 2, "cp": 1, "ranks": [1, 2]}]}])
    write_model(run / "strategies.json", strategies)
    summary = Summary(profile="tiny", gpus=4, dataset="d", tokens_per_iter=300, seed=0, iterations=[
        IterationSummary(iteration=0, strategy="S0", estimate_s=38.4, solver_s=0.1, solver="x")])
    write_model(run / "summary.json", summary)
    profile = tmp_path / "tiny.json"
    profile.write_text(model_json(tiny_profile()))
    return run, profile


def test_run_folder_checks_summary_and_strategies(tmp_path):
    run, _ = write_run(tmp_path, good_plan())
    report = validate_path(run, tiny_profile())
    assert report.ok and report.plans == 1 and report.micro_batches == 4
    summary = json.loads((run / "summary.json").read_text())
    summary["iterations"][0]["estimate_s"] = 8.2
    summary["iterations"].append(dict(summary["iterations"][0], iteration=1))
    (run / "summary.json").write_text(json.dumps(summary))
    strategies = json.loads((run / "strategies.json").read_text())
    strategies["candidates"][0]["pipelines"][0]["ranks"] = [3]
    (run / "strategies.json").write_text(json.dumps(strategies))
    report = validate_path(run, tiny_profile())
    assert sorted(v.kind for v in report.violations) == ["strategy", "summary", "summary"]


def test_cli_exit_codes_and_located_messages(tmp_path):
    plan = good_plan()
    run, profile = write_run(tmp_path, plan)
    ok = hp("validate", run, "--profile", profile)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    plan.pipelines[0].micro_batches[0].seqs = [10, 11, 12]
    plan.pipelines[0].micro_batches[1].seqs = [12]
    write_model(run / "iter_000000.json", plan)
    bad = hp("validate", run / "iter_000000.json", "--profile", profile, "--json")
    assert bad.returncode == 1
    report = json.loads(bad.stdout)
    located = {(v["kind"], v["pipeline"], v["micro_batch"]) for v in report["violations"]}
    assert ("capacity", 0, 0) in located and any(k == "coverage" for k, _, _ in located)
    assert all(v["file"].endswith("iter_000000.json") for v in report["violations"])


@pytest.mark.parametrize("content", ["{not json", '{"schema": "hydraplan.plan/v1", "iteration": -1}'])
def test_cli_unreadable_plan_exits_2_with_one_line(tmp_path, content):
    _, profile = write_run(tmp_path, good_plan())
    broken = tmp_path / "broken.json"
    broken.write_text(content)
    r = hp("validate", broken, "--profile", profile)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "broken.json" in r.stderr
