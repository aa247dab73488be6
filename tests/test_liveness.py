"""Heartbeats (runtime/liveness.py): a watched rank that stops beating is named with its host and last finished
iteration; and a 2-node job on this machine (two torchrun agents, c10d rendezvous, 2 gloo ranks each) whose
second node freezes (SIGSTOP: no connection closes) or dies (SIGKILL) ends on the first node in one line."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from helpers import cpu_env, free_port, make_plan

from hydraplan.runtime.liveness import Heartbeat
from hydraplan.store.fileio import write_model

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "runtime" / "run_plan.py"


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_watched_rank_that_stops_beating_is_named_after_the_window():
    store, clock = dist.HashStore(), Clock()
    watcher = Heartbeat(0, 3, 600.0, store=store, clock=clock)  # beats every 100 s: the test drives it
    watched = Heartbeat(1, 3, 600.0, store=store, clock=clock)
    try:
        watched.finished(7)
        for _ in range(3):  # beating: never lost, however long
            watched.beat()
            assert watcher.check() is None
            clock.t += 599.0
        assert watcher.check() is None  # 599 s since the last beat was seen
        clock.t += 1.0
        line = watcher.check()  # 600 s
        assert line is not None
        assert re.fullmatch(rf"run_plan: rank 1 on {re.escape(socket.gethostname())} is lost: no heartbeat for "
                            r"\d+s \(--liveness-s 600\); the last iteration it finished: 7", line)
        watched.stop()  # a rank that is done is not lost
        clock.t += 5000.0
        assert watcher.check() is None
    finally:
        watcher.stop()


# --------------------------------------------------------------------------------------- two nodes
def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _rank_of(pid: int) -> int:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(e for e in env if e.startswith(b"RANK=")).split(b"=", 1)[1])


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _two_nodes(tmp_path: Path, stop: signal.Signals) -> tuple[float, str, set[int]]:
    """Start node A, then node B (so A's agent hosts the rendezvous store); once training runs, send `stop` to
    B's agent and ranks; returns (seconds until A's ranks were all gone, A's stderr, B's ranks)."""
    for i in range(1000):  # far more than run by the time B stops (the run must still be training then)
        write_model(tmp_path / "run" / f"iter_{i:06d}.json",
                    make_plan(i, "S", [(2, 1, [0, 2], [[8, 8]]), (2, 1, [1, 3], [[8, 8]])], first_id=10 * i))
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "liveness",
           str(SCRIPT), str(tmp_path / "run"), "--liveness-s", "5", "--timeout-s", "300"]
    nodes = []
    for name in "AB":
        out, err = (open(tmp_path / f"{name}.{k}", "w") for k in ("out", "err"))
        nodes.append(subprocess.Popen(cmd, stdout=out, stderr=err, env=cpu_env(), start_new_session=True))
        time.sleep(2.0)
    a, b = nodes
    b_ranks: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while not re.search(r"^iteration 3 ", (tmp_path / "A.out").read_text() + (tmp_path / "B.out").read_text(), re.M):
            assert time.monotonic() < deadline and a.poll() is None and b.poll() is None, (tmp_path / "A.err").read_text()
            time.sleep(0.2)
        time.sleep(2.0)  # over two heartbeats (0.83 s apart) more: B's last beat names an iteration it finished
        a_ranks, b_ranks = _children(a.pid), _children(b.pid)
        assert len(a_ranks) == len(b_ranks) == 2
        lost = {_rank_of(p) for p in b_ranks}
        os.killpg(b.pid, stop)
        for pid in b_ranks:  # torchrun starts its workers in sessions of their own
            os.kill(pid, stop)
        t0 = time.monotonic()
        while any(_alive(p) for p in a_ranks) and time.monotonic() - t0 < 90:
            time.sleep(0.2)
        return time.monotonic() - t0, (tmp_path / "A.err").read_text(), lost
    finally:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            for pid in b_ranks:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            for p in nodes:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
        for p in nodes:
            p.wait()


@pytest.mark.slow
def test_a_frozen_node_is_named_and_the_other_node_leaves(tmp_path):
    gone_s, err, lost = _two_nodes(tmp_path, signal.SIGSTOP)
    lines = [x for x in err.splitlines() if x.startswith("run_plan: ")]
    assert gone_s < 45, err
    assert len(lines) == 1, err
    m = re.fullmatch(r"run_plan: rank (\d+) on \S+ is lost: no heartbeat for \d+s \(--liveness-s 5\); "
                     r"the last iteration it finished: \d+", lines[0])
    assert m and int(m[1]) in lost, lines[0]


@pytest.mark.slow
def test_a_killed_node_ends_the_other_node_in_one_line(tmp_path):
    gone_s, err, _ = _two_nodes(tmp_path, signal.SIGKILL)
    assert gone_s < 45, err
    assert len([x for x in err.splitlines() if x.startswith("run_plan: ")]) == 1, err
