"""Placement findings: TP/CP groups across nodes and candidates that cannot hold the context length are
warnings in validate (file, pipeline, ranks; exit 0) and before `pack` plans."""

import json

import numpy as np
from helpers import hp, write_run_inputs

from hydraplan.schema import Strategies
from hydraplan.solve.placement import split_groups


def test_split_groups_by_hand():
    # ranks[(s*cp + c)*tp + t]; 8 GPUs per node
    assert split_groups(list(range(4, 12)), 8, 1, 1, 8) == [
        "stage 0 TP group on ranks [4, 5, 6, 7, 8, 9, 10, 11] spans nodes [0, 1] (8 GPUs per node)"]
    assert split_groups(list(range(8, 16)), 8, 1, 1, 8) == []
    assert split_groups(list(range(0, 16)), 16, 1, 1, 8) == []  # wider than a node: must span
    # tp=2, cp=2 at 4 per node: stage 0 uses [2,3 | 4,5]: TP groups fit, the CP groups {2,4} {3,5} span
    assert split_groups([2, 3, 4, 5], 2, 1, 2, 4) == [
        "stage 0 CP group on ranks [2, 4] spans nodes [0, 1] (4 GPUs per node)",
        "stage 0 CP group on ranks [3, 5] spans nodes [0, 1] (4 GPUs per node)"]
    assert split_groups([0, 1, 4, 5], 2, 2, 1, 4) == []  # pipeline stages on different nodes are fine
    brute = [g for g in (list(r) for r in np.arange(16).reshape(8, 2)) if g[0] // 4 != g[1] // 4]
    assert brute == []  # aligned pairs never span: the same holds for the function on every stage
    assert split_groups(list(range(16)), 2, 8, 1, 4) == []


def test_pack_warns_and_validate_reports_file_pipeline_and_ranks(tmp_path):
    rng = np.random.default_rng(3)
    lengths = np.minimum(rng.lognormal(6.0, 1.2, 2000).astype(np.int64) + 1, 4000)
    profile, data, strat = write_run_inputs(tmp_path, lengths, Strategies(candidates=[
        {"name": "split", "pipelines": [{"tp": 2, "pp": 1, "cp": 1, "ranks": [3, 4]},
                                        *[{"tp": 1, "pp": 1, "cp": 1}] * 6]},
        {"name": "short", "pipelines": [{"tp": 1, "pp": 1, "cp": 1}] * 8},
    ]))
    out = tmp_path / "run"
    r = hp("pack", "--profile", profile, "--dataset", data, "--gpus", "8", "--tokens-per-iter", "15000", "--iterations",
           "2", "--out", out, "--workers", "1", "--strategies", strat)
    assert r.returncode == 0, r.stderr
    warned = [x for x in r.stderr.splitlines() if x.startswith("hydraplan: warning: ")]
    assert any("candidate split pipeline 0: stage 0 TP group on ranks [3, 4] spans nodes [0, 1]" in x for x in warned)
    assert any("candidate short holds at most 2048 tokens, below the context length" in x for x in warned)

    v = hp("validate", out, "--profile", profile, "--json")
    assert v.returncode == 0, v.stdout  # warnings do not fail validation
    report = json.loads(v.stdout)
    assert report["ok"] and report["violations"] == []
    kinds = {(w["kind"], w["file"].rsplit("/", 1)[-1], w["pipeline"]) for w in report["warnings"]}
    assert ("context", "strategies.json", None) in kinds
    # a plan whose ranks are shifted by one GPU: every aligned TP pair at 2k+1, 2k+2 with 2k+1 = 3 spans nodes
    plan = json.loads((out / "iter_000000.json").read_text())
    for p in plan["pipelines"]:
        p["ranks"] = [(r + 1) % 8 for r in p["ranks"]]
    shifted = tmp_path / "iter_000000.json"
    shifted.write_text(json.dumps(plan))
    v = hp("validate", shifted, "--profile", profile, "--json")
    assert v.returncode == 0, v.stdout
    found = {(w["file"], w["pipeline"], w["message"]) for w in json.loads(v.stdout)["warnings"]}
    want = {(str(shifted), i, f"stage 0 TP group on ranks {p['ranks']} spans nodes "
             f"{sorted({r // 4 for r in p['ranks']})} (4 GPUs per node)")
            for i, p in enumerate(plan["pipelines"]) if p["tp"] == 2 and p["ranks"][0] // 4 != p["ranks"][1] // 4}
    assert found == want
