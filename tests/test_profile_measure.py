"""Measured profiles: MaxLen from measured memory, the grid, the fit on synthetic timings, the network
bandwidth fit, the end-to-end estimates --check compares against and its error arithmetic, the
critical-path clock, and the `hydraplan profile` command (real measurements of <1,1,1> with LNK
bandwidth and of <1,1,2>, --check of whole iterations on a 3-iteration run with a Seq1F1B plan with CP,
under torchrun)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import hp
from typer.testing import CliRunner

from hydraplan.app import measure
from hydraplan.app.cli import app
from hydraplan.app.measure import check_summary, pipeline_estimate
from hydraplan.core.cluster import Cluster
from hydraplan.core.cost import pipeline_time
from hydraplan.core.errors import UserError
from hydraplan.core.fit import (
    LENGTH_QUANTUM,
    PACKED_DOCS,
    fit_bandwidth,
    fit_micro_batches,
    fit_points,
    fit_time_coeffs,
    network_slices,
    time_grid,
)
from hydraplan.core.memory import (
    MEMORY_LENGTHS,
    StageMemory,
    activation_fit,
    peak_fit,
    rank_memory_bytes,
    scheme_max_len,
    stage_max_len,
)
from hydraplan.core.schedules import fb_split, schedule_seq1f1b, simulate
from hydraplan.core.sync import has_sync_model
from hydraplan.runtime.profile import MEMORY_SETTLED, critical_path
from hydraplan.schema import (
    BatchSeq,
    Estimate,
    GPUInfo,
    MicroBatch,
    ModelInfo,
    Network,
    Plan,
    PlanPipeline,
    Profile,
    Scheme,
    TimeCoeffs,
)
from hydraplan.store.fileio import write_model
from hydraplan.store.profiles import load_profile

runner = CliRunner()


def mem(stage: int, fixed: float, stash: int, q: float, p: float, extra: float = 0.0) -> StageMemory:
    """Saved activations q*l^2 + p*l per micro-batch; the one in backward peaks `extra`*l bytes above them."""
    ls = [64, 128, 256, 512]
    return StageMemory(stage, fixed, stash, ls, [q * n * n + p * n for n in ls], [q * n * n + (p + extra) * n for n in ls])


# -------------------------------------------------------------------------------------------- memory
def test_activation_fit_recovers_quadratic_and_linear_parts():
    m = mem(0, 0, 1, 80.0, 3000.0)
    assert activation_fit(m.lengths, m.act_bytes) == pytest.approx((80.0, 3000.0), rel=1e-9)
    lin = mem(0, 0, 1, 0.0, 5000.0)  # FlashAttention-like: no l^2 term
    q, p = activation_fit(lin.lengths, lin.act_bytes)
    assert q == pytest.approx(0.0, abs=1e-9) and p == pytest.approx(5000.0)


@pytest.mark.parametrize("q,p,r", [(0.0, 4000.0, 3e5), (1.5, 700.0, 0.0), (0.0, 0.0, 0.0), (2.0, 0.0, 1e4)])
def test_peak_fit_recovers_quadratic_linear_and_constant_parts(q, p, r):
    ls = [128, 512, 1024, 2048]
    assert peak_fit(ls, [q * n * n + p * n + r for n in ls]) == pytest.approx((q, p, r), abs=1e-6)


def test_stage_max_len_survives_a_quadratic_term_of_rounding_size():
    """A fitted q of ~1e-18 (linear data) once made the textbook root cancel to 0 tokens."""
    m = StageMemory(0, 2.5e5, 2, [128, 512, 1024, 2048], [3273.0 * n + 1e-18 * n * n for n in [128, 512, 1024, 2048]],
                    [3849.0 * n + 1.2e5 for n in [128, 512, 1024, 2048]])
    assert stage_max_len(m, 2**25) == int((2**25 - 2.5e5 - 1.2e5) / (3273.0 + 3849.0))


def test_peak_fit_keeps_every_part_nonnegative():
    ls = [128, 512, 1024, 2048]
    got = peak_fit(ls, [5000.0 * n - 2e5 for n in ls])  # a negative constant does not fit: r = 0, p absorbs it
    assert min(got) >= 0 and got[2] == 0.0


@pytest.mark.parametrize("q,p,fixed,stash,cap,extra", [(80.0, 3000.0, 5e5, 1, 32 * 2**20, 0.0),
                                                        (0.0, 4096.0, 1e6, 4, 64 * 2**20, 1000.0),
                                                        (12.5, 700.0, 2e6, 3, 2**27, 350.0)])
def test_stage_max_len_is_the_largest_length_that_fits(q, p, fixed, stash, cap, extra):
    ml = stage_max_len(mem(0, fixed, stash, q, p, extra), cap)
    peak = lambda n: fixed + stash * (q * n * n + p * n) + extra * n  # noqa: E731
    assert peak(ml) <= cap * (1 + 1e-12) and peak(ml + 1) > cap


def test_scheme_max_len_takes_the_tightest_stage_and_rounds_down():
    # stage 0 stashes 2 micro-batches of 1 layer each, stage 1 one micro-batch of twice the activations
    stages = [mem(0, 1e5, 2, 40.0, 1000.0), mem(1, 1e5, 1, 90.0, 2000.0)]
    cap = 2**24
    want = min(stage_max_len(s, cap) for s in stages) // LENGTH_QUANTUM * LENGTH_QUANTUM
    assert scheme_max_len(stages, cap) == want and want % LENGTH_QUANTUM == 0 and want > 0
    with pytest.raises(UserError, match="^memory_gib: ") as e:
        scheme_max_len(stages, 1.2e5)
    assert e.value.field == "memory_gib"


def test_time_grid_covers_fractions_of_max_len_single_and_packed():
    grid = time_grid(928)
    singles = [g[0] for g in grid if len(g) == 1]
    packed = [g for g in grid if len(g) > 1]
    assert singles == sorted(singles) and max(singles) == 928 and all(n % LENGTH_QUANTUM == 0 for n in singles)
    assert len(packed) == len(singles) and all(len(g) == PACKED_DOCS and len(set(g)) == 1 for g in packed)
    assert [sum(g) for g in packed] == [n - n % PACKED_DOCS for n in singles]
    assert time_grid(928) == grid


# ----------------------------------------------------------------------------------------------- fit
def test_fit_points_recovers_known_coefficients_and_tests_packing():
    a, b, c = 3e-7, 2e-5, 8e-3
    grid = time_grid(1024)
    exact = [(g, sum(a * n * n + b * n for n in g) + c) for g in grid]
    fit = fit_points(exact)
    assert (fit.time.a, fit.time.b, fit.time.c) == pytest.approx((a, b, c), rel=1e-6)
    assert fit.r2 == pytest.approx(1.0) and fit.worst_rel_err < 1e-9 and fit.packed_worst_rel_err < 1e-9
    # a backend that attends across packed documents costs a*(sum l)^2: no a, b, c fits singles and packings
    dense = [(g, a * sum(g) ** 2 + b * sum(g) + c) for g in grid]
    fit = fit_points(dense)
    assert fit.worst_rel_err > 0.1 and fit.packed_worst_rel_err > 0.1


def test_packings_pin_the_linear_term_that_noisy_single_sequences_lose():
    """Single sequences alone cannot tell a*l^2 from b*l well under noise; packings of the same totals can."""
    a, b, c = 3e-7, 2e-5, 8e-3
    rng = np.random.default_rng(11)
    grid = time_grid(1024)
    err_both, err_single = [], []
    for _ in range(40):  # 2% timing noise, 40 measured profiles
        noisy = [(g, (sum(a * n * n + b * n for n in g) + c) * (1 + rng.normal(0, 0.02))) for g in grid]
        err_both.append(abs(fit_points(noisy).time.b - b) / b)
        err_single.append(abs(fit_time_coeffs(*zip(*[(g[0], t) for g, t in noisy if len(g) == 1])).b - b) / b)
    assert np.median(err_both) < 0.08 < 0.1 < np.median(err_single)


def test_fit_points_needs_three_distinct_points():
    with pytest.raises(ValueError, match="at least 3"):
        fit_points([([64], 0.1), ([64], 0.11), ([16, 16], 0.1)])


# ----------------------------------------------------------------------------------------- network
def test_fit_bandwidth_recovers_a_pure_bandwidth_and_minimizes_relative_error():
    sizes = [98880.0, 49440.0, 24720.0, 12360.0]
    fit = fit_bandwidth(sizes, [b / 0.004e9 for b in sizes])  # exactly 4 MB/s
    assert fit.GBps == pytest.approx(0.004, rel=1e-12) and fit.worst_rel_err < 1e-12 and fit.points == 4
    # with a latency no single bandwidth is exact; the fit is the relative least-squares optimum (brute force)
    secs = [2e-3 + b / 0.01e9 for b in sizes]
    fit = fit_bandwidth(sizes, secs)
    grid = np.linspace(0.001, 0.02, 200001)
    loss = (((np.array(sizes)[None, :] / (grid[:, None] * 1e9)) - secs) / secs) ** 2
    best = grid[np.argmin(loss.sum(axis=1))]
    assert fit.GBps == pytest.approx(best, rel=1e-4)
    assert fit.worst_rel_err == pytest.approx(max(abs(b / (fit.GBps * 1e9) - t) / t for b, t in zip(sizes, secs)))
    # the latency is folded in: small slices look slower than large ones
    assert sizes[-1] / secs[-1] < fit.GBps * 1e9 < sizes[0] / secs[0]
    with pytest.raises(ValueError, match="positive"):
        fit_bandwidth([1.0], [0.0])


def test_network_slices_count_bytes_as_sync_transfer_does():
    samples = [{"tp": 1, "pp": 1, "pull_s": 0.02, "push_s": 0.03}, {"tp": 2, "pp": 2, "pull_s": 0.01, "push_s": 0.011}]
    sizes, secs = network_slices(1000, samples)
    assert sizes == [2000.0, 2000.0, 500.0, 500.0] and secs == [0.02, 0.03, 0.01, 0.011]
    # a profile with the fitted bandwidth predicts those transfers through hydraplan.core.sync

    prof = tiny_profile().model_copy(update={"network": Network(intra_node_GBps=2e-4, inter_node_GBps=2e-4)})
    prof.model.params = 1000
    assert Cluster.of(prof, 4).transfer_s(2, 2) == pytest.approx(500 / 2e5)


# ------------------------------------------------------------------------------------------- check
def tiny_profile(**time) -> Profile:
    t = TimeCoeffs(**(dict(a=2e-7, b=3e-5, c=5e-3) | time))
    return Profile(name="p", gpu=GPUInfo(name="cpu", memory_gib=1), model=ModelInfo(name="tiny", layers=4, hidden=32),
                   schemes=[Scheme(tp=1, pp=1, cp=1, max_len=4096, util_len=64, time=t),
                            Scheme(tp=1, pp=2, cp=1, max_len=4096, util_len=64, time=t)])


def plan_of(iteration: int, pipelines, first_id: int = 0, gpus: int = 3) -> Plan:
    """pipelines: (pp, ranks, micro-batches as lengths, splits per micro-batch or None)."""
    batch, out, sid = [], [], first_id
    for pp, ranks, mbs, splits in pipelines:
        micro = []
        for j, lengths in enumerate(mbs):
            micro.append(MicroBatch(seqs=list(range(sid, sid + len(lengths))), splits=None if splits is None else splits[j]))
            batch += [BatchSeq(id=sid + k, length=n) for k, n in enumerate(lengths)]
            sid += len(lengths)
        out.append(PlanPipeline(tp=1, pp=pp, cp=1, ranks=ranks, micro_batches=micro, estimate_s=0.0))
    return Plan(iteration=iteration, profile="p", gpus=gpus, batch=batch, strategy="S", pipelines=out,
                estimate=Estimate(propagation_s=0.0))


def test_pipeline_estimate_is_canonical_without_splits_and_the_schedule_with_them():
    prof = tiny_profile()
    s2 = prof.scheme(1, 2, 1)
    plan = plan_of(0, [(2, [0, 1], [[40, 24], [64], [30]], None),
                       (2, [0, 1], [[40, 24], [64], [30]], [[0, 20, 64], [0, 40, 64], [0, 15, 30]])])
    lengths = {s.id: s.length for s in plan.batch}
    assert pipeline_estimate(s2, plan.pipelines[0], lengths) == pytest.approx(pipeline_time(s2, [[40, 24], [64], [30]]))
    # by hand: split costs of the token ranges under a*(2p-1)+b per token at position p of its document
    t = s2.time

    def cost(doc_lengths, lo, hi):
        total, start = 0.0, 0
        for n in doc_lengths:
            p = np.arange(start, start + n)
            inside = (p >= lo) & (p < hi)
            total += float(np.sum((t.a * (2 * (p - start + 1) - 1) + t.b)[inside]))
            start += n
        return total

    docs = [[40, 24], [64], [30]]
    bounds = [[0, 20, 64], [0, 40, 64], [0, 15, 30]]
    times = np.array([[cost(d, b[k], b[k + 1]) + t.c for k in range(2)] for d, b in zip(docs, bounds)])
    want = simulate(schedule_seq1f1b(2, 3, 2), *fb_split(times)).latency_s
    assert pipeline_estimate(s2, plan.pipelines[1], lengths) == pytest.approx(want, rel=1e-12)


def compare(plans, got, profile):
    """measure.compare on the cluster of the plans' GPUs, as `profile --check` builds it."""
    return measure.compare(plans, got, Cluster.of(profile, plans[0].gpus))


