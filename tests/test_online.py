"""Planning while training (runtime/online.py): the job trains exactly pack's plans, whatever its number of
nodes or planner processes, resumes planning where it stopped, and makes every process group up front."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port
from ranks import launch, run_ranks

from hydraplan.app.config import PackConfig
from hydraplan.app.pack import run_pack
from hydraplan.job.planrun import PlanRun
from hydraplan.loader import read_plans
from hydraplan.runtime.groups import plan_groups
from hydraplan.runtime.online import check_replay_args, online_config, startup_groups
from hydraplan.runtime.run_plan import parse_args
from hydraplan.store.profiles import load_profile

SCRIPT = Path(__file__).resolve().parents[1] / "runtime" / "run_plan.py"
TINY = ["--profile", "cpu-tiny", "--dataset", "builtin:wikipedia", "--tokens-per-iter", "1536", "--context-len", "768"]
TINY_CAD = [*TINY[:4], "--tokens-per-iter", "2048", "--context-len", "2048"]  # documents long enough for CAD to win some


def _pack(tmp: Path, args: list[str], iterations: int) -> list:
    """pack's plans for the same arguments (parsed as run_plan parses them) on 4 GPUs."""
    config = online_config(parse_args([*args, "--iterations", str(iterations)]), 4).run
    run_pack(PackConfig(**config.model_dump(exclude={"profile_sha256"}), out=tmp / "pack", workers=1))
    return list(read_plans(tmp / "pack"))


