"""Outlier delay (hydraplan.solve.delay): a hand-checked stream, conservation and the delay bound on random
streams, the rule's threshold, and `pack --outlier-delay` (plans validate, --resume equals a full run)."""

import math
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
from helpers import Interrupt, StopAfter, hp, tiny_profile, write_run_inputs

from hydraplan.app.config import PackConfig
from hydraplan.app.pack import run_pack
from hydraplan.app.validate import check_plan, validate_path
from hydraplan.core.errors import UserError
from hydraplan.schema import Plan, Strategies, Summary
from hydraplan.solve.delay import DelayRule, hydraplan_rule, outlier_delay, stream_batches, wlb_rule


def run(batches, rule, iterations=None):
    return [(d.lengths.tolist(), d.sampled.tolist()) for d in outlier_delay(stream_batches(batches), rule, iterations)]


# ------------------------------------------------------------------------------------------ by hand
HAND = [[5, 12, 3], [15, 2], [4, 11], [20, 1], [6], [7], [8], [9]]


def test_hand_case_token_release_and_max_wait():
    rule = DelayRule(thresholds=(10,), tokens=30, max_wait=3)
    assert run(HAND, rule) == [
        ([5, 3], [0, 0]),                          # 12 queued
        ([2], [1]),                                # 12 + 15 = 27 < 30 tokens
        ([4, 12, 15, 11], [2, 0, 1, 2]),           # 38 >= 30: the whole queue, oldest first
        ([1], [3]),                                # 20 queued
        ([6], [4]),
        ([7], [5]),
        ([8, 20], [6, 3]),                         # waited 3 iterations: released though 20 < 30 tokens
        ([9], [7]),
    ]


def test_hand_case_drains_at_the_last_iteration():
    rule = DelayRule(thresholds=(10,), tokens=30, max_wait=3)
    assert run(HAND[:5], rule, iterations=5)[-1] == ([6, 20], [4, 3])


def test_hand_case_wlb_two_levels_release_one_per_micro_batch():
    # levels (10, 14] and > 14; each waits for 2 sequences and releases exactly 2
    got = run([[11, 15, 1], [12, 13, 2], [16, 3], [20, 30, 40]], wlb_rule((10, 14), 2), iterations=4)
    assert got == [
        ([1], [0]),
        ([2, 11, 12], [1, 0, 1]),     # level 0 holds 11, 12, 13: the two oldest go
        ([3, 15, 16], [2, 0, 2]),
        ([13, 20, 30, 40], [1, 3, 3, 3]),  # the last iteration drains both levels (13 and 40 would wait)
    ]


def test_ids_and_docs_travel_with_their_sequence():
    class B:
        def __init__(self, ids, lengths):
            self.ids, self.lengths, self.docs = np.array(ids), np.array(lengths), np.array(ids) * 10

    out = list(outlier_delay([B([0, 1], [50, 1]), B([2], [2])], DelayRule(thresholds=(10,), count=1), 2))
    assert out[0].ids.tolist() == [1, 0] and out[0].docs.tolist() == [10, 0]
    assert out[0].delayed_token_iters == 0 and out[1].delayed_token_iters == 0


def test_delayed_token_iters_weights_by_length():
    out = list(outlier_delay(stream_batches([[100, 1], [2], [3]]), DelayRule(thresholds=(10,), tokens=10**6), 3))
    assert [d.delayed_token_iters for d in out] == [0, 0, 200]


# ------------------------------------------------------------------------------------- properties
def random_stream(seed: int, iterations: int = 40):
    rng = np.random.default_rng(seed)
    return [np.minimum(rng.lognormal(6.0, 1.4, rng.integers(5, 40)).astype(np.int64) + 1, 8192)
            for _ in range(iterations)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("tight", [False, True])
def test_drained_run_conserves_every_sequence_and_respects_max_wait(seed, tight):
    batches = random_stream(seed)
    rule = hydraplan_rule(np.concatenate(batches), int(np.mean([b.sum() for b in batches])))
    assert rule.thresholds[0] < 8192 and rule.max_wait >= 1
    if tight:  # the token budget is never reached: only max_wait and the drain release anything
        rule = DelayRule(thresholds=rule.thresholds, tokens=10**9, max_wait=3)
    out = list(outlier_delay(stream_batches(batches), rule, len(batches)))
    ids = np.concatenate([d.ids for d in out])
    assert sorted(ids.tolist()) == list(range(sum(len(b) for b in batches)))  # nothing lost or duplicated
    flat = np.concatenate(batches)
    for d in out:
        assert np.array_equal(d.lengths, flat[d.ids])  # each id keeps its own length
        owner = np.searchsorted(np.cumsum([len(b) for b in batches]), d.ids, side="right")
        assert np.array_equal(d.sampled, owner)  # sampled = the iteration whose batch held it
        wait = d.iteration - d.sampled
        assert (wait >= 0).all() and (wait <= rule.max_wait).all()
        assert (wait[d.lengths <= rule.thresholds[0]] == 0).all()  # only outliers wait
    assert any(d.delayed_token_iters > 0 for d in out)
    again = list(outlier_delay(stream_batches(batches), rule, len(batches)))
    assert all(np.array_equal(a.ids, b.ids) and np.array_equal(a.sampled, b.sampled) for a, b in zip(out, again))


def test_undrained_stream_is_lazy_and_a_prefix_of_the_drained_one():
    batches = random_stream(7, 30)
    rule = hydraplan_rule(np.concatenate(batches), 6000)

    def endless():
        yield from stream_batches(batches)
        raise AssertionError("read past the requested iterations")

    head = list(islice(outlier_delay(endless(), rule), 20))
    full = list(outlier_delay(stream_batches(batches), rule, 30))
    assert all(np.array_equal(a.ids, b.ids) for a, b in zip(head, full[:20]))


def test_hydraplan_rule_threshold_and_bound_by_hand():
    rule = hydraplan_rule(np.arange(1, 11), tokens_per_iter=11)  # 55 tokens = 5 iterations' worth
    assert rule.thresholds == (5,)  # exactly 5 documents (6..10) are longer
    assert rule.tokens == 11
    assert rule.max_wait == math.ceil(2 / (40 / 55))  # twice the expected iterations to fill the queue
    none = hydraplan_rule(np.full(4, 100), tokens_per_iter=10)  # an iteration holds one document
    assert run([[100], [100]], none) == [([100], [0]), ([100], [1])]


# ------------------------------------------------------------------------------------------- pack
@pytest.fixture(scope="module")
def pack_inputs(tmp_path_factory):
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(6.0, 1.2, 3000).astype(np.int64) + 1, 4096)
    return write_run_inputs(tmp_path_factory.mktemp("inputs"), lengths, Strategies(candidates=[
        {"name": "mixed", "pipelines": [{"tp": 2, "pp": 1, "cp": 1}, {"tp": 1, "pp": 1, "cp": 1}, {"tp": 1, "pp": 1, "cp": 1}]},
        {"name": "tp2", "pipelines": [{"tp": 2, "pp": 1, "cp": 1}, {"tp": 2, "pp": 1, "cp": 1}]},
    ]))


