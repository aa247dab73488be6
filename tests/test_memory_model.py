"""A rank's memory model as named terms (hydraplan.core.memory, hydraplan.core.analytic): the LNK windows,
communicator buffers and the K/V that CP and Seq1F1B keep are counted, every term has its source in the
profile's notes, and `hydraplan profiles memory` shows them."""

import json

import pytest
from typer.testing import CliRunner

from hydraplan.app.cli import app
from hydraplan.core.analytic import analytic_memory, kv_bytes_per_token
from hydraplan.core.cluster import for_gpus
from hydraplan.core.hardware import MODELS
from hydraplan.core.memory import LNK_PULL_DEPTH, LNK_PUSH_DEPTH, layer_groups, rank_memory
from hydraplan.schema import Scheme, SchemeMemory, TimeCoeffs
from hydraplan.solve.seqsplit import seq1f1b_split_cap, window_copies
from hydraplan.store.profiles import load_profile

runner = CliRunner()


@pytest.mark.parametrize("key", [(1, 1, 1), (2, 4, 1), (8, 1, 4), (4, 2, 2)])
def test_analytic_terms_add_up_and_name_their_sources(key):
    mem = analytic_memory(MODELS["llama2-13b"], *key)
    assert sum(mem.sharded_terms.values()) == pytest.approx(mem.sharded_bytes)
    assert sum(mem.local_terms.values()) == pytest.approx(mem.local_bytes, abs=4)
    assert sum(mem.token_terms.values()) == pytest.approx(mem.act_bytes_per_token, rel=1e-5)
    assert {"lnk_pull", "lnk_push", "communicators", "weights_and_gradients"} <= set(mem.local_terms)
    assert ("cp_kv" in mem.token_terms) == (key[2] > 1)
    notes = load_profile("h100-llama2-13b").notes
    for name in [*mem.sharded_terms, *mem.local_terms, *mem.token_terms, "kv"]:
        assert notes[f"memory.{name}"]


def test_lnk_terms_are_the_bounded_windows_of_the_largest_layer_group():
    """7B <1,1,1>: a decoder layer (4h^2 + 3hf + 2h = 202,383,360 params) is the largest group; each direction
    holds `depth` groups of a receive/send slice (the whole group at tp = 1) plus at most the whole group, bf16."""
    m = MODELS["llama2-7b"]
    mem = analytic_memory(m, 1, 1, 1)
    layer = 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    assert max(layer_groups(load_profile("h100-llama2-7b").model)) == layer
    assert mem.local_terms["lnk_pull"] == LNK_PULL_DEPTH * 2 * layer * 2
    assert mem.local_terms["lnk_push"] == LNK_PUSH_DEPTH * 2 * layer * 2
    tp8 = analytic_memory(m, 8, 1, 1)
    assert tp8.local_terms["lnk_pull"] == LNK_PULL_DEPTH * (layer / 8 + layer) * 2


def test_llama2_7b_on_one_h100_fits_at_maxlen_with_the_lnk_terms():
    """The issue's case: a <1,1,1> rank of llama2-7b held 88 GiB before any activation (every layer group's
    pull posted at once, fp32 push buffers of every group kept); the model now counts LNK's bounded windows and
    MaxLen leaves the rank under the usable capacity, below the card's 80 GB."""
    prof = load_profile("h100-llama2-7b")
    scheme = next(s for s in for_gpus(prof, 64).schemes if s.key == (1, 1, 1, "none"))
    mem = rank_memory(prof, prof.scheme(1, 1, 1), 0, 64, scheme.max_len)
    names = {t.name for t in mem.terms}
    assert {"lnk_pull", "lnk_push", "communicators", "owner_gradient", "activations"} <= names
    assert mem.total <= prof.memory.capacity_bytes * (1 + 1e-9) < 80e9
    res = runner.invoke(app, ["profiles", "memory", "h100-llama2-7b", "1,1,1", "--gpus", "64", "--json"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)
    assert shown["tokens"] == scheme.max_len and shown["total_bytes"] == pytest.approx(mem.total)
    assert [t["name"] for t in shown["terms"]] == [t.name for t in mem.terms] and all(t["source"] for t in shown["terms"])


def test_profiles_memory_refuses_an_unknown_scheme_in_one_line():
    from helpers import hp

    res = hp("profiles", "memory", "h100-llama2-7b", "3,1,1")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "not a scheme of profile h100-llama2-7b" in res.stderr


def test_cp_kv_is_the_gathered_windows_and_seq1f1b_charges_its_window_copies():
    m = MODELS["llama2-7b"]
    kv = kv_bytes_per_token(m, 2)
    assert analytic_memory(m, 2, 1, 4).token_terms["cp_kv"] == pytest.approx(kv * 9 / 8, rel=1e-5)
    assert [window_copies(k) for k in (1, 2, 4)] == [0.0, 1.0, 2.25]
    base = dict(tp=1, pp=4, cp=1, max_len=8192, util_len=64, time=TimeCoeffs(a=1e-9, b=1e-5, c=1e-3))
    plain = Scheme(**base, memory=SchemeMemory(sharded_bytes=0, local_bytes=0, act_bytes_per_token=1000.0))
    with_kv = Scheme(**base, memory=SchemeMemory(sharded_bytes=0, local_bytes=0, act_bytes_per_token=1000.0,
                                                 kv_bytes_per_token=400.0))
    assert seq1f1b_split_cap(with_kv, 1) == seq1f1b_split_cap(plain, 1)
    for k in (2, 4):  # each stashed token also carries its share of window copies: (act + w*kv) / act less room
        want = int(8192 * 4 * 1000 / (1000 + window_copies(k) * 400) // (3 + k))
        assert abs(seq1f1b_split_cap(with_kv, k) - want) < 16 and seq1f1b_split_cap(with_kv, k) < seq1f1b_split_cap(plain, k)


def test_a_measurement_that_saw_no_activations_is_one_line_not_a_division_by_zero():
    """A device whose statistics stay flat (the heap read on a GPU run) used to divide by zero fitting MaxLen."""
    from hydraplan.core.errors import UserError
    from hydraplan.core.memory import StageMemory, stage_max_len

    flat = StageMemory(stage=0, fixed_bytes=1e6, stash=1, lengths=[128, 512], act_bytes=[0.0, 0.0], peak_bytes=[0.0, 0.0])
    with pytest.raises(UserError, match="stage 0: the measured activation and peak bytes do not grow"):
        stage_max_len(flat, 2**30)
