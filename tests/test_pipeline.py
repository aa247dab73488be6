"""Schedules and the timeline simulator: invariants over many shapes, hand-computed timelines."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from helpers import hp

from hydraplan.core.errors import UserError
from hydraplan.core.schedules import (
    Action,
    Schedule,
    ScheduleError,
    build_schedule,
    check_schedule,
    fb_split,
    group_size,
    make_schedule,
    schedule_1f1b,
    schedule_seq1f1b,
    simulate,
    simulate_1f1b,
)

SHAPES = [  # interleaving needs M*K within one group or a multiple of it (Megatron's constraint)
    (P, M, K, V)
    for P, M, K, V in itertools.product((1, 2, 3, 4, 8), (1, 2, 3, 4, 5, 8, 12), (1, 2, 3, 4), (1, 2, 3))
    if V == 1 or M * K <= group_size(P, K) or (M * K) % group_size(P, K) == 0
]


def paper_forwards_before_first_backward(P: int, M: int, K: int, V: int, r: int) -> int:
    """seq1f1b.txt Eq. (1)/(4) (V = 1) and (5)/(6) (V > 1, K divides P), 0-indexed stage, + first steady F."""
    w = P - r - 1 + K if V == 1 else 2 * (P - r - 1) + (V - 1) * P + K
    return min(w, M * K * V)


@pytest.mark.parametrize("P,M,K,V", SHAPES)
def test_schedule_invariants(P: int, M: int, K: int, V: int) -> None:
    sch = build_schedule(P, M, K, V)
    every = {Action(op, m, s, c) for op in "FB" for m in range(M) for s in range(K) for c in range(V)}
    for r, acts in enumerate(sch.stages):
        assert len(acts) == len(every) and set(acts) == every  # each F and B exactly once
        pos = {a: i for i, a in enumerate(acts)}
        for m, s, c in itertools.product(range(M), range(K), range(V)):
            assert pos[Action("F", m, s, c)] < pos[Action("B", m, s, c)]
            if s + 1 < K:
                assert pos[Action("B", m, s + 1, c)] < pos[Action("B", m, s, c)]  # LIFO across splits
                assert pos[Action("F", m, s, c)] < pos[Action("F", m, s + 1, c)]
        n_f = next(i for i, a in enumerate(acts) if a.op == "B")
        if V == 1 or P % K == 0:
            assert n_f == paper_forwards_before_first_backward(P, M, K, V, r)
    tl = check_schedule(sch)  # raises on deadlock
    if V == 1:
        # 1F1B holds min(P - r, M) micro-batches; Seq1F1B min(P - r - 1 + K, M*K) sub-sequences
        assert tl.peak_live == [min(P - r - 1 + K, M * K) for r in range(P)]


def test_fifo_across_micro_batches() -> None:
    acts = schedule_seq1f1b(3, 4, 2).stages[1]
    bwd = [(a.mb, a.split) for a in acts if a.op == "B"]
    assert bwd == [(m, s) for m in range(4) for s in (1, 0)]


def test_partial_interleaving_group_rejected() -> None:
    with pytest.raises(UserError, match="multiple of 5"):
        build_schedule(5, 7, 1, 2)


def test_uniform_1f1b_matches_canonical() -> None:
    for P, M in [(1, 1), (2, 3), (4, 8), (8, 32), (3, 2)]:
        tl = simulate_1f1b(np.full(M, 0.7), P)
        assert tl.latency_s == pytest.approx((M + P - 1) * 0.7)
        assert tl.bubble_ratio == pytest.approx((P - 1) / (M + P - 1))


def test_non_uniform_1f1b_by_hand() -> None:
    # P=2, M=2. stage 0: F0 F1 B0 B1; stage 1: F0 B0 F1 B1.  F = [1, 2], B = [2, 4].
    # s0 F0 [0,1] F1 [1,3]; s1 F0 [1,2] B0 [2,4] F1 [4,6] B1 [6,10]; s0 B0 [4,6] B1 [10,14].
    sch = schedule_1f1b(2, 2)
    assert [str(a) for a in sch.stages[1]] == ["F0.0c0", "B0.0c0", "F1.0c0", "B1.0c0"]
    tl = simulate(sch, np.array([1.0, 2.0]), np.array([2.0, 4.0]))
    assert [(iv.start, iv.end) for iv in tl.intervals[0]] == [(0, 1), (1, 3), (4, 6), (10, 14)]
    assert [(iv.start, iv.end) for iv in tl.intervals[1]] == [(1, 2), (2, 4), (4, 6), (6, 10)]
    assert tl.latency_s == 14 and tl.busy_s == [9, 9]
    assert tl.bubble_ratio == pytest.approx(10 / 28)
    # canonical closed form: sum T + (P-1) max T = 9 + 6 = 15, one more than the exact schedule
    # p2p latency 0.5 on every cross-stage edge: s1 F0 [1.5,2.5] B0 [2.5,4.5] F1 [4.5,6.5] B1 [6.5,10.5];
    # s0 B0 [5,7] B1 [11,15]
    tl = simulate(sch, np.array([1.0, 2.0]), np.array([2.0, 4.0]), p2p_s=0.5)
    assert tl.latency_s == 15
    assert [(iv.start, iv.end) for iv in tl.intervals[0]][2:] == [(5, 7), (11, 15)]


def test_seq1f1b_by_hand() -> None:
    # P=2, M=1, K=2, F=1 B=2 per split: s0 F.0 [0,1] F.1 [1,2]; s1 F.0 [1,2] F.1 [2,3] B.1 [3,5] B.0 [5,7];
    # s0 B.1 [5,7] B.0 [7,9]. The whole micro-batch under 1F1B (F=2, B=4) would take 12.
    tl = simulate(schedule_seq1f1b(2, 1, 2), 1.0, 2.0)
    assert tl.latency_s == 9
    assert [(iv.start, iv.end) for iv in tl.intervals[1]] == [(1, 2), (2, 3), (3, 5), (5, 7)]
    assert simulate(schedule_1f1b(2, 1), 2.0, 4.0).latency_s == 12


def test_callable_durations_and_bytes() -> None:
    sch = schedule_seq1f1b(2, 2, 2)
    tl = simulate(sch, lambda r, m, s, c: 1.0 + r, lambda r, m, s, c: 2.0, act_bytes=np.array([[10, 1], [10, 1]]))
    assert tl.busy_s == [4 * 1 + 4 * 2, 4 * 2 + 4 * 2]
    # stage 0 holds F0.0 F0.1 F1.0 (3 sub-sequences) before its first backward: 10 + 1 + 10 bytes;
    # stage 1 runs F0.0 F0.1 B0.1 F1.0 ...: after F1.0 it holds F0.0 + F1.0 = 20 bytes (2 live, as after F0.1)
    assert tl.peak_live == [3, 2] and tl.peak_live_bytes == [21, 20]


def test_deadlock_and_incomplete_detected() -> None:
    bad = Schedule(stages=[[Action("F", 0), Action("B", 0)], [Action("B", 0), Action("F", 0)]], P=2, M=1)
    with pytest.raises(ScheduleError, match="deadlock"):
        check_schedule(bad)
    # the LIFO rule: B of split 0 before B of split 1 on the last stage can never run
    lifo = Schedule(stages=[[Action("F", 0, 0), Action("F", 0, 1), Action("B", 0, 0), Action("B", 0, 1)]], P=1, M=1, K=2)
    with pytest.raises(ScheduleError, match="deadlock"):
        check_schedule(lifo)
    missing = Schedule(stages=[[Action("F", 0)]], P=1, M=1)
    with pytest.raises(ScheduleError, match="missing"):
        check_schedule(missing)
    dup = Schedule(stages=[[Action("F", 0), Action("F", 0), Action("B", 0)]], P=1, M=1)
    with pytest.raises(ScheduleError, match="more than once"):
        check_schedule(dup)


def test_duration_shape_checked() -> None:
    with pytest.raises(ValueError, match="shape"):
        simulate(schedule_1f1b(2, 3), np.ones(2), np.ones(3))


def test_fb_split_and_json() -> None:
    f, b = fb_split(np.array([3.0, 6.0]), V=2)
    assert f.tolist() == [0.5, 1.0] and b.tolist() == [1.0, 2.0]
    data = json.loads(json.dumps(make_schedule("seq1f1b", 2, 1, K=2).to_json()))
    assert data["stages"][0][0] == {"op": "F", "mb": 0, "split": 0, "chunk": 0}
    assert len(data["stages"]) == 2 and all(len(s) == 4 for s in data["stages"])


def test_seq1f1b_beats_1f1b_at_paper_scale() -> None:
    P, M, K, T = 8, 32, 4, 1.0
    one = simulate(schedule_1f1b(P, M), *fb_split(T))
    seq = simulate(schedule_seq1f1b(P, M, K), *fb_split(np.full((M, K), T / K)))
    assert seq.bubble_ratio < one.bubble_ratio
    # uniform splits: Seq1F1B is a 1F1B over M*K units of T/K with P - 1 + K units of warm-up
    assert seq.latency_s == pytest.approx((M * K + P - 1) * T / K)


# ------------------------------------------------------------------------------------------------ CLI
def _run(args: list[str]):
    from typer.testing import CliRunner

    from hydraplan.app.cli import app

    return CliRunner().invoke(app, args)


def test_cli_json_lists_and_metrics() -> None:
    r = _run(["pipeline", "--schedule", "seq1f1b", "--stages", "4", "--micro-batches", "4", "--splits", "2", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    stages = [[Action(**a) for a in st] for st in data["stages"]]
    assert stages == build_schedule(4, 4, 2).stages
    # uniform T=1: Seq1F1B is 1F1B over M*K = 8 units of T/2 with P-1 = 3 units of fill: (8 + 3) / 2
    assert data["latency"] == pytest.approx(5.5)
    assert data["bubble_ratio"] == pytest.approx(1 - 16 / (4 * 5.5))
    assert data["peak_live"] == [5, 4, 3, 2] and data["peak_live_micro_batches"] == [2.5, 2, 1.5, 1]


def test_cli_interleaved_bubble_and_plot(tmp_path) -> None:
    out = tmp_path / "g.png"
    r = _run(["pipeline", "--schedule", "interleaved", "--stages", "4", "--micro-batches", "8", "--chunks", "2",
              "--json", "--plot", str(out)])
    assert r.exit_code == 0, r.output
    # Megatron's interleaved bubble: (P - 1) / V of a micro-batch time
    assert json.loads(r.output)["latency"] == pytest.approx(8 + 3 / 2)
    assert out.stat().st_size > 10_000 and out.read_bytes()[:4] == b"\x89PNG"


def test_cli_table_and_bad_input() -> None:
    r = _run(["pipeline", "--schedule", "1f1b", "--stages", "3", "--micro-batches", "5"])
    assert r.exit_code == 0 and "bubble ratio" in r.output
    for bad in (["--schedule", "2f2b", "--stages", "2", "--micro-batches", "2"],
                ["--schedule", "1f1b", "--stages", "0", "--micro-batches", "2"],
                ["--schedule", "interleaved", "--stages", "5", "--micro-batches", "7"]):
        p = hp("pipeline", *bad)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
