"""Long contexts (issue 24): sequence parallelism, activation recomputation and CP across nodes in the plans.

1. `pack --profile h100-llama2-13b --dataset builtin:prolong --gpus 32 --context-len 131072` (1M tokens per
   iteration): the schemes its plans use and their estimate against the static Megatron baseline, and `compare`
   on the same configuration, every method with every scheme of the profile (recomputing ones too).
2. `pack --profile h100-llama2-7b --dataset builtin:wikipedia --gpus 1024 --context-len 2097152` (8M tokens per
   iteration) and its `compare` against Megatron (with the CP it needs), WLB-LLM without queues and FlexSP.
Figures are the canonical cost model's, end to end (propagation plus the exposed LNK pull/push). Iteration
counts are small (4 at 32 GPUs, 2 at 1024) so the whole run finishes on a 2-core machine. MaxLen against
Hydraulis is bench_analytic's, the runtime's memory per recomputation mode bench_memory's.
Writes bench/results/long.json.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from bench.run import Run
from hydraplan.app.config import PackConfig
from hydraplan.app.pack import run_pack
from hydraplan.methods.compare import CompareConfig, run_compare
from hydraplan.schema import Summary
from hydraplan.store.fileio import load_model
from hydraplan.store.planfile import read_plan
from hydraplan.store.runfolder import plan_files

LONG_13B = {"profile": "h100-llama2-13b", "dataset": "builtin:prolong", "gpus": 32, "context_len": 131072,
            "tokens_per_iter": 1 << 20, "iterations": 4}
MILLION = {"profile": "h100-llama2-7b", "dataset": "builtin:wikipedia", "gpus": 1024, "context_len": 1 << 21,
           "tokens_per_iter": 1 << 23, "iterations": 2}
MILLION_METHODS = ("megatron", "wlb-nodelay", "flexsp", "hydraplan")
SMOKE = {"long_13b": {**LONG_13B, "gpus": 16, "context_len": 32768, "tokens_per_iter": 1 << 17, "iterations": 1},
         "million": {**MILLION, "gpus": 64, "context_len": 1 << 16, "tokens_per_iter": 1 << 18, "iterations": 1}}
# smoke: million at 64K context still plans its longest sequences on CP schemes, the proposal's length cells (one
# per LENGTH_STEP up to the context) a quarter as many as at 256K


def pack_run(cfg: dict) -> dict:
    """Plan the configuration with `pack`; the schemes of every plan and the estimates against the baseline."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run_pack(PackConfig(out=Path(tmp), seed=0, workers=1, **cfg))
        wall = time.perf_counter() - t0
        summary = load_model(Summary, Path(tmp) / "summary.json")
        plans = [read_plan(f) for f in plan_files(Path(tmp))]
    return {
        "wall_s": wall,
        "mean_iteration_s": summary.mean_iteration_s,
        "baseline": summary.baseline,
        "mean_baseline_iteration_s": summary.mean_baseline_iteration_s,
        "speedup_vs_baseline": summary.mean_baseline_iteration_s / summary.mean_iteration_s,
        "plans": [{"id": f"iteration_{p.iteration}", "iteration": p.iteration, "longest": max(s.length for s in p.batch),
                   "pipelines": dict(Counter(q.label for q in p.pipelines)), "iteration_s": p.estimate.iteration_s}
                  for p in plans],
    }


def compare_run(cfg: dict, methods: tuple[str, ...] | None = None) -> dict:
    t0 = time.perf_counter()
    outcome = run_compare(CompareConfig(seed=0, methods=methods, **cfg))
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "methods": [{"id": n, "method": n, "mean_iteration_s": r.mean_iteration_s,
                     "speedup_vs_megatron": r.end_to_end_speedup_vs_megatron,
                     "strategy": Counter(r.strategies).most_common(1)[0][0],
                     "pipelines": {s: r.strategy_labels.get(s, s) for s in dict.fromkeys(r.strategies)},
                     "mean_mfu": float(np.mean(r.mfu))} for n, r in outcome.result.methods.items()],
    }


def main(run: Run) -> None:
    out = {}
    for name, cfg, methods in (("long_13b", LONG_13B, None), ("million", MILLION, MILLION_METHODS)):
        cfg = run.pick(cfg, SMOKE[name])
        methods = run.pick(methods, ("megatron", "hydraplan"))
        out[name] = {"config": cfg, "pack": pack_run(cfg), "compare": compare_run(cfg, methods)}
        c = out[name]
        print(f"{name}: pack {c['pack']['mean_iteration_s']:.3f} s vs {c['pack']['baseline']} "
              f"{c['pack']['mean_baseline_iteration_s']:.3f} s ({c['pack']['speedup_vs_baseline']:.2f}x)", flush=True)
        for r in c["compare"]["methods"]:
            print(f"  {r['method']:16s} {r['mean_iteration_s']:8.3f} s  {r['speedup_vs_megatron']:.2f}x  {r['strategy']}")
    run.write(out)
