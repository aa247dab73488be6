"""`hydraplan megatron suggest`: the settings it gives are the fastest of what it measured, in Megatron's flags,
and a user mistake is one line and exit 2."""

from __future__ import annotations

import json
import sys

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
