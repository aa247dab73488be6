"""Shared by the tests: a tiny profile with the paper's trade-offs, an interrupted pack run, and gloo
process groups for multi-process runtime tests."""

import glob
import re
import socket
import subprocess
from datetime import timedelta
from pathlib import Path

import numpy as np

from hydraplan.core import hardware
from hydraplan.schema import (
    GPUInfo,
    ModelInfo,
    Plan,
    Profile,
    Scheme,
    Strategies,
    TimeCoeffs,
)
from hydraplan.store.fileio import model_json, write_model
from hydraplan.store.paths import ROOT


def doc_pages() -> list[str]:
    """Every Markdown page the docs tests keep true: README.md first, then docs/*.md."""
    return ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


def tiny_profile() -> Profile:
    """<2,1,1> holds longer sequences, <1,1,1> is cheaper per token on short ones; <1,2,1> adds a bubble."""
    return Profile(
        name="tiny", gpu=GPUInfo(name="g", memory_gib=80, gpus_per_node=4),
        model=ModelInfo(name="m", layers=2, hidden=8),
        schemes=[
            Scheme(tp=1, pp=1, cp=1, max_len=2048, util_len=256, time=TimeCoeffs(a=2e-9, b=1e-4, c=0.01)),
            Scheme(tp=2, pp=1, cp=1, max_len=4096, util_len=512, time=TimeCoeffs(a=1.1e-9, b=5.5e-5, c=0.01)),
            Scheme(tp=1, pp=2, cp=1, max_len=4096, util_len=256, time=TimeCoeffs(a=1e-9, b=5e-5, c=0.01)),
        ],
    )


class Interrupt(Exception):
    pass


class StopAfter:
    """A pack progress callback that interrupts the run after `n` planned iterations."""

    def __init__(self, n: int) -> None:
        self.n = n

    def start(self, done: int, total: int) -> None:
        pass

    def advance(self, it: object) -> None:
        self.n -= 1
        if self.n == 0:
            raise Interrupt


def write_run_inputs(tmp_path: Path, lengths: np.ndarray, strategies: Strategies) -> tuple[Path, Path, Path]:
    """The files of a pack run on tiny_profile: (profile JSON, lengths .txt, strategies JSON)."""
    data = tmp_path / "lengths.txt"
    data.write_text("\n".join(map(str, lengths)) + "\n")
    profile = tmp_path / "tiny.json"
    profile.write_text(model_json(tiny_profile()))
    strat = tmp_path / "strategies.json"
    write_model(strat, strategies)
    return profile, data, strat


def cpu_env(**extra: str) -> dict[str, str]:
    """The environment of a runtime launched by a test: GPUs hidden (the tests assert CPU behaviour: gloo, heap
    memory), one thread per rank."""
    import os

    return dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", **extra)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_gloo(rank: int, world: int, port: int) -> None:
    """Join a `world`-process gloo job (mp.spawn workers); a stuck peer fails it within a minute."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))


def make_plan(iteration: int, strategy: str, pipelines: list[tuple[int, int, list[int], list[list[int]]]],
              gpus: int = 4, first_id: int = 0, cp: int = 1) -> Plan:
    """pipelines: (tp, pp, ranks, micro-batches as lists of sequence lengths); ids are numbered from first_id."""
    from hydraplan.runtime.plan_roles import build_plan

    return build_plan(iteration, strategy, gpus, [(tp, pp, cp, ranks, mbs) for tp, pp, ranks, mbs in pipelines], first_id)


def overlap_plans(world: int = 4) -> list[Plan]:
    """Data parallel, TP, PP and back, on 4 (or 2) ranks: every rank computes and every rank's layers change owner."""
    if world == 2:
        return [
            make_plan(0, "A", [(1, 1, [r], [[48, 32], [64]]) for r in range(2)], gpus=2),
            make_plan(1, "B", [(2, 1, [0, 1], [[96, 64], [80, 48]])], gpus=2, first_id=100),
            make_plan(2, "C", [(1, 2, [0, 1], [[64, 32], [48, 48], [50]])], gpus=2, first_id=200),
            make_plan(3, "D", [(1, 1, [r], [[40, 40], [64]]) for r in range(2)], gpus=2, first_id=300),
        ]
    return [
        make_plan(0, "A", [(1, 1, [r], [[24, 16], [32]]) for r in range(4)]),
        make_plan(1, "B", [(2, 1, [0, 1], [[48, 32], [40, 24]]), (2, 1, [2, 3], [[50, 30], [38, 28]])], first_id=100),
        make_plan(2, "C", [(1, 2, [0, 1], [[32, 16], [24, 24], [25]]), (1, 2, [2, 3], [[30, 15], [25, 22], [28]])],
                  first_id=200),
        make_plan(3, "D", [(1, 1, [r], [[20, 20], [32]]) for r in range(4)], first_id=300),
    ]


