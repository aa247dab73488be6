"""hydraplan inside Megatron-LM (issue 39): the hybrid-CP seam, Megatron's BalancedCPScheduler (`megatron-hcp`,
equal to the megatron-core 0.19.2 wheel's, tests/test_megatron_hcp.py) against hydraplan's (`hydraplan-hcp`,
hydraplan.integrations.megatron) on the same global batches (seed 3, 20 per configuration), every schedule scored
as Megatron's executor runs it (propagation: the canonical cost model's <tp,1,cp> schemes, a sequence starting when
its CP group is free, rounds adding up), h100-llama2-7b on 64 GPUs. At every TP in {1, 2, 4, 8},
--max-seqlen-per-dp-cp-rank is MaxLen of <tp,1,1>; a TP where a method's schedule puts a sequence on fewer ranks
than its memory needs (MaxLen of <tp,1,cp>) is one that method cannot run (its time ignoring memory is recorded
too: the issue's table took Megatron at TP 4 at 128K, where it runs out of memory on a few batches). Also: the
work lower bound of each TP (no schedule is faster), and the CPU milliseconds each scheduler spends per global
batch (one core; what every rank waits for). Writes bench/results/megatron.json.
"""

from __future__ import annotations

import numpy as np

from bench.run import Run
from hydraplan.core.executors import HybridCP, hybrid_cp_lower_bound
from hydraplan.methods.megatron_seams import best_run, hybrid_cp_runs
from hydraplan.store.datasets import load_dataset, sample_iterations
from hydraplan.store.profiles import load_profile

PROFILE, GPUS, SEED = "h100-llama2-7b", 64, 3
CONFIGS = [
    {"id": "wikipedia-32k", "dataset": "builtin:wikipedia", "context_len": 32768, "tokens_per_iter": 200_000},
    {"id": "prolong-32k", "dataset": "builtin:prolong", "context_len": 32768, "tokens_per_iter": 200_000},
    {"id": "wikipedia-128k", "dataset": "builtin:wikipedia", "context_len": 131072, "tokens_per_iter": 1_600_000},
    {"id": "prolong-128k", "dataset": "builtin:prolong", "context_len": 131072, "tokens_per_iter": 1_600_000},
]
SMOKE = [{"id": "wikipedia-32k", "dataset": "builtin:wikipedia", "context_len": 16384, "tokens_per_iter": 60_000}]


def hybrid_cp(cfg: dict, iterations: int) -> dict:
    profile = load_profile(PROFILE)
    batches = [b.lengths for b in sample_iterations(load_dataset(cfg["dataset"], cfg["context_len"]),
                                                    cfg["tokens_per_iter"], iterations, SEED)]
    runs = hybrid_cp_runs(profile, batches, GPUS)
    tps = []
    for tp in sorted({r.tp for r in runs}):
        row = {"id": f"tp{tp}", "tp": tp}
        for r in (r for r in runs if r.tp == tp):
            row["max_seqlen_per_dp_cp_rank"] = r.max_seqlen_per_rank
            row[r.method] = {"mean_s": r.mean_s if r.iteration_s else None, "iteration_s": list(r.iteration_s or []),
                             "why_not": r.why_not or None, "oom_iterations": r.oom_iterations,
                             "mean_s_ignoring_memory": float(np.mean(r.scored_s)) if r.scored_s else None,
                             "plan_ms_mean": float(np.mean(r.plan_ms)) if r.plan_ms else None,
                             "plan_ms_max": float(np.max(r.plan_ms)) if r.plan_ms else None}
        target = HybridCP.of(profile, tp=tp, dpcp=GPUS // tp, max_seqlen_per_rank=row["max_seqlen_per_dp_cp_rank"])
        bounds = [hybrid_cp_lower_bound(target, b) for b in batches]
        row["lower_bound_s"] = float(np.mean(bounds)) if np.isfinite(bounds).all() else None
        tps.append(row)
    mega, ours = best_run(runs, "megatron-hcp"), best_run(runs, "hydraplan-hcp")
    same = next(r for r in runs if r.method == "hydraplan-hcp" and r.tp == mega.tp)
    ratios = np.asarray(mega.iteration_s) / np.asarray(same.iteration_s)
    return {**cfg, "iterations": iterations, "tps": tps,
            "megatron_best_tp": mega.tp, "megatron_best_s": mega.mean_s,
            "plugin_same_tp_s": same.mean_s, "speedup_same_tp": mega.mean_s / same.mean_s,
            "min_iteration_speedup_same_tp": float(ratios.min()),
            "plugin_best_tp": ours.tp, "plugin_best_s": ours.mean_s, "speedup_best_tp": mega.mean_s / ours.mean_s,
            "plugin_vs_bound_same_tp": same.mean_s / next(t["lower_bound_s"] for t in tps if t["tp"] == mega.tp),
            "plan_ms_max": max(r.plan_ms and max(r.plan_ms) or 0.0 for r in runs if r.method == "hydraplan-hcp"),
            "megatron_plan_ms_max": max(r.plan_ms and max(r.plan_ms) or 0.0 for r in runs if r.method == "megatron-hcp")}


def main(run: Run) -> None:
    configs, iterations = run.pick(CONFIGS, SMOKE), run.pick(20, 2)
    run.write({"profile": PROFILE, "gpus": GPUS, "seed": SEED, "objective": "propagation",
               "hybrid_cp": [hybrid_cp(c, iterations) for c in configs]})