def pack_opts(pack_inputs, out: Path, **kw) -> PackConfig:
    profile, data, strat = pack_inputs
    base = dict(profile=str(profile), dataset=str(data), gpus=4, tokens_per_iter=20000, iterations=6, out=out,
                strategies=strat, seed=11, workers=1, outlier_delay=True)
    return PackConfig(**{**base, **kw})


def plans_of(out: Path) -> list[Plan]:
    return [Plan.model_validate_json(p.read_text()) for p in sorted(out.glob("iter_*.json"))]


@pytest.fixture(scope="module")
def delayed_run(pack_inputs, tmp_path_factory):
    """pack_opts()'s run (6 iterations, outlier delay), planned once for the tests that read it."""
    out = tmp_path_factory.mktemp("delayed") / "run"
    return out, run_pack(pack_opts(pack_inputs, out))


def test_pack_outlier_delay_plans_validate_and_train_the_sampled_stream(tmp_path, pack_inputs, delayed_run):
    run, summary = delayed_run
    plain = run_pack(pack_opts(pack_inputs, tmp_path / "plain", outlier_delay=False))
    report = validate_path(run, tiny_profile())
    assert report.ok and report.plans == 6, report.violations
    plans, undelayed = plans_of(run), plans_of(tmp_path / "plain")
    ids = sorted(s.id for p in plans for s in p.batch)
    assert ids == sorted(s.id for p in undelayed for s in p.batch)  # the same sampled stream, each id once
    sampled_in = {s.id: p.iteration for p in undelayed for s in p.batch}
    delayed = [(p.iteration, s) for p in plans for s in p.batch if s.sampled_iteration is not None]
    assert delayed and all(s.sampled_iteration == sampled_in[s.id] < it for it, s in delayed)
    assert all(s.sampled_iteration is None for p in plans for s in p.batch if sampled_in[s.id] == p.iteration)
    delay = summary.outlier_delay
    assert delay is not None and summary.args.outlier_delay and plain.outlier_delay is None
    assert all(s.length > delay.threshold for _, s in delayed)
    assert all(it - s.sampled_iteration <= delay.max_wait for it, s in delayed)
    tokens = sum(s.length for p in plans for s in p.batch)
    waited = sum(s.length * (it - s.sampled_iteration) for it, s in delayed)
    assert delay.avg_delay_iters_per_token == pytest.approx(waited / tokens)
    saved = Summary.model_validate_json((run / "summary.json").read_text())
    assert saved.outlier_delay.avg_delay_iters_per_token == pytest.approx(waited / tokens)


def test_pack_outlier_delay_resume_equals_an_uninterrupted_run(tmp_path, pack_inputs, delayed_run):
    out = tmp_path / "cut"
    with pytest.raises(Interrupt):
        run_pack(pack_opts(pack_inputs, out), StopAfter(3))
    summary = run_pack(pack_opts(pack_inputs, out, resume=True))
    assert [i.iteration for i in summary.iterations] == list(range(6))

    def files(d):
        return {p.name: p.read_bytes() for p in sorted(d.glob("*.json")) if p.name != "summary.json"}

    assert files(out) == files(delayed_run[0])
    with pytest.raises(UserError, match="same --iterations"):
        run_pack(pack_opts(pack_inputs, out, resume=True, iterations=8))


def test_validate_flags_a_sequence_trained_before_it_is_sampled(tmp_path, pack_inputs):
    run_pack(pack_opts(pack_inputs, tmp_path / "run", iterations=2))
    plan = plans_of(tmp_path / "run")[0]
    plan.batch[0].sampled_iteration = plan.iteration + 1
    assert [v.kind for v in check_plan(plan, tiny_profile())] == ["batch"]


def test_cli_pack_outlier_delay_then_validate(tmp_path, pack_inputs):
    profile, data, strat = pack_inputs
    out = tmp_path / "cli"
    r = hp("pack", "--profile", profile, "--dataset", data, "--gpus", "4", "--tokens-per-iter", "20000", "--iterations",
           "3", "--out", out, "--strategies", strat, "--workers", "1", "--outlier-delay")
    assert r.returncode == 0, r.stderr
    assert "outlier delay" in r.stdout
    v = hp("validate", out, "--profile", profile)
    assert v.returncode == 0, v.stdout + v.stderr