def measured(pull, pipes, push, step, exposed=None) -> dict:
    """The runtime's --check row; `exposed` defaults to pull + push (nothing hidden)."""
    exposed = pull + push if exposed is None else exposed
    return {"pull_s": pull, "propagate_s": max(pipes), "push_s": push, "step_s": step, "exposed_s": exposed,
            "iteration_s": max(pipes) + exposed + step, "pipelines": [{"seconds": x} for x in pipes]}


def test_compare_takes_the_slowest_pipeline_and_names_a_missing_scheme():
    prof = tiny_profile()  # no network: sync is 0 and the end-to-end estimate is the propagation
    plan = plan_of(4, [(1, [0], [[100]], None), (2, [1, 2], [[50], [60]], None)])
    rows = compare([plan], {"plans": [measured(0.001, [0.02, 0.05], 0.002, 0.0005)]}, prof)
    est = [pipeline_time(prof.scheme(1, 1, 1), [[100]]), pipeline_time(prof.scheme(1, 2, 1), [[50], [60]])]
    r = rows[0]
    assert r.estimate_s == pytest.approx(max(est)) and r.estimate_sync_s == 0 and r.estimate_from == "profile"
    assert r.measured_s == pytest.approx(0.0535) and r.sync_s == pytest.approx(0.0035)
    assert r.rel_err == pytest.approx(abs(max(est) - 0.0535) / 0.0535)
    assert [p[2] for p in r.pipelines] == [0.02, 0.05]
    plan.pipelines[0].tp = 4
    with pytest.raises(UserError, match=r"pipelines\.0: scheme <4,1,1> is not in profile p for 3 GPUs"):
        compare([plan], {"plans": [measured(0.001, [0.02, 0.05], 0.002, 0.0005)]}, prof)