def _torchrun(args: list[str], nproc: int = 4, nodes: int = 1) -> list[subprocess.CompletedProcess]:
    """run_plan under `nodes` torchrun agents of `nproc / nodes` ranks each (on this machine), all at once; one node's
    ranks forked as torchrun would start them (tests/ranks.py)."""
    if nodes == 1:
        return [launch(nproc, [*args, "--timeout-s", "60"], timeout=300)]
    port, env = free_port(), dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc // nodes)]
    if nodes > 1:
        cmd += ["--nnodes", str(nodes), "--master-addr", "127.0.0.1"]
    procs = [subprocess.Popen([*cmd, *(["--node-rank", str(n)] if nodes > 1 else []), "--master-port", str(port),
                               str(SCRIPT), *args, "--timeout-s", "60"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for n in range(nodes)]
    return [subprocess.CompletedProcess(cmd, p.returncode, out, err)
            for p, (out, err) in zip(procs, _communicate(procs, 300, f"run_plan timed out: {cmd}"))]


def _communicate(procs: list[subprocess.Popen], timeout: float, why: str) -> list[tuple[str, str]]:
    """Every process's (stdout, stderr); all killed and the test failed with `why` when one outlives `timeout`."""
    out = []
    for p in procs:
        try:
            out.append(p.communicate(timeout=timeout))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(why)
    return out


def _waits(stdout: str) -> list[tuple[int, int, float]]:
    return [(int(i), int(n), float(w)) for i, n, w in
            re.findall(r"^plan: iteration (\d+) from node (\d+), training waited (\S+)s$", stdout, re.M)]


@pytest.mark.slow
def test_training_while_planning_is_exact_and_trains_packs_plans(tmp_path):
    """4 ranks, 2 planner processes: every plan pack's (outlier delay, CAD, Seq1F1B, CP sharding asked for),
    fp64 training equal to one process, the plans saved compact."""
    args = [*TINY_CAD, "--seed", "2", "--outlier-delay", "--cad", "--seq1f1b", "2", "--cp-shard"]
    want = _pack(tmp_path, args, 4)
    res, = _torchrun([*args, "--iterations", "4", "--planners-per-node", "2", "--dtype", "fp64", "--verify",
                      "--save-plans", str(tmp_path / "trained"), "--format", "compact"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert list(read_plans(tmp_path / "trained")) == want
    assert any(p.cad is not None for p in want)
    diffs = [float(x) for x in re.findall(r"^verify: iteration \d+ max_abs_param_diff=(\S+)$", res.stdout, re.M)]
    assert len(diffs) == 4 and max(diffs) <= 1e-9
    assert [(i, n) for i, n, _ in _waits(res.stdout)] == [(i, 0) for i in range(4)]
    assert re.search(r"^groups: \d+ process groups made before the first iteration", res.stdout, re.M)


@pytest.mark.slow
def test_two_nodes_share_the_planning_and_train_the_same_plans(tmp_path):
    """Two torchrun agents (--nnodes 2): iterations alternate between the nodes' planners; a profile with
    cp > 1 schemes, so CP sharding is planned."""
    strategies = tmp_path / "cp.json"  # cp = 2 pipelines only, so the plans carry CP shards
    strategies.write_text('{"schema": "hydraplan.strategies/v1", "candidates": [{"name": "cp2", "pipelines": '
                          '[{"tp": 1, "pp": 1, "cp": 2}, {"tp": 1, "pp": 1, "cp": 2}]}]}')
    # 7B on 4 GPUs: a <1,1,2> rank holds at most 966 tokens (the memory model's LNK windows and CP K/V counted)
    args = ["--profile", "h100-llama2-7b", "--dataset", "builtin:wikipedia", "--tokens-per-iter", "3000",
            "--context-len", "768", "--cp-shard", "--outlier-delay", "--no-static", "--strategies", str(strategies),
            "--candidates-only"]
    want = _pack(tmp_path, args, 4)
    assert any(mb.cp_shard for p in want for q in p.pipelines for mb in q.micro_batches)
    res = _torchrun([*args, "--iterations", "4", "--planners-per-node", "1", "--save-plans", str(tmp_path / "trained")],
                    nodes=2)
    assert all(r.returncode == 0 for r in res), "\n".join(r.stdout + r.stderr for r in res)
    assert list(read_plans(tmp_path / "trained")) == want
    assert [(i, n) for i, n, _ in _waits(res[0].stdout)] == [(0, 0), (1, 1), (2, 0), (3, 1)]


@pytest.mark.slow
def test_resume_plans_from_where_training_stopped(tmp_path):
    base = [*TINY, "--seed", "3", "--outlier-delay", "--planners-per-node", "1"]
    want = _pack(tmp_path, base, 4)
    args = [*base, "--iterations", "4"]
    first, = _torchrun([*args, "--stop-at", "2", "--save", str(tmp_path / "ckpt")])
    assert first.returncode == 0, first.stdout + first.stderr
    assert [i for i, _, _ in _waits(first.stdout)] == [0, 1]
    changed, = _torchrun([*base, "--iterations", "5", "--resume", str(tmp_path / "ckpt")])
    assert changed.returncode != 0 and "field iterations: the run was planned with 4, now 5" in changed.stderr
    rest, = _torchrun([*args, "--resume", str(tmp_path / "ckpt"), "--save-plans", str(tmp_path / "rest")])
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert [i for i, _, _ in _waits(rest.stdout)] == [2, 3]
    assert list(read_plans(tmp_path / "rest")) == want[2:]


def test_missing_planning_options_are_one_line():
    from hydraplan.core.errors import UserError

    with pytest.raises(UserError, match="give --profile, --dataset, --tokens-per-iter and --iterations"):
        online_config(parse_args(["--profile", "cpu-tiny"]), 4)
    with pytest.raises(UserError, match="--planners-per-node must be a positive integer"):
        online_config(parse_args([*TINY, "--iterations", "2", "--planners-per-node", "0"]), 4)
    with pytest.raises(UserError, match="--dispatch must be"):
        online_config(parse_args([*TINY, "--iterations", "2", "--dispatch", "x"]), 4)
    with pytest.raises(UserError, match="--outlier-delay: planning options apply only without a plan argument"):
        check_replay_args(parse_args(["plans/example", "--outlier-delay"]))


@pytest.mark.parametrize("args,gpus", [
    ([*TINY_CAD, "--cad"], 4),
    (["--profile", "h100-llama2-7b", "--dataset", "builtin:wikipedia", "--tokens-per-iter", "200000", "--context-len",
      "32768", "--objective", "propagation", "--synthesize"], 64),
])
def test_every_group_of_the_plans_is_made_at_start_up(args, gpus):
    """The start-up family holds every TP, CP and CAD group the run's plans use (CAD's, and strategies made
    for a batch), so none is made mid-run."""
    config = online_config(parse_args([*args, "--iterations", "3"]), gpus).run
    run = PlanRun.prepare(config, load_profile(config.profile))
    plans = [run.planner.solve(b).plan for b in run.batches()]
    assert set(plan_groups(plans)) <= set(startup_groups(run))
    assert any(p.cad is not None or p.synthesized for p in plans)


@pytest.mark.slow
def test_a_plan_the_job_cannot_train_stops_every_rank_with_one_line(tmp_path):
    """Token ids beyond the model's vocabulary: every rank refuses the first plan and exits 2, none hangs
    (the planning rank stops the plan feed); rank 0 prints the job's one line."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    pq.write_table(pa.table({"input_ids": [rng.integers(0, 500, n).tolist() for n in rng.integers(20, 200, 300)]}),
                   tmp_path / "tokens.parquet")
    args = ["--profile", "cpu-tiny", "--dataset", str(tmp_path / "tokens.parquet"), "--tokens-per-iter", "600",
            "--iterations", "6", "--planners-per-node", "1", "--timeout-s", "60"]
    for r in run_ranks(2, args):  # a rank that hangs instead of exiting fails the test at the timeout
        lines = [line for line in r.stderr.splitlines() if line.startswith("run_plan:")]
        assert r.returncode == 2 and len(lines) == (r.rank == 0) and all("vocab" in line for line in lines), r.stderr


@pytest.mark.slow
def test_an_error_while_planning_and_training_is_one_line_naming_the_plan_source(tmp_path):
    """HYDRAPLAN_INJECT_FAULT=comm@1:1 while the job plans its own iterations: one line naming rank 1,
    iteration 1 and where its plan came from (the planning node), no traceback, every rank exits 1, the
    planning rank's planner processes with it."""
    t0 = time.monotonic()
    res = run_ranks(2, [*TINY, "--iterations", "3", "--planners-per-node", "1", "--timeout-s", "300"],
                    env=dict(os.environ, HYDRAPLAN_INJECT_FAULT="comm@1:1"))
    outs = [(r.stdout, r.stderr) for r in res]
    assert time.monotonic() - t0 < 240 and [r.returncode for r in res] == [1, 1]
    lines = [line for _, err in outs for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in "".join(err for _, err in outs), lines
    assert lines[0].startswith("run_plan: rank 1 on ") and "iteration 1 (planned on node 0)" in lines[0] \
        and "communication error" in lines[0], lines


def test_every_plan_is_prepared_before_training_takes_it():
    """PlanFeed.prepare_with (run_plan makes each plan's LNK plan there, ahead of its step): the plans already
    queued are prepared when it is called, before training starts, every later one on the feed thread as it
    arrives (the queue holds one plan, so at most two are queued by then); each once, before training takes it."""
    import threading
    import time

    import torch.distributed as dist

    from hydraplan.runtime.online import PlanFeed, Topology

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        config = online_config(parse_args([*TINY, "--iterations", "3"]), 4).run
        group = dist.new_group(backend="gloo")
        feed = PlanFeed(PlanRun.prepare(config, load_profile(config.profile)), Topology.of(group), 0, 3, 1, 1, group,
                        check=lambda plan: None)
        while feed.ready.empty():
            time.sleep(0.01)
        prepared: list[tuple[int, str]] = []
        feed.prepare_with(lambda plan: prepared.append((plan.iteration, threading.current_thread().name)))
        early = len(prepared)
        for plan in feed:
            assert plan.iteration in [i for i, _ in prepared]
        feed.close()
    finally:
        dist.destroy_process_group()
    assert [i for i, _ in prepared] == list(range(3)) and 1 <= early <= 2
    assert [name for _, name in prepared] == ["MainThread"] * early + ["hydraplan-plan-feed"] * (3 - early)
