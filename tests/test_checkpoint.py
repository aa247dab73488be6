"""Per-owner initialization, --save / --resume (a resumed run equals an uninterrupted one, bit for bit) and
the one-line refusals of a checkpoint this run cannot resume."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import make_plan
from test_run_plan import _torchrun

import hydraplan.runtime.model as model
from hydraplan.runtime import checkpoint
from hydraplan.runtime.lnk import owner_ranges
from hydraplan.runtime.model import CONFIGS, init_full, init_range, param_specs
from hydraplan.runtime.optim import ShardedMaster
from hydraplan.runtime.run_plan import main
from hydraplan.store.fileio import write_model

TINY = CONFIGS["tiny"]


# ------------------------------------------------------------------------------------ initialization
@pytest.mark.parametrize("lo,hi", [(0, 50), (3, 4), (6, 7), (7, 8), (13, 29), (48, 50), (20, 20)])
def test_any_range_is_the_same_slice_of_the_full_value(monkeypatch, lo, hi):
    monkeypatch.setattr(model, "INIT_CHUNK", 7)  # ranges cross many chunk boundaries
    spec = model.ParamSpec("w", (5, 10), True, 0, "normal")
    full = init_full(spec, 3, 11, torch.float64).reshape(-1)
    torch.testing.assert_close(init_range(spec, 3, 11, lo, hi, torch.float64), full[lo:hi], rtol=0, atol=0)
    assert not torch.equal(init_full(spec, 4, 11, torch.float64), init_full(spec, 3, 11, torch.float64).reshape(5, 10))


def test_an_owner_draws_only_the_chunks_of_its_shard(monkeypatch):
    monkeypatch.setattr(model, "INIT_CHUNK", 64)
    drawn = []
    randn = torch.randn

    def spy(n, *a, **kw):
        drawn.append(n)
        return randn(n, *a, **kw)

    monkeypatch.setattr(torch, "randn", spy)
    specs = param_specs(TINY)
    numels = np.array([s.numel for s in specs])
    lo, hi = owner_ranges(numels, 8)
    ShardedMaster(TINY, 3, 8, torch.float32, 0, 1e-3)
    normal = np.array([s.init == "normal" for s in specs])
    own = int((hi[3] - lo[3])[normal].sum())
    assert own <= sum(drawn) <= own + 2 * 64 * normal.sum()
    assert sum(drawn) < numels.sum() / 4  # far from the whole model


@pytest.mark.parametrize("world", [1, 3, 5])
def test_owner_shards_put_together_are_the_reference_initialization(world):
    specs = param_specs(TINY)
    lo, hi = owner_ranges(np.array([s.numel for s in specs]), world)
    shards = [ShardedMaster(TINY, r, world, torch.float64, 5, 1e-3).weights.detach() for r in range(world)]
    offsets = [np.concatenate(([0], np.cumsum(hi[r] - lo[r]))) for r in range(world)]
    for i, s in enumerate(specs):
        got = torch.cat([shards[r][offsets[r][i]:offsets[r][i + 1]] for r in range(world)])
        torch.testing.assert_close(got, init_full(s, i, 5, torch.float64).reshape(-1), rtol=0, atol=0)


# ------------------------------------------------------------------------------------ save / resume
def _no_torchrun_env(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)


def _plans(folder: Path, gpus: int, n: int) -> Path:
    folder.mkdir()
    shapes = [[[5, 3], [7]], [[4, 4, 2]], [[9], [2, 6]], [[3, 3, 3]]]
    for it in range(n):
        if gpus == 1:
            p = make_plan(it, "S", [(1, 1, [0], shapes[it % 4])], gpus=1, first_id=100 * it)
        else:  # a different <TP,PP> mix every iteration, as a planner would produce
            p = [make_plan(it, "A", [(2, 1, [0, 1], [[9, 5], [12]]), (1, 1, [2], [[7, 3, 4]]), (1, 1, [3], [[6], [8]])],
                           first_id=100 * it),
                 make_plan(it, "B", [(1, 2, [0, 1], [[9, 5], [12], [3, 3]]), (1, 2, [2, 3], [[7, 3, 4], [6]])],
                           first_id=100 * it),
                 make_plan(it, "C", [(2, 2, [3, 2, 1, 0], [[4, 4], [11], [2, 2, 2]])], first_id=100 * it)][it % 3]
        write_model(folder / f"iter_{it:06d}.json", p)
    return folder


def _shards(folder: Path, world: int) -> list[dict]:
    return [checkpoint.load(folder, r, world) for r in range(world)]


def _assert_identical(a: list[dict], b: list[dict]) -> None:
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x["weights"], y["weights"])
        sx, sy = x["optimizer"]["state"][0], y["optimizer"]["state"][0]
        assert sx.keys() == sy.keys() == {"step", "exp_avg", "exp_avg_sq"}
        for k in sx:
            assert torch.equal(sx[k], sy[k]), k


def test_resumed_run_equals_uninterrupted_run(tmp_path, monkeypatch, capsys):
    """bf16 compute, fp32 masters: 3 iterations straight vs 1, then 2 resumed, bit for bit."""
    _no_torchrun_env(monkeypatch)
    dtype = "bf16"
    plans = _plans(tmp_path / "plans", 1, 3)
    assert main([str(plans), "--dtype", dtype, "--save", str(tmp_path / "straight")]) == 0
    assert main([str(plans), "--dtype", dtype, "--iterations", "1", "--save", str(tmp_path / "half")]) == 0
    assert main([str(plans), "--dtype", dtype, "--resume", str(tmp_path / "half"), "--save", str(tmp_path / "resumed")]) == 0
    out = capsys.readouterr().out
    assert "resume: " in out and "after iteration 0, 2 plans to go" in out
    assert re.findall(r"^iteration (\d+) ", out, re.M) == ["0", "1", "2", "0", "1", "2"]
    straight, resumed, half = (_shards(tmp_path / d, 1) for d in ("straight", "resumed", "half"))
    _assert_identical(straight, resumed)
    assert int(straight[0]["optimizer"]["state"][0]["step"]) == 3
    assert not torch.equal(half[0]["weights"], straight[0]["weights"])  # the comparison can fail
    manifest = json.loads((tmp_path / "resumed" / "manifest.json").read_text())
    assert manifest["world_size"] == 1 and manifest["iteration"] == 2 and manifest["model"]["hidden"] == TINY.hidden


def _edit_manifest(folder: Path, **changes):
    m = json.loads((folder / "manifest.json").read_text())
    for k, v in changes.items():
        if k == "hidden":
            m["model"]["hidden"] = v
        else:
            m[k] = v
    (folder / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("change,args,message", [
    ({"world_size": 2}, [], "field world_size: saved by 2 ranks, this run has 1"),
    ({"hidden": 64}, [], "field model: saved model differs from this run's tiny in hidden (64 vs 32)"),
    ({}, ["--dtype", "fp64"], "field master_dtype: 'float32', this run's masters are 'float64'"),
    ({}, ["--verify"], "--verify and --resume: give one"),
    (None, [], "manifest.json: no such file"),
])
def test_resume_refuses_another_world_or_model_in_one_line(tmp_path, monkeypatch, capsys, change, args, message):
    _no_torchrun_env(monkeypatch)
    plans = _plans(tmp_path / "plans", 1, 2)
    assert main([str(plans), "--iterations", "1", "--save", str(tmp_path / "ck")]) == 0
    if change is None:
        (tmp_path / "ck" / "manifest.json").unlink()
    else:
        _edit_manifest(tmp_path / "ck", **change)
    capsys.readouterr()
    assert main([str(plans), "--resume", str(tmp_path / "ck"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.slow
def test_resume_on_four_ranks_with_changing_strategies(tmp_path):
    """TP, PP and mixed pipelines change between iterations; 3 iterations straight vs 1 then 2 resumed."""
    plans = _plans(tmp_path / "plans", 4, 3)
    runs = [("straight", []), ("half", ["--iterations", "1"]), ("resumed", ["--resume", str(tmp_path / "half")])]
    for name, extra in runs:
        res = _torchrun(4, str(plans), "--dtype", "fp32", "--save", str(tmp_path / name), *extra)
        assert res.returncode == 0, res.stdout + res.stderr
    _assert_identical(_shards(tmp_path / "straight", 4), _shards(tmp_path / "resumed", 4))
