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


# Megatron-LM's flags, read in megatron/training/arguments.py and the config dataclasses it turns into flags
# (ModelParallelConfig, TransformerConfig, TrainingConfig) at main d98e8a64dd and dev d48bd6be0a, 2026-08-21/22
MEGATRON_FLAGS = {
    "both": {"--tensor-model-parallel-size", "--sequence-parallel", "--pipeline-model-parallel-size",
             "--context-parallel-size", "--use-distributed-optimizer", "--recompute-granularity", "--recompute-method",
             "--recompute-num-layers", "--max-seqlen-per-dp-cp-rank", "--calculate-per-token-loss", "--dataloader-type",
             "--seq-length", "--micro-batch-size", "--global-batch-size"},
    "main": {"--hybrid-context-parallel"},
    "dev": {"--sequence-packing-scheduler", "--dynamic-context-parallel", "--min-dynamic-context-parallel-size"},
}
SEAM_MEGATRON = {"hybrid_cp": "main", "packing": "dev", "dynamic_cp": "dev"}


def suggest_json(*extra: str) -> dict:
    result = CliRunner().invoke(app, [*ARGS, *extra, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_suggest_gives_the_fastest_tp_and_its_flags():
    out = suggest_json()
    hybrid = out["seams"]["hybrid_cp"]
    ours = {r["tp"]: r for r in out["hybrid_cp_runs"] if r["method"] == "hydraplan-hcp" and r["mean_iteration_s"]}
    assert hybrid["tp"] == min(ours, key=lambda tp: ours[tp]["mean_iteration_s"])
    assert f"--tensor-model-parallel-size {hybrid['tp']} " in hybrid["flags"]
    assert f"--max-seqlen-per-dp-cp-rank {hybrid['max_seqlen_per_dp_cp_rank']} " in hybrid["flags"]
    # the figure is what the plugin's schedules cost on the same batches, recomputed here
    profile = load_profile("h100-llama2-7b")
    tp, limit = hybrid["tp"], hybrid["max_seqlen_per_dp_cp_rank"]
    target = HybridCP.of(profile, tp=tp, dpcp=16 // tp, max_seqlen_per_rank=limit)
    times = [hybrid_cp_time(target, schedule_hybrid_cp(b.lengths, profile=profile, tp=tp, dpcp=16 // tp,
                                                       max_seqlen_per_rank=limit), b.lengths)
             for b in sample_iterations(load_dataset("builtin:prolong", 16384), 60_000, 2, 0)]
    assert abs(hybrid["mean_iteration_s"] - sum(times) / 2) < 1e-9
    assert out["use"] == min(out["seams"], key=lambda s: out["seams"][s]["mean_iteration_s"])


def test_suggest_scores_every_seam_on_propagation_and_packing_with_the_recompute_asked_for():
    """One objective for every row (hybrid CP was propagation, packing end to end beside it), and packing layouts
    of the recompute mode asked for (they were always without recomputation)."""
    from hydraplan.core.executors import MegatronPacking
    from hydraplan.integrations.megatron import schedule_packing

    out = suggest_json("--recompute", "selective")
    assert out["objective"] == "propagation"
    packing = out["seams"]["packing"]
    label = packing["setting"]  # <tp,pp,cp,selective>xdp
    tp, pp, cp, mode = label[1:label.index(">")].split(",")
    tp, pp, cp, dp = int(tp), int(pp), int(cp), int(label.rsplit("x", 1)[1])
    assert mode == "selective" and "--recompute-granularity selective" in packing["flags"]
    profile = load_profile("h100-llama2-7b")
    capacity = packing["max_seqlen_per_dp_cp_rank"] * cp
    target = MegatronPacking.of(profile, tp=tp, pp=pp, cp=cp, dp=dp, capacity=capacity, multiple=dp,
                                recompute="selective")
    times = [max(target.propagation_s(schedule_packing(b.lengths, profile=profile, tp=tp, pp=pp, cp=cp, dp=dp,
                                                       capacity=capacity, recompute="selective"), b.lengths))
             for b in sample_iterations(load_dataset("builtin:prolong", 16384), 60_000, 2, 0)]
    assert packing["mean_iteration_s"] == pytest.approx(sum(times) / 2, rel=1e-9)


def test_suggest_prints_complete_megatron_flags_each_on_one_line_when_piped():
    """Piped (not a terminal: 80 columns to rich), each seam's flags are one line to paste: the layout, the
    distributed optimizer, the recompute granularity that gave the limits, the seam's flags and the batch flags,
    every one a flag of the Megatron version that has the seam."""
    result = CliRunner().invoke(app, [*ARGS, "--recompute", "full"])
    assert result.exit_code == 0, result.output
    text = result.output.splitlines()
    seams = suggest_json("--recompute", "full")["seams"]
    assert set(seams) >= {"hybrid_cp", "packing", "dynamic_cp"}
    for seam, pick in seams.items():
        flags = pick["flags"]
        assert f"  {flags}" in text  # printed whole on a line of its own
        assert len(flags) > 80
        names = [w for w in flags.split() if w.startswith("--")]
        assert set(names) <= MEGATRON_FLAGS["both"] | MEGATRON_FLAGS[SEAM_MEGATRON[seam]], set(names)
        for needed in ("--use-distributed-optimizer", "--recompute-granularity full --recompute-method uniform "
                       "--recompute-num-layers 1", "--seq-length 16384", "--micro-batch-size 1", "--global-batch-size"):
            assert needed in flags, (seam, needed)
        words = flags.split()
        tp = int(words[words.index("--tensor-model-parallel-size") + 1])
        cp = int(words[words.index("--context-parallel-size") + 1])
        pp = int(words[words.index("--pipeline-model-parallel-size") + 1])
        assert int(words[words.index("--global-batch-size") + 1]) % (16 // (tp * cp * pp)) == 0
        assert ("--sequence-parallel" in words) == (tp > 1)
    assert "--hybrid-context-parallel" in seams["hybrid_cp"]["flags"]
    assert "--dynamic-context-parallel --sequence-packing-scheduler default_dynamic_cp" in seams["dynamic_cp"]["flags"]
    assert "--min-dynamic-context-parallel-size" in seams["dynamic_cp"]["flags"]
    assert "--sequence-packing-scheduler dp_balanced" in seams["packing"]["flags"]


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


def _megatron_tree(root, mark: str) -> None:
    """A stand-in Megatron package under `root` whose data_schedule says where it came from."""
    pkg = root / "megatron" / "core" / "datasets"
    pkg.mkdir(parents=True)
    for d in (root / "megatron", root / "megatron" / "core", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "data_schedule.py").write_text(f"MARK = {mark!r}\n\nclass BalancedCPScheduler:\n"
                                          "    def __init__(self, max_seq_len_per_rank, dp_cp_group):\n        pass\n")


@pytest.mark.parametrize("installed", [False, True])
def test_example_puts_the_checkout_first_then_installs_and_runs_megatrons_script(tmp_path, monkeypatch, installed):
    """examples/megatron_plugin.py runs MEGATRON_LM's pretrain_gpt.py with its arguments after install(), and
    install() patches that checkout's Megatron: with no Megatron installed (it failed with ModuleNotFoundError) and
    with another one installed (it patched that one, and the script ran it instead of the checkout)."""
    checkout = tmp_path / "Megatron-LM"
    _megatron_tree(checkout, "checkout")
    (checkout / "pretrain_gpt.py").write_text(
        "import sys\nfrom pathlib import Path\nfrom megatron.core.datasets import data_schedule as d\n"
        "Path(sys.argv[0]).with_name('seen').write_text(f'{d.MARK} {d.BalancedCPScheduler.__name__} {sys.argv[1]}')\n")
    monkeypatch.setattr(sys, "path", list(sys.path))  # the example puts the checkout first: undone after the test
    if installed:
        _megatron_tree(tmp_path / "site-packages", "installed")
        sys.path.insert(0, str(tmp_path / "site-packages"))
    monkeypatch.setenv("MEGATRON_LM", str(checkout))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    for name in [m for m in sys.modules if m == "megatron" or m.startswith("megatron.")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        assert _example().main(["--", "--hybrid-context-parallel"]) == 0
        assert (checkout / "seen").read_text() == "checkout HydraplanCPScheduler --hybrid-context-parallel"
    finally:
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
