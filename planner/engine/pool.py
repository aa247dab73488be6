"""Planning iterations in worker processes that die with their parent, results in input order."""

from __future__ import annotations

import gc
import importlib
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing import get_context
from typing import Any, Protocol

PR_SET_PDEATHSIG = 1


class Solver(Protocol):
    """What the pool runs: anything picklable that plans one batch (engine.planner.Planner)."""

    def solve(self, batch: Any) -> Any: ...


_WORKER: Solver | None = None


def solve_in_order(solver: Solver, batches: Iterable[Any], workers: int, window: int) -> Iterator[Any]:
    """`solver.solve` of every batch, in input order, `workers` processes solving up to `window` ahead.
    `solver` is pickled once into each worker; spawn, not forkserver: workers are our own children (so they
    can die with us) and no forkserver socket folder is left in /tmp when we are killed."""
    pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"),
                               initializer=_init_worker, initargs=(solver, os.getpid()))
    pending: deque[Future[Any]] = deque()
    try:
        for b in batches:
            pending.append(pool.submit(_solve_in_worker, b))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except BaseException:  # interrupted or failed: running solves are not needed, stop them now
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _die_with(parent: int) -> None:
    """Make this worker die with `parent` whatever kills it (SIGKILL included): the kernel's parent-death
    signal on Linux, elsewhere a thread that polls the parent. Without it a killed `pack` left its
    workers (and through them the resource tracker) running for minutes."""
    if sys.platform == "linux":
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)
            return

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="hydraplan-parent-watch", daemon=True).start()


def _init_worker(solver: Solver, parent: int) -> None:
    """Die with the parent; leave Ctrl-C to it (it stops the pool and prints one line, so workers print no
    KeyboardInterrupt tracebacks); keep the solver, and import the solvers now so the first iteration's
    solver_s is not import time; the heap collected once per plan."""
    global _WORKER
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    importlib.import_module("hydraplan.solve.dispatch")
    importlib.import_module("hydraplan.solve.packing")
    _WORKER = solver
    plan_heap()


def settle_heap() -> None:
    """Collect, then leave everything alive now out of every later pass (gc.freeze). Called once a process has
    built its planner (at 8192 GPUs some 10^5 strategy objects) and again after each plan (what the plan left
    alive: its summary record)."""
    gc.collect()
    gc.freeze()


def plan_heap() -> None:
    """The garbage collector of a process that only plans from here on: settled now, then run only by
    `settle_heap` once per plan. Left to its allocation counts, each plan's ~10^5 new objects (a 25K-sequence
    batch) set off pass after pass over what earlier plans kept (docs/results.md#planner-speed)."""
    settle_heap()
    gc.disable()


@contextmanager
def planning_heap() -> Iterator[None]:
    """`plan_heap` for the calling process while planning, the collector as it was afterwards."""
    enabled = gc.isenabled()
    plan_heap()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


def _solve_in_worker(batch: Any) -> Any:
    assert _WORKER is not None
    try:
        return _WORKER.solve(batch)
    finally:
        settle_heap()
