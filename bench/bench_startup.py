"""Start-up: `hydraplan propose` and `hydraplan pack` timed as whole processes, as a user meets them (issue 37:
propose at 64 GPUs <= 1.5 s, pack of 8 iterations at 64 GPUs <= 5 s), next to what importing the command costs,
and what importing the Megatron plugin costs a training process (issue 47: <= 0.3 s).

Each command runs `repeats` times; the best wall time is kept (the others count what else the machine ran) with
the CPU seconds of the process and its workers. The configuration is the README demo's: h100-llama2-7b,
builtin:wikipedia, 64 GPUs, context 32768, 200K tokens per iteration; pack with 2 workers. Run on a quiet
machine: on a shared one the wall times include the other jobs (compare `cpu_s`; `load_1min` records the load).
`python -m bench startup ROW...` measures only those rows (of ROWS) and keeps the others.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.run import Run

RUN = ["--profile", "h100-llama2-7b", "--dataset", "builtin:wikipedia", "--gpus", "64", "--context-len", "32768"]
HYDRAPLAN = str(Path(sys.executable).with_name("hydraplan"))


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall s, CPU s of the process and every process it waited for) of one whole run."""
    cpu0, t0 = children_cpu(), time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "HYDRAPLAN_PROGRESS_EVERY_S": "600"})
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {res.stderr.strip()}")
    return wall, cpu


def best(argv: list[str], repeats: int) -> dict:
    runs = [timed(argv) for _ in range(repeats)]
    wall, cpu = min(runs)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "runs": repeats}


def commands(tmp: str, iterations: int) -> dict[str, list[str]]:
    return {"import_cli": [sys.executable, "-c", "import hydraplan.app.cli"],
            "import_config": [sys.executable, "-c", "import hydraplan.app.config"],
            "import_megatron_plugin": [sys.executable, "-c", "import hydraplan.integrations.megatron"],
            "propose": [HYDRAPLAN, "propose", *RUN, "--tokens-per-iter", "200000", "--out", f"{tmp}/s.json"],
            "pack": [HYDRAPLAN, "pack", *RUN, "--tokens-per-iter", "200000", "--iterations", str(iterations),
                     "--workers", "2", "--out", f"{tmp}/run"]}


ROWS = tuple(commands("", 1))


def main(run: Run) -> None:
    repeats, iterations = run.pick(3, 1), run.pick(8, 1)
    unknown = [a for a in run.argv if a not in ROWS]
    if unknown:
        raise SystemExit(f"bench startup: no row {unknown}; rows: {', '.join(ROWS)}")
    partial = bool(run.argv) and not run.smoke
    load_before = os.getloadavg()[0]
    rows: dict[str, dict] = dict(run.previous().get("seconds", {})) if partial else {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, argv in commands(tmp, iterations).items():
            if not partial or name in run.argv:
                rows[name] = best(argv, repeats)
    run.write({"config": {"gpus": 64, "context_len": 32768, "tokens_per_iter": 200_000, "pack_iterations": iterations,
                          "workers": 2, "repeats": repeats},
               "targets_s": {"propose": 1.5, "pack": 5.0, "import_megatron_plugin": 0.3},
               "seconds": {name: rows[name] for name in ROWS if name in rows},
               # the 1-minute load average before and after (the whole run's: a partial run keeps it): above the 2
               # cores, wall times count other jobs
               "load_1min": (run.previous()["load_1min"] if partial else
                             [round(load_before, 1), round(os.getloadavg()[0], 1)])}, merged=partial)
