"""Strategy proposal speed (issue 3: <= 0.5 s at 64 GPUs, <= 10 s at 1024 GPUs, 128-token length step)
on builtin:wikipedia with h100-llama2-7b at 32K context, with a per-phase breakdown measured in the same
run, and the model's expected time of the best heterogeneous candidate against the homogeneous fallback.
"""

from __future__ import annotations

import os
import time

from bench.run import Run
from hydraplan.core.cluster import Cluster, for_gpus
from hydraplan.solve.proposal import (
    TOKENS_PER_GPU,
    best_homogeneous,
    build_cells,
    propose,
    round_relaxed,
    solve_integer,
    solve_relaxed,
)
from hydraplan.store.datasets import load_dataset
from hydraplan.store.profiles import load_profile

PROFILE, DATASET, CONTEXT = "h100-llama2-7b", "builtin:wikipedia", 32768
SIZES = {64: 0.5, 1024: 10.0}  # GPUs: target seconds


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def cpu_timed(fn):
    """(wall s, CPU s of this process, result): other jobs sharing the 2 cores inflate wall time only."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def phases(profile, dataset, gpus: int) -> dict[str, float]:
    """The steps propose() runs, timed one by one (placement and file models are the remainder)."""
    view = for_gpus(profile, gpus)
    values, counts = dataset.histogram()
    t = {}
    t["cells"], cells = timed(lambda: build_cells(list(view.schemes), values, counts, CONTEXT, TOKENS_PER_GPU * gpus))
    t["relaxed DP (all L')"], relaxed = timed(lambda: solve_relaxed(cells, gpus))
    t["rounding (all L')"], rounded = timed(
        lambda: [round_relaxed(cells, relaxed, j, gpus) for j in range(cells.n_cells)])
    upper = min(best_homogeneous(cells, gpus)[2], rounded[-1].latency if rounded[-1] else float("inf"))
    t["integer DP Eq. (4) for L"], _ = timed(
        lambda: solve_integer(cells, gpus, lower=float(relaxed.latency[-1]), upper=upper, rel_tol=1e-3))
    t["schemes"], t["length cells"] = len(view.schemes), cells.n_cells
    return t


def main(run: Run) -> None:
    sizes, repeats = run.pick(SIZES, {16: SIZES[64]}), run.pick(3, 1)
    profile = load_profile(PROFILE)
    load_s, dataset = timed(lambda: load_dataset(DATASET, CONTEXT))
    out = {"profile": PROFILE, "dataset": DATASET, "context_len": CONTEXT, "dataset_load_s": round(load_s, 3),
           "load_average_1min": os.getloadavg()[0], "sizes": []}
    for gpus, target in sizes.items():
        runs = [cpu_timed(lambda: propose(Cluster.of(profile, gpus), dataset, CONTEXT)) for _ in range(repeats)]
        seconds = sorted(r[0] for r in runs)
        cpu = sorted(r[1] for r in runs)
        strategies = runs[0][2]
        cands = strategies.candidates
        homo = next(c for c in cands if "homogeneous" in c.sources)
        hetero = [c for c in cands if c.kind == "heterogeneous" and c.max_len >= CONTEXT]
        best = min(hetero, key=lambda c: c.expected_s_per_token)
        row = {"id": str(gpus), "gpus": gpus, "target_s": target, "propose_s_median": round(seconds[len(seconds) // 2], 3),
               "propose_s_min": round(seconds[0], 3), "propose_cpu_s_median": round(cpu[len(cpu) // 2], 3),
               "within_target": seconds[0] <= target or cpu[len(cpu) // 2] <= target,
               "candidates": len(cands), "proposed_before_cap": strategies.proposed,
               "heterogeneous": sum(c.kind == "heterogeneous" for c in cands),
               "best_full_length": f"{best.name} {', '.join(best.sources)}",
               "homogeneous_over_best_expected": round(homo.expected_s_per_token / best.expected_s_per_token, 3),
               "phases_s": {k: (round(v, 4) if isinstance(v, float) else v)
                            for k, v in phases(profile, dataset, gpus).items()}}
        out["sizes"].append(row)
    run.write(out)
    print(f"{PROFILE}, {DATASET}, context {CONTEXT} (dataset load {load_s:.2f} s, not included; "
          f"load average {out['load_average_1min']:.1f} on {os.cpu_count()} cores)")
    print(f"{'GPUs':>5} {'wall s':>7} {'CPU s':>6} {'target':>7} {'cands':>6} {'hetero':>6} {'homo/best':>9}  phases (wall s)")
    for r in out["sizes"]:
        ph = ", ".join(f"{k} {v}" for k, v in r["phases_s"].items())
        print(f"{r['gpus']:>5} {r['propose_s_median']:>7.3f} {r['propose_cpu_s_median']:>6.3f} {r['target_s']:>7.1f} "
              f"{r['candidates']:>6} {r['heterogeneous']:>6} {r['homogeneous_over_best_expected']:>9.3f}  {ph}")