MEMORY_LINE = re.compile(r"^memory: iteration (\d+) rank (\d+) pipeline \d+ <(\d),(\d),1(?:,(\w+))?> stage (\d) largest "
                         r"micro-batch (\d+) tokens: peak ([\d.]+) MiB, model ([\d.]+) MiB, measured/model ([\d.]+)$", re.M)
"""A line of `run_plan --memory`: iteration, rank, tp, pp, recomputation mode ('' for none), stage, tokens, peak
MiB, model MiB, measured/model."""


def memory_plans(layouts: int | None = None, repeats: int = 2, mode: str = "none", fraction: float = 1.0,
                 warm: float = 1.0) -> list[Plan]:
    """Micro-batches at `fraction` of cpu-tiny's MaxLen in recomputation `mode` on every rank of 4, for each of its
    schemes: a <2,1,1> pipeline with one next to a <1,2,1> with two (its first stage stashes both), four <1,1,1>,
    one <4,1,1>, <2,2,1> with two and <1,4,1> with four, every pipeline recomputing in `mode`; each plan `repeats`
    times in a row, all but the last warming the allocator up with micro-batches `warm` times as long (what stays
    allocated across steps, the optimizer state and LNK's buffers, is made by any step of the same layout)."""
    from hydraplan.store.profiles import load_profile

    def layouts_at(f: float) -> list[tuple[str, list]]:
        ml = {s.key[:2]: int(s.max_len * f) for s in load_profile("cpu-tiny").schemes if s.recompute == mode}
        a, b, c = ml[(2, 1)], ml[(1, 2)], ml[(1, 1)]
        return [("TPxPP", [(2, 1, [0, 1], [[a]]), (1, 2, [2, 3], [[b], [b]])]),
                ("DP", [(1, 1, [k], [[c]]) for k in range(4)]),
                ("TP4", [(4, 1, [0, 1, 2, 3], [[ml[(4, 1)]]])]),
                ("TP2xPP2", [(2, 2, [0, 1, 2, 3], [[ml[(2, 2)]]] * 2)]),
                ("PP4", [(1, 4, [0, 1, 2, 3], [[ml[(1, 4)]]] * 4)])][:layouts]

    plans = []
    for (name, pipes), (_, warm_pipes) in zip(layouts_at(fraction), layouts_at(fraction * warm), strict=True):
        for k in range(repeats):
            it = len(plans)
            plan = make_plan(it, name, pipes if k == repeats - 1 else warm_pipes, first_id=100 * it)
            for p in plan.pipelines:
                p.recompute = mode
            plans.append(plan)
    return plans


# Hydraulis' fitted A800 LLaMA-2 7B coefficients (a, b, c in ms per micro-batch per stage) and MaxLen (tokens, no
# recomputation): tests/test_costmodel.py keeps the analytic profile within 2x of the coefficients and 20% of MaxLen,
# bench/bench_analytic.py reports the ratios.
HYDRAULIS_TIME = {(2, 1, 1): (2.054e-6, 0.09671, 65.18), (8, 1, 1): (5.07e-7, 0.03662, 44.32)}
HYDRAULIS_MAX_LEN = {(tp, 1, 1): n for tp, n in hardware.HYDRAULIS_MAX_LEN[("a800", "llama2-7b")].items()}


def hp(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`hydraplan ARGS` run in this process: the console script's entry point (hydraplan.app.cli:main, with its
    one-line errors and exit codes), stdout and stderr captured, without an interpreter start-up per command.
    `env`: variables set for the command only. The signal handlers and warning hook main() installs are put back."""
    import contextlib
    import io
    import os
    import signal
    import sys
    import warnings

    from hydraplan.app.cli import main

    argv = ["hydraplan", *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    showwarning, saved_argv, saved_env = warnings.showwarning, sys.argv, dict(os.environ)
    code: int | str | None = 0
    try:
        sys.argv = argv
        os.environ.update(env or {})
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        warnings.showwarning = showwarning
        for s, h in handlers.items():
            signal.signal(s, h)
    return subprocess.CompletedProcess(argv, code if isinstance(code, int) else (0 if code is None else 1),
                                       out.getvalue(), err.getvalue())


def children(pid: int) -> set[int]:
    """Every descendant of pid (workers, the resource tracker)."""
    out: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in glob.glob(f"/proc/{p}/task/*/children"):
            try:
                kids = {int(k) for k in Path(task).read_text().split()}
            except OSError:
                continue
            todo += list(kids - out)
            out |= kids
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def partitions(items):
    """Every set partition of `items` (Bell(7) = 877 for seven)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for p in partitions(rest):
        for k in range(len(p)):
            yield p[:k] + [[first] + p[k]] + p[k + 1:]
        yield [[first]] + p
