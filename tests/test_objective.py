"""The objective: end-to-end fields of plans (validate recomputes them and rejects wrong or missing ones); the
Planner chooses by iteration_s (a case where propagation and end to end pick different candidates);
`--objective propagation` plans exactly as without a sync model; and one module interprets the objective."""

import ast
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import hp, tiny_profile

from hydraplan.app.config import PackConfig
from hydraplan.app.pack import run_pack
from hydraplan.app.validate import check_plan, validate_path
from hydraplan.engine.planner import Planner
from hydraplan.schema import ModelInfo, Network, Strategies
from hydraplan.store.fileio import model_json, write_model

PLANNER = Path(__file__).resolve().parents[1] / "planner"
OBJECTIVE_MODULE = "core/cluster.py"  # Cluster and the functions beside it: the one place that reads the objective
CHARGES_MODULE = "core/sync.py"  # sync.charges: the one place an omitted transfer becomes its encoding, zeros


def planner_modules():
    for path in sorted(PLANNER.rglob("*.py")):
        yield path.relative_to(PLANNER).as_posix(), ast.parse(path.read_text())


def names_in(node: ast.AST) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node) if isinstance(n, ast.Name | ast.Attribute)}


def test_only_the_objective_module_branches_on_the_objective():
    """No `objective == ...`, no comparison with "end-to-end" / "propagation" and no `.end_to_end` outside
    core/cluster.py: summaries, baselines and reports score through Cluster.score / ranked / objective_of."""
    found = []
    for where, tree in planner_modules():
        if where == OBJECTIVE_MODULE:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Constant) and s.value in ("end-to-end", "propagation")
                       or isinstance(s, ast.Attribute) and s.attr == "objective"
                       or isinstance(s, ast.Name) and s.id == "objective" for s in sides):
                    found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.Attribute) and node.attr in ("end_to_end", "is_end_to_end"):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


def test_no_transfer_has_one_encoding():
    """What the objective charges for sync is an array, zeros where nothing is charged: no module below the
    cluster tests a transfer for None, except where sync.charges turns an omitted argument into zeros."""
    found = []
    for where, tree in planner_modules():
        if where == CHARGES_MODULE:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(isinstance(op, ast.Is | ast.IsNot) for op in node.ops) \
                    and any("transfer" in n or n.startswith("t_") for n in names_in(node)):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


def synced_profile():
    """tiny_profile with a sync model: 4 GPUs in one node at 10 GB/s, 1e9 parameters, so a <1,1,1> GPU moves
    2 GB per direction (t = 0.2 s) and a <2,1,1> GPU half of it (0.1 s)."""
    p = tiny_profile()
    return p.model_copy(update={"model": ModelInfo(name="m", layers=2, hidden=8, params=10**9),
                                "network": Network(intra_node_GBps=10.0, inter_node_GBps=5.0)})


def two_candidates() -> Strategies:
    return Strategies(candidates=[
        {"name": "narrow", "pipelines": [{"tp": 1, "pp": 1, "cp": 1}] * 4},
        {"name": "wide", "pipelines": [{"tp": 2, "pp": 1, "cp": 1}] * 2}])


def f(t, p):
    return p + max(0.0, t - p / 3) + max(0.0, t - 2 * p / 3)


def test_selection_is_by_iteration_s_where_propagation_picks_otherwise():
    """8 sequences of 1000 tokens: 4x<1,1,1> propagates in ~0.214 s, 2x<2,1,1> in ~0.244 s, but the narrow
    pipelines expose ~0.19 s of their 0.2 s pull/push and the wide ones only ~0.0 s of 0.1 s."""
    lengths = np.full(8, 1000)
    prop = Planner(synced_profile(), two_candidates(), 4, objective="propagation").plan(lengths)
    e2e = Planner(synced_profile(), two_candidates(), 4).plan(lengths)
    assert prop.strategy == "narrow" and e2e.strategy == "wide"
    assert prop.estimate.propagation_s < e2e.estimate.propagation_s
    assert e2e.estimate.iteration_s < prop.estimate.iteration_s
    # the fields are the docs/formats.md formula, per pipeline and for the plan
    for plan, t in ((prop, 0.2), (e2e, 0.1)):
        for p in plan.pipelines:
            assert p.sync_s == pytest.approx(f(t, p.estimate_s) - p.estimate_s, rel=1e-12)
        slowest = max(f(t, p.estimate_s) for p in plan.pipelines)
        assert plan.estimate.iteration_s == pytest.approx(slowest, rel=1e-12)
        j = [f(t, p.estimate_s) for p in plan.pipelines].index(slowest)
        assert plan.estimate.sync_s == pytest.approx(plan.pipelines[j].sync_s)
        assert check_plan(plan, synced_profile()) == []


