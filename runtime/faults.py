"""Failures in one line: an error inside training names the rank, host, iteration and plan file, and the whole
job goes down within seconds, not at the collective timeout.

A rank that fails counts itself in the job's TCP store; the first to do so (an atomic add, so ranks that fail
at the same moment, as on a bad batch every rank reads, elect one) prints one line, sets a key in the store
and exits with status 1, the others exit with status 1 without a word. Every rank polls that key on a daemon
thread (`Watchdog`) and exits quietly when it appears, so a rank blocked in an NCCL collective that will never
complete leaves too. A rank whose own collective fails because a peer is gone (gloo: "Connection closed by
peer") fails after that peer counted itself, so it leaves quietly as well: the job prints the one line of the
rank that failed first. Under torchrun, the launcher also stops the other workers as soon as one exits with
an error (and prints its own summary).

Fault injection, to prove it (tests, drills on a new cluster): HYDRAPLAN_INJECT_FAULT=KIND@RANK:ITERATION
makes rank RANK (`*`: every rank at once) fail at the start of plan iteration ITERATION with KIND oom
(torch.OutOfMemoryError, as an allocation would), comm (torch.distributed.DistBackendError, as a broken NCCL
communicator would) or data (a bad-data error, as a token id beyond the vocabulary would).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from hydraplan.core.errors import UserError

ENV = "HYDRAPLAN_INJECT_FAULT"
KINDS = ("oom", "comm", "data")
POLL_S = 1.0  # how often every rank looks for another rank's failure
LINGER_S = 2.5  # how long a failing rank that hosts the store keeps it up, so the others read the key first
KEY = "hydraplan/run_plan/failed"
COUNT = "hydraplan/run_plan/failures"


class DataError(ValueError):
    """Training data the model cannot take (found while training, e.g. a token id beyond the vocabulary)."""


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int | None  # None: every rank
    iteration: int


def parse(text: str) -> Fault:
    """KIND@RANK:ITERATION (RANK `*`: every rank), or UserError naming the variable and value."""
    kind, _, rest = text.partition("@")
    rank, _, iteration = rest.partition(":")
    if kind not in KINDS or not (rank.isdigit() or rank == "*") or not iteration.isdigit():
        raise UserError(f"{ENV}: {text!r} is not KIND@RANK:ITERATION with KIND one of {', '.join(KINDS)} and RANK a "
                        "number or *")
    return Fault(kind, None if rank == "*" else int(rank), int(iteration))


def configured() -> Fault | None:
    text = os.environ.get(ENV, "").strip()
    return parse(text) if text else None


def inject(rank: int, iteration: int) -> None:
    """Raise the configured fault if it is this rank's at this iteration."""
    f = configured()
    if f is None or f.rank not in (None, rank) or f.iteration != iteration:
        return
    why = f"injected by {ENV}={f.kind}@{'*' if f.rank is None else f.rank}:{f.iteration}"
    if f.kind == "oom":
        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB ({why})")
    if f.kind == "comm":
        raise dist.DistBackendError(f"NCCL communicator was aborted on rank {rank} ({why})")
    raise DataError(f"token id 4294967295 is beyond the model's vocabulary ({why})")


def classify(e: BaseException) -> str:
    """What kind of failure an exception is, in the words of the one-line message."""
    if isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower():
        return "out of memory"
    if isinstance(e, (dist.DistError, TimeoutError)) or any(w in str(e) for w in ("NCCL", "Connection closed",
                                                                                   "Gloo", "gloo", "timed out")):
        return "communication error"
    if isinstance(e, (DataError, UserError, IndexError)):
        return "bad data"
    return type(e).__name__


def describe(e: BaseException, rank: int, iteration: int | None, source: str | None, program: str = "run_plan") -> str:
    """The one line: rank, host, iteration, plan file, kind and the error's first line."""
    where = "outside the iterations" if iteration is None else f"iteration {iteration} ({source})"
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return f"{program}: rank {rank} on {socket.gethostname()}, {where}: {classify(e)}: {first}"


class Watchdog:
    """Every rank's view of the job's failures through the TCP store the job was started with (MASTER_ADDR,
    MASTER_PORT; a second client connection, so it never races the process group's own use of the store).
    Without one (a single process), `fail` just prints and exits."""

    def __init__(self, rank: int, program: str = "run_plan") -> None:
        self.rank, self.program = rank, program
        self.store: dist.Store | None = None
        self._stop = threading.Event()
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "MASTER_ADDR" in os.environ:
            self.store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                       timeout=timedelta(seconds=30), wait_for_workers=False)
            threading.Thread(target=self._watch, name="hydraplan-watchdog", daemon=True).start()

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                failed = self.store.check([KEY])
            except Exception:  # the store is gone: the rank or launcher hosting it died without a word
                if not self._stop.is_set():
                    print(f"{self.program}: rank {self.rank} on {socket.gethostname()}: lost the job's store (the rank or "
                          "launcher hosting it is gone)", file=sys.stderr, flush=True)
                    _exit(1)
                return
            if failed and not self._stop.is_set():
                self._leave()

    def stop(self) -> None:
        """Training is over on this rank: stop watching (the rank hosting the store may leave first)."""
        self._stop.set()

    def first(self) -> bool:
        """Whether this rank is the first of the job to fail (it prints the job's one line); always, alone."""
        if self.store is None:
            return True
        try:
            return self.store.add(COUNT, 1) == 1
        except Exception:
            return False  # the store is gone: the rank or launcher hosting it failed first

    def handle(self, e: BaseException, iteration: int | None, source: str | None) -> None:
        """An error reached the top of training on this rank: `fail` with its one line."""
        self.fail(describe(e, self.rank, iteration, source, self.program))

    def fail(self, line: str, code: int = 1) -> None:
        """This rank cannot go on: if another rank failed first (or at the same moment and counted first), leave
        quietly; else print `line` and, in a job of several ranks, tell every rank and leave with `code` (a single
        process returns, and its caller exits)."""
        if not self.first():
            self._leave(code)
        print(line, file=sys.stderr, flush=True)
        if self.store is None:
            return
        try:
            self.store.set(KEY, line)
        except Exception:
            pass
        self._leave(code)

    def _leave(self, code: int = 1) -> NoReturn:
        """Exit with status `code`; the rank hosting the store (rank 0, unless torchrun's agent hosts it) first keeps
        it up a moment, so the ranks still polling read the failure instead of a broken connection."""
        if self.store is not None and self.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            time.sleep(LINGER_S)
        _exit(code)


def _exit(code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
