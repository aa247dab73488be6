"""Start-up: `hydraplan propose` and `hydraplan pack` timed as whole processes, as a user meets them (issue 37:
propose at 64 GPUs <= 1.5 s, pack of 8 iterations at 64 GPUs <= 5 s), next to what importing the command costs.

Each command runs `repeats` times; the best wall time is kept (the others count what else the machine ran) with
the CPU seconds of the process and its workers. The configuration is the README demo's: h100-llama2-7b,
builtin:wikipedia, 64 GPUs, context 32768, 200K tokens per iteration; pack with 2 workers. Run on a quiet
machine: on a shared one the wall times include the other jobs (compare `cpu_s`; `load_1min` records the load).
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


def main(run: Run) -> None:
    repeats, iterations = run.pick(3, 1), run.pick(8, 1)
    load_before = os.getloadavg()[0]
    rows: dict[str, dict] = {}
    rows["import_cli"] = best([sys.executable, "-c", "import hydraplan.app.cli"], repeats)
    rows["import_config"] = best([sys.executable, "-c", "import hydraplan.app.config"], repeats)
    with tempfile.TemporaryDirectory() as tmp:
        rows["propose"] = best([HYDRAPLAN, "propose", *RUN, "--tokens-per-iter", "200000",
                                "--out", f"{tmp}/s.json"], repeats)
        rows["pack"] = best([HYDRAPLAN, "pack", *RUN, "--tokens-per-iter", "200000", "--iterations", str(iterations),
                             "--workers", "2", "--out", f"{tmp}/run"], repeats)
    run.write({"config": {"gpus": 64, "context_len": 32768, "tokens_per_iter": 200_000, "pack_iterations": iterations,
                          "workers": 2, "repeats": repeats},
               "targets_s": {"propose": 1.5, "pack": 5.0}, "seconds": rows,
               # the 1-minute load average before and after: above the 2 cores, wall times count other jobs
               "load_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)]})