def test_check_errors_by_hand():
    """A 4-GPU plan: <1,1,1> on 100 tokens and <1,2,1> on 50 + 60 under a 4 MB/s network, 1e5 parameters."""
    prof = tiny_profile(a=0.0, b=1e-3, c=0.0)
    prof = prof.model_copy(update={"network": Network(intra_node_GBps=0.004, inter_node_GBps=0.004)})
    prof.model.params = 100_000
    prof.gpu.gpus_per_node = 4
    assert has_sync_model(prof)
    plan = plan_of(0, [(1, [0], [[100]], None), (2, [1, 2], [[50], [60]], None)], gpus=4)
    # by hand: T(m) = 1e-3 * tokens. <1,1,1>: prop 0.1; <1,2,1>: sum T + (pp - 1) * max T = 0.11 + 0.06 = 0.17
    # transfer = 2 bytes * 1e5 / (tp*pp) / 4e6 B/s: 0.05 s for pp 1, 0.025 s for pp 2
    # exposed: pp 1: max(0, 0.05 - 0.1/3) + max(0, 0.05 - 0.2/3) = 0.05 - 0.0333.. = 0.01666..; pp 2: 0
    # iteration: max(0.1 + 0.01667, 0.17 + 0) = 0.17 (pipeline 1), sync 0
    got = {"plans": [measured(0.03, [0.09, 0.2], 0.04, 0.01)]}
    (r,) = compare([plan], got, prof)
    assert r.estimate_propagation_s == pytest.approx(0.17) and r.estimate_sync_s == pytest.approx(0.0)
    assert r.transfer_s == pytest.approx(0.05)
    assert r.no_overlap_s == pytest.approx(max(0.1 + 2 * 0.05, 0.17 + 2 * 0.025))  # nothing hidden: 0.22
    # measured: 0.2 + (0.03 + 0.04 + 0.01) = 0.28; error (0.17 - 0.28) / 0.28; prop (0.17 - 0.2) / 0.28; sync -0.08 / 0.28
    assert r.measured_s == pytest.approx(0.28)
    assert (r.err, r.propagation_err, r.sync_err) == pytest.approx((-0.11 / 0.28, -0.03 / 0.28, -0.08 / 0.28))
    assert r.propagation_err + r.sync_err == pytest.approx(r.err)
    # a slower network makes the one-GPU pipeline the critical one: 2x the transfer (0.1 s): 0.1 + 0.1 > 0.17
    slow = prof.model_copy(update={"network": Network(intra_node_GBps=0.002, inter_node_GBps=0.002)})
    (r,) = compare([plan], got, slow)
    exposed = (0.1 - 0.1 / 3) + (0.1 - 0.2 / 3)
    assert (r.estimate_propagation_s, r.estimate_sync_s) == pytest.approx((0.1, exposed))
    assert r.sync_err == pytest.approx((exposed - 0.08) / 0.28)
    # a plan carrying the end-to-end fields for this profile is taken at its word
    plan.profile = slow.name
    plan.estimate = Estimate(propagation_s=0.18, iteration_s=0.3, sync_s=0.05)
    (r,) = compare([plan], got, slow)
    assert (r.estimate_from, r.estimate_propagation_s, r.estimate_sync_s) == ("plan", pytest.approx(0.25), 0.05)
    summary = check_summary([r, compare([plan_of(1, [(1, [0], [[100]], None)], gpus=4)],
                                        {"plans": [measured(0.0, [0.1], 0.0, 0.0)]}, prof)[0]])
    assert summary["mean_rel_err"] == pytest.approx((0.02 / 0.28 + abs(0.1 + 0.05 - 0.1 / 3 - 0.1) / 0.1) / 2)
    assert summary["worst_iteration"] == 1 and summary["worst_rel_err"] == pytest.approx(abs(0.1 + 0.05 - 0.1 / 3 - 0.1) / 0.1)
    # overlap hid 0.05 of the 0.07 s of pull and push: measured 0.2 + 0.02 + 0.01, measured sync 0.03
    (r,) = compare([plan], {"plans": [measured(0.03, [0.09, 0.2], 0.04, 0.01, exposed=0.02)]}, slow)
    assert (r.measured_s, r.sync_s) == pytest.approx((0.23, 0.03))
    assert r.sync_err == pytest.approx((0.05 - 0.03) / 0.23) and r.propagation_err == pytest.approx((0.25 - 0.2) / 0.23)


