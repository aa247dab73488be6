"""`hydraplan megatron suggest`: the settings it gives are the fastest of what it measured, in Megatron's flags,
and a user mistake is one line and exit 2."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from hydraplan.app.cli import app, main
from hydraplan.core.executors import HybridCP, hybrid_cp_time
from hydraplan.integrations.megatron import schedule_hybrid_cp
from hydraplan.store.datasets import load_dataset, sample_iterations
from hydraplan.store.profiles import load_profile

ARGS = ["megatron", "suggest", "--profile", "h100-llama2-7b", "--dataset", "builtin:prolong", "--gpus", "16",
        "--context-len", "16384", "--tokens-per-iter", "60000", "--iterations", "2"]


def test_suggest_gives_the_fastest_tp_and_its_flags():
    result = CliRunner().invoke(app, [*ARGS, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    ours = {r["tp"]: r for r in out["runs"] if r["method"] == "hydraplan-hcp" and r["mean_iteration_s"] is not None}
    assert out["tp"] == min(ours, key=lambda tp: ours[tp]["mean_iteration_s"])
    assert f"--tensor-model-parallel-size {out['tp']} " in out["flags"]
    assert f"--max-seqlen-per-dp-cp-rank {out['max_seqlen_per_dp_cp_rank']} " in out["flags"]
    # the figure is what the plugin's schedules cost on the same batches, recomputed here
    profile = load_profile("h100-llama2-7b")
    tp, limit = out["tp"], out["max_seqlen_per_dp_cp_rank"]
    target = HybridCP.of(profile, tp=tp, dpcp=16 // tp, max_seqlen_per_rank=limit)
    times = [hybrid_cp_time(target, schedule_hybrid_cp(b.lengths, profile=profile, tp=tp, dpcp=16 // tp,
                                                       max_seqlen_per_rank=limit), b.lengths)
             for b in sample_iterations(load_dataset("builtin:prolong", 16384), 60_000, 2, 0)]
    assert abs(ours[tp]["mean_iteration_s"] - sum(times) / 2) < 1e-9
    packing = out["packing"]
    assert packing["mean_iteration_s"] <= packing["dp_balanced_best_s"] * (1 + 1e-12)
    assert "--context-parallel-size" in packing["flags"]


def test_suggest_bad_recompute_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["hydraplan", *ARGS, "--recompute", "some"])
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "--recompute" in err and "'some'" in err


def _example():
    import importlib.util

    from hydraplan.store.paths import ROOT

    spec = importlib.util.spec_from_file_location("megatron_plugin", ROOT / "examples" / "megatron_plugin.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_installs_before_running_megatrons_script(tmp_path, monkeypatch):
    """examples/megatron_plugin.py runs pretrain_gpt.py with its arguments after install(): a stand-in Megatron-LM
    checkout whose script records which scheduler HybridCPDataLoaderWrapper would build and the arguments."""
    pkg = tmp_path / "megatron" / "core" / "datasets"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "megatron", tmp_path / "megatron" / "core", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "data_schedule.py").write_text("class BalancedCPScheduler:\n    pass\n")
    (tmp_path / "pretrain_gpt.py").write_text(
        "import sys\nfrom pathlib import Path\nfrom megatron.core.datasets import data_schedule\n"
        "Path(sys.argv[0]).with_name('seen').write_text(data_schedule.BalancedCPScheduler.__name__ + ' ' + sys.argv[1])\n")
    monkeypatch.setenv("MEGATRON_LM", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    for name in [m for m in sys.modules if m == "megatron" or m.startswith("megatron.")]:
        monkeypatch.delitem(sys.modules, name)
    assert _example().main(["--", "--hybrid-context-parallel"]) == 0
    assert (tmp_path / "seen").read_text() == "HydraplanCPScheduler --hybrid-context-parallel"
    for name in [m for m in sys.modules if m == "megatron" or m.startswith("megatron.")]:
        sys.modules.pop(name)  # the stand-ins this test imported


def test_example_dry_run_is_faster_than_megatrons_and_without_megatron_says_so(monkeypatch, tmp_path, capsys):
    r = _example().dry_run("h100-llama2-7b")
    assert r["sequences"] > 100 and r["hydraplan_s"] < r["megatron_s"] and r["max_seqlen_per_dp_cp_rank"] == 41931
    monkeypatch.setenv("MEGATRON_LM", str(tmp_path))
    assert _example().main([]) == 2 and "pretrain_gpt.py: no such file" in capsys.readouterr().err


def test_compare_runs_the_seam_methods_as_their_executors_score_them():
    """`compare --methods megatron-hcp,...`: each at its fastest TP or layout, every iteration's estimate the
    executor's (hybrid CP: the round simulated; packing: the replicas' pipeline times; dynamic CP: its micro-batches
    chained on every rank, at the fastest TP and per-rank limit)."""
    from hydraplan.core.executors import DynamicCP, MegatronPacking, dynamic_cp_padded, dynamic_cp_time
    from hydraplan.methods.compare import CompareConfig, run_compare
    from hydraplan.methods.megatron_seams import SEAM_METHODS, rank_limit
    from hydraplan.solve.megatron.balanced_cp import balanced_cp_schedule
    from hydraplan.solve.megatron.default_dynamic_cp import default_dynamic_cp_schedule
    from hydraplan.solve.megatron.dp_balanced import dp_balanced_schedule

    cfg = CompareConfig(profile="h100-llama2-7b", dataset="builtin:prolong", gpus=16, tokens_per_iter=60_000,
                        iterations=2, context_len=16384, methods=SEAM_METHODS, objective="propagation")
    out = run_compare(cfg)
    res = out.result.methods
    profile = load_profile("h100-llama2-7b")
    tp = int(out.runs["megatron-hcp"].static.removeprefix("TP "))
    limit = rank_limit(profile, 16, tp)
    target = HybridCP.of(profile, tp=tp, dpcp=16 // tp, max_seqlen_per_rank=limit)
    want = [hybrid_cp_time(target, balanced_cp_schedule(b, limit, 16 // tp), b) for b in out.batches]
    assert res["megatron-hcp"].iterations_s == pytest.approx(want, rel=1e-12)
    layout = out.runs["megatron-dp-balanced"].static  # <tp,pp,cp>xdp
    tp, pp, cp = map(int, layout[1:layout.index(">")].split(","))
    dp = int(layout.rsplit("x", 1)[1])
    scheme = out.cluster.scheme((tp, pp, cp))
    cap = scheme.max_len // cp * cp
    pk = MegatronPacking.of(profile, tp=tp, pp=pp, cp=cp, dp=dp, capacity=cap, multiple=dp)
    want = [max(pk.propagation_s(dp_balanced_schedule(b.tolist(), cap, dp, cp), b)) for b in out.batches]
    assert res["megatron-dp-balanced"].iterations_s == pytest.approx(want, rel=1e-12)
    assert res["hydraplan-hcp"].mean_estimate_s < res["megatron-hcp"].mean_estimate_s
    assert res["hydraplan-packing"].mean_estimate_s <= res["megatron-dp-balanced"].mean_estimate_s
    # dynamic CP: Megatron at its fastest TP and per-rank limit, on the lengths its varlen datasets pad
    tp_part, limit_part = out.runs["megatron-dcp"].static.split(", ")
    tp, limit = int(tp_part.removeprefix("TP ")), int(limit_part.removesuffix(" per rank"))
    target = DynamicCP.of(profile, tp=tp, dpcp=16 // tp, max_seqlen_per_rank=limit)
    padded = [dynamic_cp_padded(b, 16 // tp, tp) for b in out.batches]
    want = [dynamic_cp_time(target, default_dynamic_cp_schedule(p, dpcp=16 // tp, max_seqlen_per_rank=limit), p)
            for p in padded]
    assert res["megatron-dcp"].iterations_s == pytest.approx(want, rel=1e-12)
    assert res["hydraplan-dcp"].mean_estimate_s < res["megatron-dcp"].mean_estimate_s
