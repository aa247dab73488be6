"""What every bench shares: where its results go, the full or the smoke configuration, and the record of how
each results file was made (commit, command, date), so a figure can always be traced to the code behind it."""

from __future__ import annotations

import datetime
import json
import os
import resource
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from hydraplan.store.fileio import write_json
from hydraplan.store.paths import ROOT

RESULTS = ROOT / "bench" / "results"
CODE = ("planner", "runtime", "bench", "profiles", "data", "pyproject.toml")  # what a figure depends on
T = TypeVar("T")


def _git(*args: str) -> str | None:
    try:
        res = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def commit() -> str | None:
    """The checkout's commit (None outside a git checkout)."""
    return _git("rev-parse", "HEAD")


def dirty() -> bool | None:
    """Whether the code differs from the commit (results files themselves excluded)."""
    out = _git("status", "--porcelain", "--", *CODE, ":!bench/results")
    return None if out is None else bool(out)


def _clock() -> tuple[float, float]:
    """Wall seconds, and CPU seconds of this process and of the children it has waited for (torchrun, pools)."""
    cpu = sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
    return time.perf_counter(), cpu


@dataclass(frozen=True)
class Run:
    """One bench's run: `name` is its module's (bench_NAME.py), `argv` what follows the name on the command
    line, `smoke` selects the tiny configuration, `results` the folder its JSON goes to."""

    name: str
    argv: tuple[str, ...] = ()
    smoke: bool = False
    results: Path = RESULTS
    started: tuple[float, float] = field(default_factory=_clock, compare=False)
    # the file's record before this run: a partial run writes after every row, and each write keeps that one
    before: dict = field(default_factory=dict, compare=False)

    @property
    def path(self) -> Path:
        return self.results / f"{self.name}.json"

    def pick(self, full: T, smoke: T) -> T:
        """The full configuration's value, or the smoke one's."""
        return smoke if self.smoke else full

    def previous(self) -> dict:
        """What an earlier run wrote (for a bench that reruns only part of its file), {} if nothing."""
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def meta(self, merged: bool) -> dict:
        """How this file was made. When a partial run merged into an older file, the older record stays under
        `earlier`: those parts come from its commit. `wall_s` and `cpu_s`: what the run took until this write
        (CPU of all its processes: on a shared machine the wall time also counts the other jobs)."""
        (wall, cpu), (wall0, cpu0) = _clock(), self.started
        out = {"commit": commit(), "dirty": dirty(),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "command": " ".join(["python -m bench", *(["--smoke"] if self.smoke else []), self.name, *self.argv]),
               "smoke": self.smoke, "cores": os.cpu_count(), "wall_s": round(wall - wall0, 1),
               "cpu_s": round(cpu - cpu0, 1)}
        if merged and "meta" not in self.before:
            self.before["meta"] = self.previous().get("meta")
        old = self.before.get("meta") if merged else None
        if old:
            out["earlier"] = [{k: v for k, v in old.items() if k != "earlier"}, *old.get("earlier", [])]
        return out

    def write(self, data: dict, merged: bool = False) -> Path:
        """The results file, `meta` first; written atomically, so an interrupted bench leaves the last whole file."""
        write_json(self.path, {"meta": self.meta(merged), **{k: v for k, v in data.items() if k != "meta"}})
        return self.path


def torchrun(nproc: int, args: Sequence[str], timeout: float) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node NPROC runtime/run_plan.py ARGS` on this machine's CPU (one thread per rank, GPUs
    hidden), output captured: the runtime benches' launcher (tests/test_bench.py forks the smoke runs' ranks
    instead, tests/ranks.py: the smoke run checks the bench, the runtime tests check torchrun's launch)."""
    import sys

    from tests.helpers import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
           str(free_port()), str(ROOT / "runtime" / "run_plan.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""))


def names() -> list[str]:
    """Every bench, by the NAME of bench/bench_NAME.py."""
    return sorted(p.stem.removeprefix("bench_") for p in Path(__file__).parent.glob("bench_*.py"))


def run_bench(name: str, argv: Sequence[str] = (), smoke: bool = False, results: Path = RESULTS) -> Path:
    """Run one bench (its module's `main(run)`) and return the file it wrote."""
    import importlib

    name = name.removeprefix("bench_")
    if name not in names():
        raise SystemExit(f"no bench named {name!r}; benches: {', '.join(names())}")
    run = Run(name, tuple(argv), smoke, Path(results))
    importlib.import_module(f"bench.bench_{name}").main(run)
    return run.path
