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
    solver_s is not import time; freeze the heap."""
    global _WORKER
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    importlib.import_module("hydraplan.solve.dispatch")
    importlib.import_module("hydraplan.solve.packing")
    _WORKER = solver
    freeze_heap()


def freeze_heap() -> None:
    """Leave everything alive now (the planner: at 8192 GPUs some 10^5 strategy objects) out of the garbage
    collector's full passes, which each plan's tens of thousands of new objects would otherwise trigger over
    and over: a third of a plan's time at that size. For processes that plan from here on."""
    gc.collect()
    gc.freeze()


def _solve_in_worker(batch: Any) -> Any:
    assert _WORKER is not None
    return _WORKER.solve(batch)