def test_critical_path_of_uniform_actions_is_the_1f1b_formula():
    P, M, F, B = 3, 5, 0.01, 0.02
    stages = [(r, P, {(op, m, 0): (F if op == "F" else B) for op in "FB" for m in range(M)}) for r in range(P)]
    assert critical_path(stages) == pytest.approx((M + P - 1) * (F + B))
    # a stage's action lasts as long as on its slowest TP rank
    slow = (1, P, {(op, m, 0): 2 * (F if op == "F" else B) for op in "FB" for m in range(M)})
    assert critical_path([*stages, slow]) > (M + P - 1) * (F + B)


# --------------------------------------------------------------------------------------------- CLI
@pytest.mark.parametrize("args,message", [
    (["--schemes", "3,1", "--out", "x.json"], "tp=3 does not divide"),
    (["--schemes", "1,2,4", "--out", "x.json"], "<1,2,4> needs 8 ranks"),
    (["--schemes", "2,2", "--gpus", "2", "--out", "x.json"], "needs 4 ranks"),
    (["--check", "plans"], "--check needs --profile"),
    (["--check", "no-such-run", "--profile", "cpu-tiny"], "no-such-run: no such file"),
    ([], "--out is required"),
    (["--device", "tpu", "--out", "x.json"], "--device must be cpu or cuda"),
])
def test_profile_bad_input_is_a_one_line_user_error(args, message):
    res = runner.invoke(app, ["profile", *args])  # hydraplan.cli.main prints a UserError in one line, exit 2
    assert isinstance(res.exception, UserError) and message in str(res.exception) and "\n" not in str(res.exception)


