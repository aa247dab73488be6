"""Absurd sizes are refused where they enter, in one line and at once: a GPU count past the largest planned
size, a batch larger than its dataset; a context length cutting many documents is warned with the count, and
`pack` records how many it truncated. Below the app the messages name values, never a CLI flag. And the
first run's note that the solvers compile rests on telling whether their cache is there."""

import os
import sys
import warnings

import numpy as np
import pytest
from helpers import tiny_profile, write_run_inputs

from hydraplan.app.config import PackConfig, ProposeConfig, build
from hydraplan.app.pack import run_pack
from hydraplan.core.cluster import MAX_GPUS, for_gpus
from hydraplan.core.errors import UserError
from hydraplan.schema import Strategies
from hydraplan.store.datasets import BatchTooLarge, load_dataset, sample_iterations

STRATEGIES = Strategies(candidates=[{"name": "mixed", "pipelines": [{"tp": 2, "pp": 1, "cp": 1},
                                                                     *[{"tp": 1, "pp": 1, "cp": 1}] * 2]}])


@pytest.fixture
def run_inputs(tmp_path):
    lengths = np.random.default_rng(4).integers(1, 4000, 400)
    profile, data, strat = write_run_inputs(tmp_path, lengths, STRATEGIES)
    return lengths, {"profile": str(profile), "dataset": str(data), "strategies": str(strat), "gpus": 4,
                     "iterations": 2, "workers": 1}


def test_gpu_count_past_the_largest_planned_size_is_refused(tmp_path):
    with pytest.raises(UserError, match=r"^gpus must be at most 16,384.*\(got 1,000,000,000\)") as config:
        build(ProposeConfig, profile="h100-llama2-7b", dataset="builtin:wikipedia", gpus=10**9, out=tmp_path / "s.json")
    assert config.value.field == "gpus"  # the CLI shows it as --gpus
    with pytest.raises(UserError) as below:
        for_gpus(tiny_profile(), MAX_GPUS + 1)
    assert f"{MAX_GPUS + 1:,} GPUs" in str(below.value) and "--" not in str(below.value)
    assert for_gpus(tiny_profile(), MAX_GPUS).schemes  # the largest size itself is planned


def test_a_batch_larger_than_the_dataset_is_refused(tmp_path, run_inputs):
    lengths, inputs = run_inputs
    total = int(lengths.sum())
    ds = load_dataset(inputs["dataset"])
    assert sum(b.tokens for b in sample_iterations(ds, total, 2, seed=0)) >= 2 * total  # the whole dataset: allowed
    with pytest.raises(BatchTooLarge) as e:
        sample_iterations(ds, total + 1, 1, seed=0)
    assert f"{total + 1:,} tokens" in str(e.value) and f"({total:,} tokens" in str(e.value) and "--" not in str(e.value)
    with pytest.raises(UserError, match=r"^--tokens-per-iter: a batch of 1,000,000,000,000,000 tokens"):
        run_pack(PackConfig(**inputs, tokens_per_iter=10**15, out=tmp_path / "run"))
    assert not list((tmp_path / "run").glob("iter_*"))


def test_short_context_is_warned_with_the_count_and_pack_records_truncation(tmp_path, run_inputs):
    lengths, inputs = run_inputs
    context = int(np.sort(lengths)[len(lengths) // 2])  # cuts about half the documents
    cut = int(np.count_nonzero(lengths > context))
    with pytest.warns(UserWarning, match=rf"{cut} of {len(lengths)} documents \(\d+%\) are longer than the context "
                                         rf"length {context:,}"):
        load_dataset(inputs["dataset"], context)
    mild = int(np.sort(lengths)[-2])  # cuts one document of 400: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_dataset(inputs["dataset"], mild).truncated == 1
    with pytest.warns(UserWarning):
        summary = run_pack(PackConfig(**inputs, tokens_per_iter=15000, context_len=context, out=tmp_path / "run"))
    assert summary.truncated_documents == cut and summary.empty_documents == 0


def test_solvers_cached_until_a_compiled_module_is_newer_than_its_cache(tmp_path):
    """The first-run note (`compiling solvers`) rests on this: numba's cache beside each decorated module."""
    from hydraplan.solve.jitcache import compiled_modules, solvers_cached

    tag = f"py{sys.version_info[0]}{sys.version_info[1]}"
    (tmp_path / "plain.py").write_text("x = 1\n")
    mod = tmp_path / "fast.py"
    mod.write_text("import numba\n\n@numba.njit(cache=True)\ndef f(x):\n    return x\n")
    assert compiled_modules(tmp_path) == [mod]
    assert not solvers_cached(tmp_path)  # never compiled
    (tmp_path / "__pycache__").mkdir()
    index = tmp_path / "__pycache__" / f"fast.f-3.{tag}.nbi"
    index.write_bytes(b"")
    assert solvers_cached(tmp_path)
    os.utime(mod, (index.stat().st_mtime + 10,) * 2)  # edited since: numba recompiles
    assert not solvers_cached(tmp_path)


def test_the_compile_note_is_said_when_planning_starts_not_before(tmp_path, monkeypatch, capsys):
    """On a fresh install the note is looked at before anything compiles but printed only when planning starts,
    so a bad input found while preparing still fails in one line."""
    from hydraplan.app import cmd_plan
    from hydraplan.solve import jitcache

    monkeypatch.setattr(jitcache, "solvers_cached", lambda: False)
    bar = cmd_plan.PackBar(tmp_path, cmd_plan.compile_note())
    assert "compiling solvers" not in capsys.readouterr().err
    bar.start(0, 3)
    assert capsys.readouterr().err.count("hydraplan: compiling solvers, once per install") == 1
    monkeypatch.setattr(jitcache, "solvers_cached", lambda: True)
    assert cmd_plan.compile_note() is None