def test_validate_rejects_a_wrong_or_missing_sync_field():
    plan = Planner(synced_profile(), two_candidates(), 4).plan(np.full(8, 1000))
    wrong = plan.model_copy(deep=True)
    wrong.estimate.sync_s = plan.estimate.sync_s + 0.05
    vs = check_plan(wrong, synced_profile(), "iter_000000.json")
    assert [(v.kind, v.file) for v in vs] == [("sync", "iter_000000.json")]
    assert "field estimate.sync_s" in vs[0].message and repr(wrong.estimate.sync_s) in vs[0].message
    wrong = plan.model_copy(deep=True)
    wrong.pipelines[1].sync_s = 0.0
    vs = check_plan(wrong, synced_profile())
    assert [(v.kind, v.pipeline) for v in vs] == [("sync", 1)] and "pipelines.1.sync_s: 0.0" in vs[0].message
    missing = plan.model_copy(deep=True)
    missing.estimate.iteration_s = None
    vs = check_plan(missing, synced_profile())
    assert len(vs) == 1 and "field estimate.iteration_s: missing" in vs[0].message
    # without a sync model nothing is required, but a present field must still be 0 sync
    bare = tiny_profile()
    assert check_plan(missing, bare) != []  # its sync_s fields are not 0
    missing.estimate.sync_s = missing.estimate.iteration_s = None
    for p in missing.pipelines:
        p.sync_s = None
    assert check_plan(missing, bare) == []


def test_cli_rejects_a_wrong_sync_s_naming_file_field_and_value(tmp_path):
    plan = Planner(synced_profile(), two_candidates(), 4).plan(np.full(8, 1000))
    plan.estimate.sync_s = 0.5
    write_model(tmp_path / "iter_000000.json", plan)
    profile = tmp_path / "p.json"
    profile.write_text(model_json(synced_profile()))
    r = hp("validate", tmp_path, "--profile", profile, "--json")
    assert r.returncode == 1
    (v,) = json.loads(r.stdout)["violations"]
    assert v["file"].endswith("iter_000000.json") and "estimate.sync_s: 0.5" in v["message"]


def pack(tmp_path: Path, objective: str, profile_file: Path, data: Path, name: str, resume: bool = False):
    return run_pack(PackConfig(profile=str(profile_file), dataset=str(data), gpus=4, tokens_per_iter=6000,
                                iterations=3, out=tmp_path / name, workers=1, objective=objective, resume=resume))


def test_propagation_objective_plans_as_without_a_sync_model_and_resume_needs_the_same_objective(tmp_path):
    from hydraplan.core.errors import UserError

    rng = np.random.default_rng(0)
    data = tmp_path / "lengths.txt"
    data.write_text("\n".join(map(str, rng.integers(50, 4000, size=300))) + "\n")
    synced, bare = tmp_path / "synced.json", tmp_path / "bare.json"
    synced.write_text(model_json(synced_profile().model_copy(update={"name": "tiny"})))
    bare.write_text(model_json(tiny_profile()))
    a = pack(tmp_path, "propagation", synced, data, "a")
    pack(tmp_path, "end-to-end", bare, data, "b")  # no sync model: end to end is propagation
    for i in range(3):
        pa = json.loads((tmp_path / "a" / f"iter_{i:06d}.json").read_text())
        pb = json.loads((tmp_path / "b" / f"iter_{i:06d}.json").read_text())
        assert pa["pipelines"] and [p["micro_batches"] for p in pa["pipelines"]] == [p["micro_batches"] for p in pb["pipelines"]]
        assert pa["strategy"] == pb["strategy"] and pa["estimate"]["propagation_s"] == pb["estimate"]["propagation_s"]
    assert a.objective == "propagation" and a.mean_iteration_s >= a.mean_estimate_s
    assert validate_path(tmp_path / "a", synced_profile().model_copy(update={"name": "tiny"})).ok
    e2e = pack(tmp_path, "end-to-end", synced, data, "c")
    assert e2e.mean_iteration_s <= a.mean_iteration_s * (1 + 1e-9)  # the objective it minimizes
    assert all(i.baselines_iteration_s["megatron"] >= i.baselines_s["megatron"] for i in e2e.iterations)
    with pytest.raises(UserError, match="args.objective: the run was started with 'end-to-end', now 'propagation'"):
        pack(tmp_path, "propagation", synced, data, "c", resume=True)
