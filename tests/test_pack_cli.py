"""`hydraplan pack` end to end (in this process, as helpers.hp runs it; the SIGKILL test launches the installed
command): written plans validate, bad input exits 2 with one line."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import hp, tiny_profile, write_run_inputs

from hydraplan.engine.candidate import PRUNE_RTOL
from hydraplan.schema import Scheme, Strategies, Summary

HYDRAPLAN = str(Path(sys.executable).with_name("hydraplan"))


@pytest.fixture
def inputs(tmp_path):
    rng = np.random.default_rng(2)
    lengths = np.minimum(rng.lognormal(6.0, 1.2, 2000).astype(np.int64) + 1, 4000)
    profile, data, strat = write_run_inputs(tmp_path, lengths, Strategies(candidates=[
        {"name": "mixed", "pipelines": [{"tp": 2, "pp": 1, "cp": 1}, *[{"tp": 1, "pp": 1, "cp": 1}] * 2]},
        {"name": "pp2", "pipelines": [{"tp": 1, "pp": 2, "cp": 1}, {"tp": 1, "pp": 2, "cp": 1}]},
    ]))
    return {"profile": profile, "data": data, "strategies": strat, "tmp": tmp_path}


def pack_args(inputs, out, *extra, iterations=4):
    return ["pack", "--profile", inputs["profile"], "--dataset", inputs["data"], "--gpus", 4,
            "--tokens-per-iter", 15000, "--iterations", iterations, "--out", out, "--workers", 1, *extra]


def test_pack_then_validate(inputs):
    out = inputs["tmp"] / "run"
    r = hp(*pack_args(inputs, out, "--strategies", inputs["strategies"], "--seed", 3))
    assert r.returncode == 0, r.stderr
    assert "planned 4 iterations" in r.stdout
    summary = Summary.model_validate_json((out / "summary.json").read_text())
    assert [i.iteration for i in summary.iterations] == [0, 1, 2, 3]
    assert summary.args.seed == 3 and summary.args.strategies == str(inputs["strategies"].resolve())
    for it in summary.iterations:
        # static: the baseline's layout, added; batch:k: strategies made for the batch
        assert {k for k in it.candidates_s if not k.startswith("batch:")} == {"mixed", "pp2", "static"}
        assert it.estimate_s == min(v for v in it.candidates_s.values() if v is not None)
        assert it.solver and it.solver_s > 0
    # hand-written candidates had no ranks: the run's strategies.json has them placed
    placed = Strategies.model_validate_json((out / "strategies.json").read_text())
    assert all(p.ranks is not None for c in placed.candidates for p in c.pipelines)
    v = hp("validate", out, "--profile", inputs["profile"], "--json")
    assert v.returncode == 0, v.stdout
    assert json.loads(v.stdout)["plans"] == 4


def test_no_static_and_candidates_only_use_the_file_as_given(inputs):
    out = inputs["tmp"] / "run"
    r = hp(*pack_args(inputs, out, "--strategies", inputs["strategies"], "--no-static", "--candidates-only"))
    assert r.returncode == 0, r.stderr
    summary = Summary.model_validate_json((out / "summary.json").read_text())
    assert summary.args.static is False and summary.args.synthesize is False
    assert summary.synthesized_iterations == 0
    for it in summary.iterations:
        assert set(it.candidates_s) == {"mixed", "pp2"}
    placed = Strategies.model_validate_json((out / "strategies.json").read_text())
    assert [c.name for c in placed.candidates] == ["mixed", "pp2"]
    # one forced candidate: every plan uses it, even where the static layout would be faster
    only = inputs["tmp"] / "only.json"
    only.write_text(Strategies(candidates=[placed.candidates[1]]).model_dump_json(by_alias=True))
    r = hp(*pack_args(inputs, out, "--strategies", only, "--no-static", "--candidates-only"))
    assert r.returncode == 0, r.stderr
    summary = Summary.model_validate_json((out / "summary.json").read_text())
    assert {it.strategy for it in summary.iterations} == {"pp2"}


def test_synthesized_plans_validate_and_count_process_groups(inputs):
    out = inputs["tmp"] / "run"
    r = hp(*pack_args(inputs, out, "--strategies", inputs["strategies"], "--no-static", "--synthesize", iterations=6))
    assert r.returncode == 0, r.stderr
    summary = Summary.model_validate_json((out / "summary.json").read_text())
    plans = [json.loads((out / f"iter_{i:06d}.json").read_text()) for i in range(6)]
    made = [p for p in plans if p.get("synthesized")]
    assert summary.synthesized_iterations == len(made) > 0
    groups = set()
    for p in plans:  # TP and CP groups of more than one rank, as runtime/groups.py creates them
        for q in p["pipelines"]:
            for s in range(q["pp"]):
                stage = q["ranks"][s * q["tp"] * q["cp"]:(s + 1) * q["tp"] * q["cp"]]
                groups |= {tuple(stage[c * q["tp"]:(c + 1) * q["tp"]]) for c in range(q["cp"]) if q["tp"] > 1}
                groups |= {tuple(stage[t::q["tp"]]) for t in range(q["tp"]) if q["cp"] > 1}
    assert summary.new_process_groups == len(groups)
    v = hp("validate", out, "--profile", inputs["profile"], "--json")
    assert v.returncode == 0, v.stdout


def megatron_by_hand(lengths: list[int], scheme: Scheme, gpus: int, capacity: int) -> float:
    """First-fit decreasing to `capacity`, bins dealt round-robin, the canonical estimate (docs/formats.md)."""
    bins: list[list[int]] = []
    for l in sorted(lengths, reverse=True):
        for b in bins:
            if sum(b) + l <= capacity:
                b.append(l)
                break
        else:
            bins.append([l])
    t = scheme.time
    times = [sum(t.a * l * l + t.b * l for l in b) + t.c for b in bins]
    d = gpus // scheme.gpus
    return max(sum(times[k::d]) + (scheme.pp - 1) * max(times[k::d]) for k in range(d) if times[k::d])


def test_summary_scores_the_megatron_baseline_on_the_same_batches(inputs):
    out = inputs["tmp"] / "run"
    r = hp(*pack_args(inputs, out, "--strategies", inputs["strategies"]))
    assert r.returncode == 0, r.stderr
    summary = Summary.model_validate_json((out / "summary.json").read_text())
    context = max(int(x) for x in inputs["data"].read_text().split())
    holding = [s for s in tiny_profile().schemes if s.max_len >= context]
    batches = [[s["length"] for s in json.loads((out / f"iter_{i:06d}.json").read_text())["batch"]]
               for i in range(4)]
    by_hand = {s.label: [megatron_by_hand(b, s, 4, context) for b in batches] for s in holding}
    best = min(by_hand, key=lambda k: np.mean(by_hand[k]))  # only 4 iterations: all of them are the probe
    assert summary.baseline == f"megatron {best}x2"
    assert [i.baselines_s["megatron"] for i in summary.iterations] == pytest.approx(by_hand[best], rel=1e-12)
    assert summary.mean_baseline_s == pytest.approx(np.mean(by_hand[best]), rel=1e-12)
    assert f"{summary.mean_baseline_s / summary.mean_estimate_s:.2f}x slower" in r.stdout
    # the baseline's layout is a candidate too, so no plan is slower than it packed by our solvers
    static = next(c for c in Strategies.model_validate_json((out / "strategies.json").read_text()).candidates
                  if c.name == "static")
    assert [f"<{p.tp},{p.pp},{p.cp}>" for p in static.pipelines] == [best] * 2
    for it in summary.iterations:  # a pruned one: up to pruning's tie tolerance (a tie goes to the earlier candidate)
        solve = next(c for c in it.candidates if c.name == "static")
        assert it.estimate_s <= (solve.bound_s if solve.pruned else solve.estimate_s) * (1 + PRUNE_RTOL)


def test_no_candidate_holds_a_sequence_exits_2_naming_the_length(inputs):
    data = inputs["tmp"] / "long.txt"
    data.write_text("100\n5000\n200\n")
    args = pack_args(inputs, inputs["tmp"] / "run", "--strategies", inputs["strategies"])
    args[args.index(inputs["data"])] = data
    args[args.index(15000)] = 5000  # within the 5,300 tokens of the file: a larger batch is refused first
    r = hp(*args)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "length 5000" in r.stderr and "largest MaxLen is 4096" in r.stderr


def test_strategies_with_an_unknown_scheme_exit_2(inputs):
    bad = inputs["tmp"] / "bad.json"
    bad.write_text(json.dumps({"schema": "hydraplan.strategies/v1", "candidates": [
        {"name": "x", "pipelines": [{"tp": 4, "pp": 1, "cp": 1}]}]}))
    r = hp(*pack_args(inputs, inputs["tmp"] / "run", "--strategies", bad))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "bad.json" in r.stderr and "<4,1,1>" in r.stderr


def test_resume_with_other_arguments_exits_2(inputs):
    out = inputs["tmp"] / "run"
    assert hp(*pack_args(inputs, out, "--strategies", inputs["strategies"])).returncode == 0
    r = hp(*pack_args(inputs, out, "--strategies", inputs["strategies"], "--seed", 9, "--resume"))
    assert r.returncode == 2 and "args.seed" in r.stderr
    again = hp(*pack_args(inputs, out, "--strategies", inputs["strategies"], "--resume"))
    assert again.returncode == 0, again.stderr


def test_resume_after_sigkill_equals_an_uninterrupted_run(inputs):
    """The harshest interruption: atomic writes leave only whole plans, summary.json may lag behind them."""
    import os
    import signal
    import time

    args = ["--strategies", inputs["strategies"]]
    full, cut = inputs["tmp"] / "full", inputs["tmp"] / "cut"
    proc = subprocess.Popen([HYDRAPLAN, *map(str, pack_args(inputs, cut, *args, iterations=40))],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (cut / "iter_000003.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    recorded = Summary.model_validate_json((cut / "summary.json").read_text()).iterations
    assert 0 < len(list(cut.glob("iter_*.json"))) < 40 and len(recorded) < 40
    assert hp(*pack_args(inputs, cut, *args, "--resume", iterations=40)).returncode == 0
    assert hp(*pack_args(inputs, full, *args, iterations=40)).returncode == 0
    names = sorted(p.name for p in full.glob("*.json") if p.name != "summary.json")
    assert len(names) == 41 and names == sorted(p.name for p in cut.glob("*.json") if p.name != "summary.json")
    assert all((full / n).read_bytes() == (cut / n).read_bytes() for n in names)


def test_pack_skips_and_reports_empty_documents(inputs):
    """A corpus with empty documents plans fine; no plan holds one, and `doc` stays the file's row."""
    lengths = [int(v) for v in inputs["data"].read_text().split()]
    with_empty = [0 if i % 7 == 3 else v for i, v in enumerate(lengths)]
    data = inputs["tmp"] / "with_empty.txt"
    data.write_text("\n".join(map(str, with_empty)) + "\n")
    out = inputs["tmp"] / "run"
    r = hp(*pack_args({**inputs, "data": data}, out, "--strategies", inputs["strategies"], iterations=2))
    assert r.returncode == 0, r.stderr
    empty = with_empty.count(0)
    assert f"skipped {empty:,} empty documents (0 tokens) of {data}" in r.stdout
    assert Summary.model_validate_json((out / "summary.json").read_text()).empty_documents == empty
    for f in sorted(out.glob("iter_*.json")):
        for s in json.loads(f.read_text())["batch"]:
            assert s["length"] == with_empty[s["doc"]] > 0


def test_bound_records_the_any_strategy_bound_and_leaves_the_plans(inputs):
    """--bound: every iteration's bound_s is at most its plan's end-to-end time (the run's objective), the
    summary's ratios are those of the iterations, and the plans are those of a run without it."""
    runs = {}
    for name, extra in (("plain", ()), ("bound", ("--bound",))):
        out = inputs["tmp"] / name
        r = hp(*pack_args(inputs, out, "--strategies", inputs["strategies"], *extra, iterations=3))
        assert r.returncode == 0, r.stderr
        runs[name] = out
    summary = Summary.model_validate_json((runs["bound"] / "summary.json").read_text())
    ratios = [it.iteration_s / it.bound_s for it in summary.iterations]
    assert all(r >= 1 - 1e-9 for r in ratios)
    assert summary.max_plan_over_bound == pytest.approx(max(ratios))
    assert summary.mean_plan_over_bound == pytest.approx(float(np.mean(ratios)))
    for k in range(3):
        a, b = (json.loads((runs[n] / f"iter_{k:06d}.json").read_text()) for n in ("plain", "bound"))
        assert a["pipelines"] == b["pipelines"]
