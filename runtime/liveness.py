"""Heartbeats: a rank that stops (a frozen node, one dropped off the fabric) is named within --liveness-s.

A node that hangs sets no key in the store and closes no connection, so without a heartbeat the others wait
for the collective timeout (gloo's, or NCCL's 300 s watchdog). Every rank beats on a daemon thread through
its own client of the job's TCP store (MASTER_ADDR, MASTER_PORT): key KEY/<rank> holds a counter, its host
and the last plan iteration it finished, rewritten every `beat_s` (liveness_s / BEATS_PER_WINDOW). Each rank
watches the next one in a ring (rank r watches r+1 mod world: one read per beat, whatever the world size;
when some ranks stop and others do not, some running rank watches a stopped one). A watched rank whose
value has not changed for liveness_s is lost: the first rank to see a loss (an atomic add in the store
decides) prints one line naming the lost rank, its host and the last iteration it finished, records it
under the job's failure key (runtime/faults.py, so every other rank leaves without a word) and exits with
status 1; the others exit with status 1 silently. The count is the job's one failure count (faults.COUNT), so
a loss seen here and errors of training (a node killed breaks several ranks' collectives at once) elect one
line between them. A rank that finishes marks its key DONE
and is not watched any more. The rank hosting the store itself cannot be watched through it: if it stops, store
operations time out and the rank reports the store lost.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from hydraplan.runtime import faults

KEY = "hydraplan/heartbeat"
DONE = "done"
BEATS_PER_WINDOW = 6  # beats in one liveness window: a single late beat never looks like a loss
DEFAULT_S = 30.0


def store_client(timeout_s: float) -> dist.Store | None:
    """A client of the job's TCP store, None in a single process (nothing to watch)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or "MASTER_ADDR" not in os.environ:
        return None
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


class Heartbeat:
    """This rank's beat and its watch over the next rank (module docstring)."""

    def __init__(self, rank: int, world: int, liveness_s: float, program: str = "run_plan",
                 store: dist.Store | None = None, clock=time.monotonic):
        self.rank, self.world, self.liveness_s, self.program = rank, world, liveness_s, program
        self.beat_s = liveness_s / BEATS_PER_WINDOW  # liveness_s <= 0: no beats, no watch
        self.host = socket.gethostname()
        self.finished_iteration: int | None = None
        self.clock = clock
        self.store = None if liveness_s <= 0 else store if store is not None else store_client(max(liveness_s, 5.0))
        self._count = 0
        self._stop = threading.Event()
        self._watched = (rank + 1) % world
        self._seen: tuple[bytes | None, float] = (None, clock())
        if self.store is not None and world > 1:
            self.beat()
            threading.Thread(target=self._run, name="hydraplan-heartbeat", daemon=True).start()

    def finished(self, iteration: int) -> None:
        self.finished_iteration = iteration

    def beat(self) -> None:
        self._count += 1
        self.store.set(f"{KEY}/{self.rank}", f"{self._count} {self.host} {self.finished_iteration}")

    def stop(self) -> None:
        """This rank is done: no more beats, and its watcher stops watching it."""
        if not self._stop.is_set():
            self._stop.set()
            if self.store is not None and self.world > 1:
                try:
                    self.store.set(f"{KEY}/{self.rank}", DONE)
                except Exception:
                    pass

    def check(self) -> str | None:
        """The one line naming the watched rank if it has not beaten for liveness_s, else None."""
        key = f"{KEY}/{self._watched}"
        value = self.store.get(key) if self.store.check([key]) else None
        now = self.clock()
        if value == DONE.encode():
            return None
        if value != self._seen[0]:
            self._seen = (value, now)
            return None
        if now - self._seen[1] < self.liveness_s:
            return None
        count, host, iteration = (value.decode().split(" ") if value else ("0", "an unknown host", "None"))
        last = "none yet" if iteration == "None" else iteration
        return (f"{self.program}: rank {self._watched} on {host} is lost: no heartbeat for {now - self._seen[1]:.0f}s "
                f"(--liveness-s {self.liveness_s:g}); the last iteration it finished: {last}")

    def _run(self) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                self.beat()
                line = self.check()
            except Exception:  # the store's host is gone or stopped: faults.Watchdog reports that
                return
            if line is not None and not self._stop.is_set():
                self._report(line)

    def first_to_report(self) -> bool:
        """Whether this rank is the first of the job to report a failure (faults.COUNT, shared with the errors
        of training that faults.Watchdog reports)."""
        if self.store is None:
            return True
        try:
            return self.store.add(faults.COUNT, 1) == 1
        except Exception:
            return True

    def _report(self, line: str) -> None:
        """One line for the job: the first rank to see a loss prints it and records the failure."""
        if self.first_to_report():
            print(line, file=sys.stderr, flush=True)
            try:
                self.store.set(faults.KEY, line)
            except Exception:
                pass
        if self.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            time.sleep(faults.LINGER_S)  # this rank hosts the store: the others read the failure first
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
