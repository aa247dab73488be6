"""Planning iterations in worker processes that die with their parent, results in input order.

A small pool of our own rather than concurrent.futures: Ctrl-C must stop it at any moment without a
worker traceback, a hang or a leaked semaphore. Workers are spawned with SIGINT blocked (so they never
see the terminal's Ctrl-C, not even while importing), talk to the parent over plain pipes (no locks or
semaphores to leak), and on any exception in the parent they are killed and reaped before it propagates.
"""

from __future__ import annotations

import gc
import importlib
import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import get_context, resource_tracker
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

PR_SET_PDEATHSIG = 1
PER_WORKER = 2  # batches sent ahead to one worker: it starts the next as soon as it sends a result


class Solver(Protocol):
    """What the pool runs: anything picklable that plans one batch (engine.planner.Planner)."""

    def solve(self, batch: Any) -> Any: ...


class WorkerError(RuntimeError):
    """A worker's exception that could not be sent as itself, or the traceback behind one that was."""


@dataclass
class _Worker:
    process: BaseProcess
    tasks: Connection  # parent -> worker: the solver, then (k, batch); EOF to stop
    results: Connection  # worker -> parent: (k, ok, result or (exception, traceback text))
    busy: list[int] = field(default_factory=list)


class WorkerPool:
    """`workers` planning processes, started at once, so that their imports overlap whatever the caller does
    before it has a solver (pack: the dataset, the proposal, the static baseline). Spawn, not forkserver:
    workers are our own children (so they can die with us) and no forkserver socket folder is left in /tmp
    when we are killed. On an exception they are killed; otherwise they stop once their tasks are done."""

    def __init__(self, workers: int) -> None:
        self.workers: list[_Worker] = []
        try:
            for _ in range(workers):
                self.workers.append(_start_worker())
        except BaseException:
            self.close(kill=True)
            raise

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.close(kill=kind is not None)

    @property
    def size(self) -> int:
        return len(self.workers)

    def close(self, kill: bool = False) -> None:
        for w in self.workers:
            if kill:  # interrupted or failed: running solves are not needed
                w.process.kill()
            w.tasks.close()  # an idle worker stops at the end of its task stream
        for w in self.workers:
            w.process.join()
            w.results.close()
        self.workers = []

    def solve_in_order(self, solver: Solver, batches: Iterable[Any], window: int) -> Iterator[Any]:
        """`solver.solve` of every batch, in input order, up to `window` ahead; `solver` is pickled once into
        each worker. Once per pool: it is closed afterwards."""
        try:
            for w in self.workers:
                w.tasks.send(solver)
            yield from _in_order(self.workers, iter(batches), window)
        except BaseException:
            self.close(kill=True)
            raise
        self.close()


def solve_in_order(solver: Solver, batches: Iterable[Any], workers: int, window: int) -> Iterator[Any]:
    """`WorkerPool.solve_in_order` on a pool of `workers` started now."""
    with WorkerPool(workers) as pool:
        yield from pool.solve_in_order(solver, batches, window)


def _in_order(pool: list[_Worker], batches: Iterator[Any], window: int) -> Iterator[Any]:
    done: dict[int, Any] = {}
    sent = given = 0
    more = True
    while True:
        while more and sent - given < window:
            w = min(pool, key=lambda w: len(w.busy))
            if len(w.busy) >= PER_WORKER:
                break
            batch = next(batches, _END)
            if batch is _END:
                more = False
                break
            w.tasks.send((sent, batch))
            w.busy.append(sent)
            sent += 1
        if given in done:
            yield done.pop(given)
            given += 1
            continue
        if not more and given == sent:
            return
        _collect(pool, done)


_END = object()


def _collect(pool: list[_Worker], done: dict[int, Any]) -> None:
    """Wait for results; a worker's exception raised here, a worker's death too."""
    by_conn = {id(w.results): w for w in pool}
    by_sentinel = {w.process.sentinel: w for w in pool}
    ready = wait([w.results for w in pool] + list(by_sentinel))
    for r in ready:
        if isinstance(r, Connection):
            w = by_conn[id(r)]
            try:
                k, ok, value = r.recv()
            except EOFError:
                continue  # it died: its sentinel says how
            w.busy.remove(k)
            if not ok:
                exc, text = value
                raise exc from WorkerError(text)
            done[k] = value
    for r in ready:
        if isinstance(r, int):  # a process sentinel (the rest are the result pipes)
            w = by_sentinel[r]
            if w.results.poll():  # its last results are still in the pipe: read them first
                return
            raise WorkerError(f"a planning worker (pid {w.process.pid}) died with exit code {w.process.exitcode}")


def _start_worker() -> _Worker:
    """Spawned with SIGINT blocked, a mask the child keeps: the terminal's Ctrl-C reaches every process of the
    group, and only the parent acts on it (a signal arriving meanwhile is acted on once the child is started).
    The resource tracker, which spawn starts on first use, is started first: starting, it unblocks SIGINT."""
    resource_tracker.ensure_running()
    ctx = get_context("spawn")
    task_read, task_write = ctx.Pipe(duplex=False)
    result_read, result_write = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_worker_main, args=(task_read, result_write, os.getpid()),
                          name="hydraplan-planner", daemon=True)
    with _sigint_held():
        process.start()
    task_read.close()
    result_write.close()
    return _Worker(process, task_write, result_read)


@contextmanager
def _sigint_held() -> Iterator[None]:
    """SIGINT blocked in this thread (a child started now inherits the mask) and, in the main thread, its Python
    handler held back until the block ends: another thread (a progress line's) may take the signal, and the
    handler raising inside `process.start()` would leave a child half started, with a traceback."""
    main = threading.current_thread() is threading.main_thread()
    caught: list[Any] = []
    previous = signal.signal(signal.SIGINT, lambda _, frame: caught.append(frame)) if main else None
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if main:
            signal.signal(signal.SIGINT, previous)
            if caught and callable(previous):
                previous(signal.SIGINT, caught[0])


def _worker_main(tasks: Connection, results: Connection, parent: int) -> None:
    """Receive the solver, then plan each batch received, in order. A thread keeps receiving while the main
    thread plans and sends, so parent and worker never both wait to write to each other."""
    _die_with(parent)
    for module in ("hydraplan.solve.dispatch", "hydraplan.solve.packing", "hydraplan.solve.ffd"):
        importlib.import_module(module)  # while the parent prepares; the first solver_s is then not import time
    try:
        solver: Solver = tasks.recv()
    except (EOFError, OSError):  # closed before planning anything
        return
    plan_heap()
    inbox: queue.SimpleQueue[tuple[int, Any] | None] = queue.SimpleQueue()

    def receive() -> None:
        try:
            while True:
                inbox.put(tasks.recv())
        except (EOFError, OSError):
            inbox.put(None)

    threading.Thread(target=receive, name="hydraplan-inbox", daemon=True).start()
    while (task := inbox.get()) is not None:
        k, batch = task
        try:
            reply = (k, True, solver.solve(batch))
        except Exception as e:  # noqa: BLE001 - sent to the parent, which raises it
            reply = (k, False, (e, traceback.format_exc()))
        finally:
            del task, batch
            settle_heap()
        try:
            results.send(reply)
        except Exception:  # noqa: BLE001 - the exception itself does not pickle
            results.send((k, False, (WorkerError(traceback.format_exc()), "")))
        del reply


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
