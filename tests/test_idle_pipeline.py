"""A pipeline without a micro-batch this iteration (a small batch on several data-parallel pipelines) runs no
action and sends no message on any schedule, and both clocks of `profile --check` give it 0 s; a launched run
that fails shows the failing rank's own line (hydraplan.app.measure.failure_line)."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import make_plan

from hydraplan.app.measure import Runs, check_plans, failure_line
from hydraplan.core.errors import UserError
from hydraplan.runtime.model import CONFIGS, StageModule
from hydraplan.runtime.pipeline_exec import StageComm, run_1f1b
from hydraplan.runtime.profile import phases_of
from hydraplan.runtime.replay import StepStats
from hydraplan.runtime.seq1f1b import Seq1F1BStage, run_in_process, run_seq1f1b
from hydraplan.store.fileio import write_model
from hydraplan.store.profiles import load_profile

TINY = CONFIGS["tiny"]


def comm(stage: int, pp: int) -> StageComm:
    """A stage's neighbours; the process group is never initialized here, so any message would raise."""
    return StageComm(stage, pp, stage - 1 if stage else None, stage + 1 if stage < pp - 1 else None, TINY.hidden,
                     torch.float64, torch.device("cpu"))


@pytest.mark.parametrize("pp", [1, 2])
def test_every_stage_of_an_idle_pipeline_runs_nothing_on_either_schedule(pp):
    """1F1B (plans without splits) and Seq1F1B (plans with splits, and every plan under `profile --check`, which
    records each action's CPU time): no loss, no action, no message, on every stage."""
    for stage in range(pp):
        module = StageModule(TINY, pp=pp, stage=stage, dtype=torch.float64)
        assert float(run_1f1b(module, [], comm(stage, pp), 1.0)) == 0.0
        loss, state = run_seq1f1b(module, [], [], comm(stage, pp), 1.0)
        assert float(loss) == 0.0 and state.cpu_s == {} and state.peak_live == 0
    run_in_process([Seq1F1BStage(StageModule(TINY, pp=pp, stage=s, dtype=torch.float64), [], [], 1.0) for s in range(pp)])


STATS = StepStats(loss=1.0, pull_s=0.01, propagate_s=0.5, push_s=0.02, step_s=0.03, exposed_s=0.04, iteration_s=0.7)


@pytest.mark.parametrize("pp", [1, 2])
def test_both_clocks_give_an_idle_pipeline_zero_seconds(pp):
    """Pipeline 0 ran one micro-batch (forward 0.1 s, backward 0.2 s on each stage), pipeline 1 none; ranks in no
    pipeline report None. cpu clock: the critical path of pipeline 0's schedule, 0 for pipeline 1; wall clock:
    the step's propagation for pipeline 0, 0 for pipeline 1."""
    busy = {("F", 0, 0): 0.1, ("B", 0, 0): 0.2}
    got = [(0, s, pp, busy) for s in range(pp)] + [(1, s, pp, {}) for s in range(pp)] + [None]
    cpu = phases_of(STATS, got, 2, "cpu")
    assert cpu.per_pipeline == pytest.approx([0.3 * pp, 0.0])
    assert cpu.propagate_s == pytest.approx(0.3 * pp) and cpu.iteration_s == pytest.approx(0.3 * pp + 0.04 + 0.03)
    wall = phases_of(STATS, got, 2, "wall")
    assert wall.per_pipeline == [0.5, 0.0] and wall.propagate_s == 0.5 and wall.iteration_s == 0.7
    idle = phases_of(STATS, [(0, s, pp, {}) for s in range(pp)], 1, "cpu")
    assert idle.per_pipeline == [0.0] and idle.propagate_s == 0.0


@pytest.mark.slow
def test_profile_check_replays_a_run_with_an_idle_pipeline(tmp_path, monkeypatch):
    """The issue's case: two data-parallel pipelines, a batch that fills only the first (issue 37: an IndexError
    on the idle rank, the job ending in SIGABRT); replayed on 2 ranks with the cpu clock. Then the same replay
    with rank 1 failing: the error names that rank's own line, not torchrun's summary."""
    plan = make_plan(0, "dp", [(1, 1, [0], [[40, 10]]), (1, 1, [1], [])], gpus=2)
    write_model(tmp_path / "iter_000000.json", plan)
    runs = Runs(clock="cpu", warmup=0, repeats=1)
    (row,) = check_plans(str(tmp_path), load_profile("cpu-tiny"), runs, timeout_s=240)
    (busy, idle) = row.pipelines
    assert busy[2] > 0 and idle == ("<1,1,1>", 0.0, 0.0)
    monkeypatch.setenv("HYDRAPLAN_INJECT_FAULT", "oom@1:0")
    with pytest.raises(UserError) as e:
        check_plans(str(tmp_path), load_profile("cpu-tiny"), runs, timeout_s=240)
    assert re.search(r"--check .*: rank 1 on .*, iteration 0 \(.*iter_000000\.json\): out of memory: CUDA out of memory",
                     str(e.value)) and "\n" not in str(e.value)


TORCHRUN_ABORT = """[rank1]: Traceback (most recent call last):
[rank1]:   File "/x/runtime/seq1f1b.py", line 339, in run_seq1f1b
[rank1]:     K = len(splits[0]) - 1
[rank1]:             ~~~~~~^^^
[rank1]: IndexError: list index out of range
terminate called without an active exception
Traceback (most recent call last):
  File "/x/torch/distributed/run.py", line 1032, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
hydraplan.runtime.profile FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_11:59:01
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 17675)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 17675
============================================================
"""


def test_a_failed_launch_shows_the_failing_ranks_own_line():
    said = "profile: rank 1 on host, iteration 0 (r/iter_000000.json): bad data: list index out of range"
    assert failure_line(f"W1127 warning\n{said}\nE1127 failed (exitcode: 1)\n{TORCHRUN_ABORT}", "profile") == said
    assert failure_line(TORCHRUN_ABORT, "profile") == "rank 1: IndexError: list index out of range"
    summary_only = TORCHRUN_ABORT[TORCHRUN_ABORT.index("terminate"):]
    assert failure_line(summary_only, "profile") == "rank 1 exited with exit code -6 (pid: 17675)"
    assert failure_line("", "profile") is None
