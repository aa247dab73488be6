"""Multi-process runtime jobs for the tests at a fraction of torchrun's cost.

`torchrun ... run_plan.py` starts an agent and one fresh interpreter per rank, each importing torch (~2 CPU s, and
~1.3 more for torch._dynamo, which torch.optim loads with the first optimizer): most of a tiny test job's cost.
Here the ranks are forked from a multiprocessing forkserver that imported torch and the runtime once per test
process, and each runs the same `main(argv)` the script runs, in its own process, over gloo: the code under test
is unchanged, only its launch is cheaper. `launch` also plays the torchrun agent's part for one node (it hosts the
job's TCP store, gives every rank torchrun's environment, stops the others when one fails and reports 1);
`run_ranks` starts ranks on their own, as a job without torchrun, each with its own exit code and output. The
tests of the torchrun command itself (the docs' example, faults, two nodes) still start the real one.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from helpers import free_port

PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "hydraplan.runtime.run_plan", "hydraplan.runtime.profile",
           "hydraplan.runtime.doctor"]
RUN_PLAN = "hydraplan.runtime.run_plan"
_CONTEXT: multiprocessing.context.ForkServerContext | None = None


def _context() -> multiprocessing.context.ForkServerContext:
    """The forkserver, started with OMP_NUM_THREADS=1 (as torchrun sets it): OpenMP reads it when torch loads,
    which happens in the server, before any rank's own environment exists."""
    global _CONTEXT
    if _CONTEXT is None:
        from multiprocessing import forkserver

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            forkserver.ensure_running()
        finally:
            if saved is None:
                del os.environ["OMP_NUM_THREADS"]
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        _CONTEXT = ctx
    return _CONTEXT


def _rank(module: str, argv: list[str], env: dict[str, str], out: str, err: str) -> None:
    """One rank: its environment, stdout and stderr to files, then the module's main(argv) as the exit code."""
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    code = _load(module).main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def _load(module: str):
    """A module by name, or a script (examples/*.py) by its path, imported under its file's name."""
    if not module.endswith(".py"):
        return importlib.import_module(module)
    spec = importlib.util.spec_from_file_location(Path(module).stem, module)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


@dataclass
class RankResult:
    rank: int
    returncode: int
    stdout: str
    stderr: str
    ended: float  # time.monotonic() when its exit was seen


def run_ranks(nproc: int, argv: list[str], *, module: str = RUN_PLAN, env: dict[str, str] | None = None,
              timeout: float = 240, torchrun: bool = False, grace: float = 30) -> list[RankResult]:
    """`module`.main(argv) (a module's name or a script's path) on `nproc` ranks of one node, all at once.
    Without `torchrun` the ranks are a job of their own (RANK, WORLD_SIZE, MASTER_ADDR/PORT; rank 0 hosts the
    store) left to end by themselves; with it they get torchrun's environment, this process hosts the store as
    the agent does, and a failing rank stops the others (SIGTERM, SIGKILL after `grace` s). Past `timeout` every
    rank is killed and the test fails."""
    import pytest

    ctx = _context()
    port = free_port()
    base = dict(os.environ if env is None else env)
    base.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                WORLD_SIZE=str(nproc))
    store = None
    if torchrun:
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", port, world_size=nproc + 1, is_master=True, wait_for_workers=False)
        base.update(LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", GROUP_WORLD_SIZE="1", ROLE_NAME="default",
                    ROLE_WORLD_SIZE=str(nproc), TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RUN_ID="tests",
                    TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0")
    with tempfile.TemporaryDirectory(prefix="ranks_") as tmp:
        files = [(Path(tmp) / f"{r}.out", Path(tmp) / f"{r}.err") for r in range(nproc)]
        procs = []
        for r in range(nproc):
            rank_env = dict(base, RANK=str(r), LOCAL_RANK=str(r), ROLE_RANK=str(r))
            p = ctx.Process(target=_rank, args=(module, argv, rank_env, *map(str, files[r])), name=f"rank {r}")
            p.start()
            procs.append(p)
        ended: dict[int, float] = {}
        deadline, stop_at, timed_out = time.monotonic() + timeout, None, False
        while len(ended) < nproc:
            multiprocessing.connection.wait([p.sentinel for r, p in enumerate(procs) if r not in ended], timeout=0.05)
            now = time.monotonic()
            ended.update({r: now for r, p in enumerate(procs) if r not in ended and p.exitcode is not None})
            if torchrun and stop_at is None and any(procs[r].exitcode != 0 for r in ended):
                stop_at = now + grace
                for r, p in enumerate(procs):
                    if r not in ended:
                        p.terminate()
            if now > deadline or (stop_at is not None and now > stop_at):
                timed_out = now > deadline
                for r, p in enumerate(procs):
                    if r not in ended:
                        p.kill()
        for p in procs:
            p.join()
        results = [RankResult(r, p.exitcode, *(f.read_text() if f.exists() else "" for f in files[r]), ended[r])
                   for r, p in enumerate(procs)]
    del store
    if timed_out:
        pytest.fail(f"{module} {argv} on {nproc} ranks timed out after {timeout} s\n"
                    + "\n".join(r.stdout + r.stderr for r in results))
    return results


def launch(nproc: int, argv: list[str], *, module: str = RUN_PLAN, env: dict[str, str] | None = None,
           timeout: float = 240) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node NPROC module ARGV` as the tests see it: the ranks' stdout and stderr (rank after
    rank), returncode 0 when every rank returned 0, else 1 (torchrun's)."""
    results = run_ranks(nproc, argv, module=module, env=env, timeout=timeout, torchrun=True)
    code = 0 if all(r.returncode == 0 for r in results) else 1
    return subprocess.CompletedProcess([module, *argv], code, "".join(r.stdout for r in results),
                                       "".join(r.stderr for r in results))


def spawn(fn, args: tuple, nprocs: int) -> None:
    """torch.multiprocessing.spawn's contract (fn(rank, *args) on `nprocs` processes, joined, a rank's exception
    raised here) with the ranks forked from the preloaded server instead of fresh interpreters."""
    import torch.multiprocessing as mp

    _context()
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


def launch_runtime(module: str, args: list[str], ranks: int, device: str, timeout_s: float):
    """hydraplan.app.measure.launch_runtime (what `hydraplan profile` and `hydraplan doctor` run their runtime jobs
    with) with the ranks forked here: patched in by the tests whose subject is the job, not its launch (those of
    the launch itself, its failures and torchrun's output, keep the real one)."""
    from hydraplan.app.measure import Launch

    assert device == "cpu", "the tests run the runtime on CPU"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        argv = [*args, "--out", str(out)]
        if ranks > 1:
            res = launch(ranks, argv, module=module, timeout=timeout_s)
            code, err = res.returncode, res.stderr
        else:
            (one,) = run_ranks(1, argv, module=module, timeout=timeout_s)
            code, err = one.returncode, one.stderr
        return Launch(code, json.loads(out.read_text()) if out.exists() else None, err)
