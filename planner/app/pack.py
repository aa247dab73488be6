"""`hydraplan pack`: plan a run's iterations into a run folder (store/runfolder.py), resumable at any point.

The run (job/planrun.py: strategies, static baseline, Planner, batches) is what a job planning while it
trains uses too. Batches are sampled in the parent, solved in a process pool and written in iteration
order, so the output depends only on the config and its seed, never on the worker count or on timing.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from typing import TYPE_CHECKING, Protocol

import numpy as np

from hydraplan.app.config import PackConfig
from hydraplan.core.batch import Batch
from hydraplan.core.errors import UserError
from hydraplan.core.schema import IterationSummary, OutlierDelay, PackArgs, Summary
from hydraplan.engine.groups import GroupLedger
from hydraplan.engine.pool import WorkerPool, planning_heap, settle_heap
from hydraplan.engine.strategies import strategies_digest
from hydraplan.store.fileio import load_model, model_json, write_model
from hydraplan.store.planfile import read_plan, write_plan
from hydraplan.store.profiles import load_profile
from hydraplan.store.runfolder import STRATEGIES_FILE, SUMMARY_FILE, SummaryWriter, plan_path, remove_plans_from
from hydraplan.store.runlock import locked_folder

if TYPE_CHECKING:
    from types import FrameType

    from hydraplan.engine.planner import Planner
    from hydraplan.methods.static import StaticBaseline


class PackProgress(Protocol):
    def start(self, done: int, total: int) -> None: ...
    def advance(self, it: IterationSummary) -> None: ...


def run_pack(config: PackConfig, progress: PackProgress | None = None) -> Summary:
    """Plan `config.iterations` sampled batches into config.out. The folder is locked for the run
    (store/runlock.py): a second run on it fails at once instead of mixing plans. The planning workers start
    first, so that their start-up overlaps the run's preparation."""
    workers = config.workers or os.cpu_count() or 1
    with _signals_kept() as check, locked_folder(config.out, "--out"), WorkerPool(workers if workers > 1 else 0) as pool:
        return _run_pack_locked(config, progress, pool if pool.size else None, check)


@contextmanager
def _signals_kept() -> Iterator[Callable[[], None]]:
    """A stop signal's handler, raising inside extension code, can be swallowed there (pyarrow's Cython, numba's
    cache loading print or drop it), and the run would go on. Each signal is remembered, and the returned check,
    called between the run's steps, calls its handler again (the caller's, e.g. the CLI's one-line exit)."""
    names = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    previous = {s: signal.getsignal(s) for s in names}
    got: list[int] = []

    def remember(signum: int, frame: FrameType | None) -> None:
        got.append(signum)
        handler = previous[signal.Signals(signum)]
        if callable(handler):
            handler(signum, frame)

    def check() -> None:
        handler = previous[signal.Signals(got[0])] if got else None
        if callable(handler):
            handler(got[0], None)

    for s in names:
        if callable(previous[s]):
            signal.signal(s, remember)
    try:
        yield check
    finally:
        for s in names:
            if signal.getsignal(s) is remember:
                signal.signal(s, previous[s])


def _run_pack_locked(config: PackConfig, progress: PackProgress | None, pool: WorkerPool | None,
                     check: Callable[[], None]) -> Summary:
    from hydraplan.job.planrun import PlanRun  # the solvers load here, while the workers start
    from hydraplan.store.datasets import BatchTooLarge

    profile = load_profile(config.profile)
    args = config.args(hashlib.sha256(model_json(profile).encode()).hexdigest())
    resumed = _resume_state(config, args)
    # a resumed run plans with its own strategies.json; a bad --strategies fails before the baseline runs
    try:
        run = PlanRun.prepare(config, profile, config.out / STRATEGIES_FILE if resumed is not None else None)
    except BatchTooLarge as e:
        raise UserError(f"--tokens-per-iter: {e}") from None
    check()
    planner, dataset = run.planner, run.dataset
    digest = strategies_digest(planner.strategies)
    if resumed is not None and resumed.strategies_sha256 != digest:
        raise UserError(f"{config.out / STRATEGIES_FILE}: the candidates changed since the run started; "
                        "--resume needs the same strategies")
    done = resumed.iterations if resumed is not None else []
    summary = Summary(
        profile=profile.name, gpus=config.gpus, dataset=dataset.name, tokens_per_iter=config.tokens_per_iter,
        seed=config.seed, iterations=list(done), args=args, strategies_sha256=digest,
        iterations_requested=config.iterations, context_len=config.context_len, objective=config.objective,
        empty_documents=dataset.empty, truncated_documents=dataset.truncated,
    )
    if run.rule is not None:
        summary.outlier_delay = OutlierDelay(threshold=run.rule.thresholds[0], release_tokens=run.rule.tokens,
                                             max_wait=run.rule.max_wait)
    summary.baseline = run.baseline.label if run.baseline is not None else None
    remove_plans_from(config.out, len(done))
    write_model(config.out / STRATEGIES_FILE, planner.strategies)
    if progress is not None:
        progress.start(len(done), config.iterations)
    _plan_all(config, planner, run.batches(len(done)), summary, run.baseline, progress, pool, check)
    return summary