def test_profile_bad_input_exits_2():
    proc = hp("profile", "--schemes", "3,1", "--out", "x.json")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "tp=3" in lines[0]


def _measure_profile(tmp: Path) -> tuple[Profile, dict]:
    """One `hydraplan profile` run: <1,1,1> and <1,1,2> (each in its own runtime job, as every scheme is, its ranks
    forked: tests/ranks.py) and LNK on 2 ranks, in 32 MiB, one timed run per point (no warm-up run): the asserted
    properties (MaxLen at the capacity, refits, the fit of the recorded points, longer single sequences slower by
    ~10x and more, per-CP-rank memory) hold for any timing, so repeats only cost CPU. The profile and the JSON
    printed."""
    import ranks

    from hydraplan.app import measure

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measure, "launch_runtime", ranks.launch_runtime)
        res = runner.invoke(app, ["profile", "--schemes", "1,1", "--schemes", "1,1,2", "--recompute", "none", "--gpus",
                                  "2", "--memory-gib", "0.03125", "--warmup", "0", "--repeats", "1", "--out",
                                  str(tmp / "m.json"), "--json"])
    assert res.exit_code == 0, res.output
    return load_profile(str(tmp / "m.json")), json.loads(res.stdout)


@pytest.mark.slow
def test_profile_measures_a_scheme_and_a_context_parallel_one_and_writes_a_consistent_profile(tmp_path):
    """One measurement of both (a test each would measure twice under xdist, on its two workers)."""
    prof, printed = _measure_profile(tmp_path)
    assert prof.source == "measured" and [s.key for s in prof.schemes] == [(1, 1, 1, "none"), (1, 1, 2, "none")]
    s = prof.scheme(1, 1, 1)
    # MaxLen: the largest multiple of 16 whose peak (fixed + the one micro-batch at its backward's peak) fits in 32 MiB,
    # beyond the lengths measured first, so measured again where the first fit put it: the fit is not extrapolated
    (m,) = s.measured_memory
    peak = lambda n: rank_memory_bytes(prof, s, 0, 1, n)  # noqa: E731
    assert peak(s.max_len) <= 2**25 < peak(s.max_len + LENGTH_QUANTUM)
    assert m["lengths"][:4] == list(MEMORY_LENGTHS) and s.max_len > MEMORY_LENGTHS[-1] * (1 + MEMORY_SETTLED)
    assert len(m["lengths"]) > 4 and s.max_len <= max(m["lengths"]) * (1 + MEMORY_SETTLED)
    assert m["peak_bytes_per_token"] >= m["act_bytes_per_token"] > 0  # the backward holds at least what was saved
    # a, b, c are the fit of the recorded timings (single sequences grow with length)
    single = [(p["lengths"][0], p["seconds"]) for p in s.measured_points if len(p["lengths"]) == 1]
    fit = fit_micro_batches([p["lengths"] for p in s.measured_points], [p["seconds"] for p in s.measured_points])
    assert (s.time.a, s.time.b, s.time.c) == pytest.approx((fit.a, fit.b, fit.c))
    assert single[-1][1] > single[0][1]  # (a itself may fit to 0 on a loaded machine: timings, not a contract)
    assert printed["schemes"][0]["scheme"] == "<1,1,1>" and printed["schemes"][0]["max_len"] == s.max_len
    # network: LNK pull/push of <1,1> on the 2 ranks of --gpus, fitted to one bandwidth; params: the tiny config's count
    from hydraplan.app.measure import model_params

    assert has_sync_model(prof) and prof.model.params == model_params("tiny") == printed["params"]
    assert prof.network.intra_node_GBps > 0 and prof.network.inter_node_GBps == prof.network.intra_node_GBps
    assert "<1,1> pull" in prof.notes["network"] and "inter_node_GBps" in prof.notes["network"]
    assert printed["network"] == prof.network.model_dump()
    # <1,1,2>: memory and time on each CP rank's share; MaxLen is set by the tighter CP rank
    s = prof.scheme(1, 1, 2)
    assert len(s.measured_memory) == 2 and len(s.measured_points) >= 6
    peak = lambda n: max(rank_memory_bytes(prof, s.model_copy(update={"measured_memory": [m]}), m["stage"], 1, n)  # noqa: E731
                         for m in s.measured_memory)
    assert peak(s.max_len) <= 2**25 < peak(s.max_len + LENGTH_QUANTUM)


