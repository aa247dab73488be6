"""The runtime's peak memory against the profile's memory model (docs/gpus.md#memory), measured: `run_plan
--memory` on 4 gloo ranks replays micro-batches at cpu-tiny's MaxLen on every scheme it has, in each activation
recomputation mode (tests/helpers.memory_plans; tests/test_run_plan.py checks them within 10% at half of MaxLen),
each plan twice; the second run of each plan is kept. Per rank: peak heap bytes of the step (glibc's statistics
sampled after every torch operation, plus the master shard and AdamW state) next to the model for its scheme,
stage and micro-batch. Writes bench/results/memory.json: every rank's row, and per mode, scheme and stage the rank
furthest from its model."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench import run as bench_run
from bench.run import Run
from hydraplan.store.fileio import write_model
from hydraplan.store.profiles import load_profile
from tests.helpers import MEMORY_LINE, memory_plans

WORLD = 4


MODES = ("none", "selective", "full")


def measure(layouts: int | None, mode: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        for p in memory_plans(layouts, mode=mode):
            write_model(Path(tmp) / f"iter_{p.iteration:06d}.json", p)
        res = bench_run.torchrun(WORLD, [tmp, "--memory", "--timeout-s", "120"], timeout=1800)
    if res.returncode != 0:
        raise RuntimeError(res.stdout + res.stderr)
    return [{"iteration": int(it), "rank": int(rank), "mode": mode, "scheme": f"<{tp},{pp},1>", "stage": int(stage),
             "tokens": int(tokens), "peak_mib": float(peak), "model_mib": float(model), "ratio": float(ratio)}
            for it, rank, tp, pp, _, stage, tokens, peak, model, ratio in MEMORY_LINE.findall(res.stdout)
            if int(it) % 2 == 1]  # the second run of each plan


def main(run: Run) -> None:
    rows = [r for mode in run.pick(MODES, MODES[:1]) for r in measure(run.pick(None, 1), mode)]  # smoke: 5K tokens, not 15K
    worst: dict[tuple[str, str, int], dict] = {}
    for r in rows:
        key = (r["mode"], r["scheme"], r["stage"])
        if key not in worst or abs(r["ratio"] - 1) > abs(worst[key]["ratio"] - 1):
            worst[key] = r
    capacity_mib = load_profile("cpu-tiny").gpu.memory_gib * 1024  # the stand-in for GPU memory
    ratios = [r["ratio"] for r in rows]
    run.write({"profile": "cpu-tiny", "ranks": WORLD, "dtype": "fp32", "capacity_mib": capacity_mib,
               "ratio_range": [min(ratios), max(ratios)],
               "peak_over_capacity_max": max(r["peak_mib"] for r in rows) / capacity_mib - 1,
               "per_scheme_stage": [{"id": f"{m}_{s}_{st}", **worst[(m, s, st)]} for m, s, st in worst], "rows": rows})
    print(f"{'mode':9s} {'scheme':8s} {'stage':>5s} {'tokens':>6s} {'peak MiB':>9s} {'model MiB':>9s} {'ratio':>6s}")
    for r in worst.values():
        print(f"{r['mode']:9s} {r['scheme']:8s} {r['stage']:5d} {r['tokens']:6d} {r['peak_mib']:9.2f} {r['model_mib']:9.2f} "
              f"{r['ratio']:6.3f}")