def _plan_all(config: PackConfig, planner: Planner, batches: Iterator[Batch], summary: Summary,
              baseline: StaticBaseline | None, progress: PackProgress | None, pool: WorkerPool | None,
              check: Callable[[], None]) -> None:
    """Plan the batches in order, writing each plan and (now and then) the summary; the summary is written
    last whatever stops the run, so it records every plan written."""
    groups = GroupLedger(planner.scheme_keys, config.gpus)
    summary.startup_process_groups, summary.process_groups_per_rank = len(groups.family), groups.per_rank
    for it in summary.iterations:  # a resumed run: the groups its plans already use
        summary.synthesized_iterations += groups.record(read_plan(plan_path(config.out, it.iteration, config.format)))
    summary.new_process_groups, summary.groups_outside_family = groups.created, groups.outside
    writer = SummaryWriter(config.out, summary)
    try:
        with planning_heap(), closing(planner.plan_stream(batches, pool=pool)) as stream:
            for result in stream:
                check()
                summary.synthesized_iterations += groups.record(result.plan)
                summary.new_process_groups, summary.groups_outside_family = groups.created, groups.outside
                if baseline is not None:
                    lengths = np.array([s.length for s in result.plan.batch], dtype=np.int64)
                    prop, e2e = baseline.estimates_s(lengths)
                    result.summary.baselines_s["megatron"] = prop
                    result.summary.baselines_iteration_s["megatron"] = e2e
                write_plan(plan_path(config.out, result.plan.iteration, config.format), result.plan)
                summary.iterations.append(result.summary)
                writer.maybe_write()
                if progress is not None:
                    progress.advance(result.summary)
                del result  # the plan is written: freed now rather than scanned by the collection
                settle_heap()
    finally:  # interrupted or not, record every plan written so far
        writer.write()


def _resume_state(config: PackConfig, args: PackArgs) -> Summary | None:
    """The interrupted run's summary, checked against this run's arguments and its plan files."""
    path = config.out / SUMMARY_FILE
    if not config.resume or not path.exists():
        return None
    summary = load_model(Summary, path)
    if summary.args is None:
        raise UserError(f"{path}: field args: missing, so this run cannot be resumed safely")
    old, new = summary.args.model_dump(), args.model_dump()
    diff = [k for k in new if old.get(k) != new[k]]
    if diff:
        k = diff[0]
        raise UserError(f"{path}: field args.{k}: the run was started with {old.get(k)!r}, now {new[k]!r}; "
                        "--resume needs the same arguments")
    if config.outlier_delay and summary.iterations_requested != config.iterations:
        raise UserError(f"{path}: field iterations_requested: the run was started with {summary.iterations_requested}, "
                        f"now {config.iterations}; --outlier-delay drains its queue at the last iteration, so --resume "
                        "needs the same --iterations")
    for i, it in enumerate(summary.iterations):
        if it.iteration != i:
            raise UserError(f"{path}: field iterations.{i}.iteration: expected {i} (got {it.iteration})")
        if not plan_path(config.out, i, config.format).exists():
            raise UserError(f"{path}: iteration {i} is recorded but {plan_path(config.out, i, config.format)} is missing")
    return summary
