"""The runtime's peak memory against the profile's memory model (docs/gpus.md#memory), measured: `run_plan
--memory` on 4 gloo ranks replays micro-batches at cpu-tiny's MaxLen on every scheme it has
(tests/helpers.memory_plans, the plans tests/test_run_plan.py checks within 10%), each plan twice; the second
run of each plan is kept. Per rank: peak heap bytes of the step (glibc's statistics sampled after every torch
operation, plus the master shard and AdamW state) next to the model for its scheme, stage and micro-batch.
Writes bench/results/memory.json: every rank's row, and per scheme and stage the rank furthest above its model.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.run import Run
from hydraplan.store.fileio import write_model
from hydraplan.store.paths import ROOT
from hydraplan.store.profiles import load_profile
from tests.helpers import MEMORY_LINE, free_port, memory_plans

WORLD = 4


def measure(layouts: int | None) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        for p in memory_plans(layouts):
            write_model(Path(tmp) / f"iter_{p.iteration:06d}.json", p)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--master-port",
               str(free_port()), str(ROOT / "runtime" / "run_plan.py"), tmp, "--memory", "--timeout-s", "120"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                             env=dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""))
    if res.returncode != 0:
        raise RuntimeError(res.stdout + res.stderr)
    return [{"iteration": int(it), "rank": int(rank), "scheme": f"<{tp},{pp},1>", "stage": int(stage),
             "tokens": int(tokens), "peak_mib": float(peak), "model_mib": float(model), "ratio": float(ratio)}
            for it, rank, tp, pp, stage, tokens, peak, model, ratio in MEMORY_LINE.findall(res.stdout)
            if int(it) % 2 == 1]  # the second run of each plan


def main(run: Run) -> None:
    rows = measure(run.pick(None, 1))
    worst: dict[tuple[str, int], dict] = {}
    for r in rows:
        key = (r["scheme"], r["stage"])
        if key not in worst or r["ratio"] > worst[key]["ratio"]:
            worst[key] = r
    capacity_mib = load_profile("cpu-tiny").gpu.memory_gib * 1024  # the stand-in for GPU memory
    ratios = [r["ratio"] for r in rows]
    run.write({"profile": "cpu-tiny", "ranks": WORLD, "dtype": "fp32", "capacity_mib": capacity_mib,
               "ratio_range": [min(ratios), max(ratios)],
               "peak_over_capacity_max": max(r["peak_mib"] for r in rows) / capacity_mib - 1,
               "per_scheme_stage": [{"id": f"{s}_{st}", **worst[(s, st)]} for s, st in worst], "rows": rows})
    print(f"{'scheme':8s} {'stage':>5s} {'tokens':>6s} {'peak MiB':>9s} {'model MiB':>9s} {'ratio':>6s}")
    for r in worst.values():
        print(f"{r['scheme']:8s} {r['stage']:5d} {r['tokens']:6d} {r['peak_mib']:9.2f} {r['model_mib']:9.2f} {r['ratio']:6.3f}")