def with_cp(plan: Plan) -> Plan:
    """Its one pipeline at cp=2 with per-document CP shards, as `pack --cp-shard` records them."""
    from hydraplan.schema import CPShard
    from hydraplan.solve.cpshard import shard_per_document

    p = plan.pipelines[0]
    p.cp = 2
    lengths = {b.id: b.length for b in plan.batch}
    for mb in p.micro_batches:
        ranges = shard_per_document(np.array([lengths[i] for i in mb.seqs]), 2).ranges(2)
        mb.cp_shard = CPShard(strategy="per-document", ranges=ranges, attention_s=0.0, other_s=0.0)
    return plan


@pytest.mark.slow
def test_profile_check_replays_a_three_iteration_plan(tmp_path):
    """The third iteration is a <1,2,2> Seq1F1B pipeline with per-document CP shards. One timed run of each plan, no
    warm-up run: what is asserted (the estimates, every phase recorded and how they add up) holds for any timing."""
    prof = tiny_profile()
    prof.schemes.append(Scheme(tp=1, pp=2, cp=2, max_len=4096, util_len=64, time=prof.schemes[0].time))
    write_model(tmp_path / "p.json", prof)
    run = tmp_path / "run"
    run.mkdir()
    plans = [plan_of(0, [(1, [0], [[48, 16]], None), (2, [1, 2], [[40], [32, 8]], [[0, 20, 40], [0, 24, 40]])], gpus=4),
             plan_of(1, [(2, [0, 2], [[64], [30, 10]], None)], first_id=10, gpus=4),
             with_cp(plan_of(2, [(2, [0, 1, 2, 3], [[30, 14], [20]], [[0, 20, 44], [0, 8, 20]])], first_id=20, gpus=4))]
    for p in plans:
        write_model(run / f"iter_{p.iteration:06d}.json", p)
    # as a logged job runs it (the installed command; HYDRAPLAN_PROGRESS_EVERY_S is read at start-up): stderr no
    # terminal, so a progress line names what is being replayed
    res = subprocess.run([str(Path(sys.executable).parent / "hydraplan"), "profile", "--check", str(run), "--profile",
                          str(tmp_path / "p.json"), "--warmup", "0", "--repeats", "1", "--json"], capture_output=True, text=True,
                         env={**os.environ, "HYDRAPLAN_PROGRESS_EVERY_S": "0.5"}, timeout=600)
    assert res.returncode == 0, res.stderr
    assert f"replaying {run} in the runtime" in res.stderr
    got = json.loads(res.stdout)
    rows = got["iterations"]
    assert [r["iteration"] for r in rows] == [0, 1, 2] and [len(r["pipelines"]) for r in rows] == [2, 1, 1]
    lengths = [{s.id: s.length for s in p.batch} for p in plans]
    want = [max(pipeline_estimate(prof.scheme(*q.key), q, lengths[i]) for q in p.pipelines) for i, p in enumerate(plans)]
    assert [r["estimate_s"] for r in rows] == pytest.approx(want)  # no network in this profile: sync 0
    for r in rows:  # the cpu clock: propagation's critical path + the step's exposed LNK waits + optimizer step
        assert min(r["pull_s"], r["push_s"], r["step_s"]) > 0 and 0 < r["propagate_s"] < 60
        assert r["propagate_s"] == pytest.approx(max(p["measured_s"] for p in r["pipelines"]))
        assert 0 <= r["exposed_s"] <= r["pull_s"] + r["push_s"]  # only in-flight time can be waited on
        assert r["measured_s"] == pytest.approx(r["propagate_s"] + r["exposed_s"] + r["step_s"])
        assert math.isclose(r["rel_err"], abs(r["estimate_s"] - r["measured_s"]) / r["measured_s"])
        assert r["propagation_err"] + r["sync_err"] == pytest.approx(r["err"])
    assert got["worst_rel_err"] == pytest.approx(max(r["rel_err"] for r in rows))


