"""LNK overlap in the runtime, measured (issue 12): the exposed sync of the same four plans (DP, TP, PP, DP)
with overlap on and with `--no-overlap`, model tiny-wide (8 layers of 655K parameters in fp64: ~42 MB per
rank per direction for a data-parallel rank), on 4 gloo ranks and on 2. Writes bench/results/overlap.json.

Exposed sync is the time compute waited on a pull or push exchange after every rank had posted it (replay
StepStats), summed over the four iterations. The machine is shared: other processes only add to a
measurement, so each mode is run REPEATS times, alternating, and its least sum is its figure (every run is
recorded). On CPU, moving the bytes is work for the same cores that compute (gloo copies through loopback
TCP): with 4 ranks on 2 cores there is no idle core to move them while every rank computes, with 2 ranks
there is one core per rank, as a GPU has its own copy engines and links. The tests check the order of
events that makes the overlap (tests/test_run_plan.py); this is what it buys on this CPU.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from bench import run as bench_run
from bench.run import Run
from hydraplan.store.fileio import write_model
from tests.helpers import overlap_plans

REPEATS = 3
TARGET_RATIO = 0.5  # exposed sync with overlap at most half of that without
STATS = re.compile(r"^iteration (\d+) .* time=([\d.]+)s .* sync exposed ([\d.]+)s, hidden ([\d.]+)s, "
                   r"peer wait ([\d.]+)s", re.M)


def run(folder: Path, world: int, *flags: str) -> dict[str, float]:
    res = bench_run.torchrun(world, [str(folder), "--model", "tiny-wide", "--dtype", "fp64", *flags], timeout=900)
    if res.returncode != 0:
        raise RuntimeError(res.stdout + res.stderr)
    rows = STATS.findall(res.stdout)
    assert len(rows) == 4, res.stdout
    return {"iteration_s": sum(float(r[1]) for r in rows), "exposed_s": sum(float(r[2]) for r in rows),
            "hidden_s": sum(float(r[3]) for r in rows), "peer_wait_s": sum(float(r[4]) for r in rows)}


def measure(world: int, repeats: int = REPEATS) -> dict:
    runs: dict[str, list[dict[str, float]]] = {"overlap": [], "no_overlap": []}
    with tempfile.TemporaryDirectory() as tmp:
        for p in overlap_plans(world):
            write_model(Path(tmp) / f"iter_{p.iteration:06d}.json", p)
        for _ in range(repeats):
            runs["overlap"].append(run(Path(tmp), world))
            runs["no_overlap"].append(run(Path(tmp), world, "--no-overlap"))
    on = min(r["exposed_s"] for r in runs["overlap"])
    off = min(r["exposed_s"] for r in runs["no_overlap"])
    return {"id": str(world), "ranks": world, "runs": runs, "exposed_overlap_s": on, "exposed_no_overlap_s": off,
            "ratio": on / off, "hidden_share": 1 - on / off, "target_met": on / off <= TARGET_RATIO,
            "iteration_overlap_s": min(r["iteration_s"] for r in runs["overlap"]),
            "iteration_no_overlap_s": min(r["iteration_s"] for r in runs["no_overlap"])}


def main(run: Run) -> None:
    repeats = run.pick(REPEATS, 1)
    rows = [measure(w, repeats) for w in run.pick((4, 2), (2,))]
    run.write({"model": "tiny-wide", "dtype": "fp64", "iterations": 4, "repeats": repeats, "cores": os.cpu_count(),
               "rows": rows, "target_ratio": TARGET_RATIO})
    print(f"least of {repeats} runs, summed over 4 iterations")
    print(f"{'ranks':>5s} {'exposed, overlap':>17s} {'exposed, off':>13s} {'ratio':>6s} {'iteration, overlap':>19s} "
          f"{'iteration, off':>15s}")
    for r in rows:
        print(f"{r['ranks']:5d} {r['exposed_overlap_s']:16.3f}s {r['exposed_no_overlap_s']:12.3f}s {r['ratio']:6.2f} "
              f"{r['iteration_overlap_s']:18.3f}s {r['iteration_no_overlap_s']:14.3f}s")