def test_profile_check_rejects_a_run_of_mixed_gpu_counts(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_model(run / "iter_000000.json", plan_of(0, [(1, [0], [[48]], None)], gpus=2))
    write_model(run / "iter_000001.json", plan_of(1, [(1, [0], [[48]], None)], first_id=5, gpus=4))
    res = runner.invoke(app, ["profile", "--check", str(run), "--profile", "cpu-tiny"])
    assert isinstance(res.exception, UserError)
    assert "iter_000001.json: field gpus: 4" in str(res.exception) and "\n" not in str(res.exception)


def test_launches_combine_by_their_median():
    """Each grid point (matched by its lengths) takes the median of the launches' medians and keeps every run;
    a --check phase likewise per plan, the plan number untouched."""
    from hydraplan.app.measure import median_check, median_points

    a = [{"lengths": [64], "seconds": 1.0, "runs": [1.0]}, {"lengths": [16] * 4, "seconds": 5.0, "runs": [5.0]}]
    b = [{"lengths": [16] * 4, "seconds": 3.0, "runs": [3.0]}, {"lengths": [64], "seconds": 2.0, "runs": [2.0]}]
    c = [{"lengths": [64], "seconds": 9.0, "runs": [9.0, 8.0]}]
    got = median_points([a, b, c])
    assert [p["lengths"] for p in got] == [[64], [16] * 4]
    assert [p["seconds"] for p in got] == [2.0, 4.0] and [p["launches"] for p in got] == [3, 2]
    assert sorted(got[0]["runs"]) == [1.0, 2.0, 8.0, 9.0]
    plan = lambda it, s, p: {"source": "x", "iteration": 7, "iteration_s": it, "step_s": s,  # noqa: E731
                             "pipelines": [{"seconds": p}], "runs": [it]}
    m = median_check([{"plans": [plan(1.0, 0.1, 0.5)]}, {"plans": [plan(3.0, 0.3, 0.9)]}, {"plans": [plan(2.0, 0.2, 0.7)]}])
    (row,) = m["plans"]
    assert (row["iteration"], row["iteration_s"], row["step_s"], row["pipelines"][0]["seconds"]) == (7, 2.0, 0.2, 0.7)
    assert sorted(row["runs"]) == [1.0, 2.0, 3.0]
