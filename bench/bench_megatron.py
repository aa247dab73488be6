"""hydraplan inside Megatron-LM (issue 39), both of Megatron's variable-length seams.

1. Hybrid CP: Megatron's BalancedCPScheduler (`megatron-hcp`,
equal to the megatron-core 0.19.2 wheel's, tests/test_megatron_hcp.py) against hydraplan's (`hydraplan-hcp`,
hydraplan.integrations.megatron) on the same global batches (seed 3, 20 per configuration), every schedule scored
as Megatron's executor runs it (propagation: the canonical cost model's <tp,1,cp> schemes, a sequence starting when
its CP group is free, rounds adding up), h100-llama2-7b on 64 GPUs. At every TP in {1, 2, 4, 8},
--max-seqlen-per-dp-cp-rank is MaxLen of <tp,1,1>; a TP where a method's schedule puts a sequence on fewer ranks
than its memory needs (MaxLen of <tp,1,cp>) is one that method cannot run (its time ignoring memory is recorded
too: the issue's table took Megatron at TP 4 at 128K, where it runs out of memory on a few batches). Also: the
work lower bound of each TP (no schedule is faster), and the CPU milliseconds each scheduler spends per global
batch (one core; what every rank waits for).
2. Sequence packing: Megatron's dp_balanced (`megatron-dp-balanced`, written from its code in Megatron-LM main)
against hydraplan's (`hydraplan-packing`) in every <tp,pp,cp> x dp layout whose packs hold the context length,
on compare's batches (seed 0, 20 per configuration), end to end (the cluster's estimate, LNK pull and push
included) and propagation: in the layout compare's Megatron baseline takes (the issue's "same layout"), at
dp_balanced's fastest layout, and at the plugin's fastest (what `hydraplan megatron suggest` gives).
Writes bench/results/megatron.json.
"""

from __future__ import annotations

import numpy as np

from bench.run import Run
from hydraplan.core.cluster import Cluster
from hydraplan.core.executors import HybridCP, hybrid_cp_lower_bound
from hydraplan.methods import baselines as bl
from hydraplan.methods.compare import run_megatron
from hydraplan.methods.megatron_seams import PackingRun, best_run, hybrid_cp_runs, packing_layouts, packing_run
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
PACKING = [
    {"id": "7b-wikipedia-32k", "profile": "h100-llama2-7b", "dataset": "builtin:wikipedia", "context_len": 32768,
     "tokens_per_iter": 200_000},
    {"id": "13b-wikipedia-32k", "profile": "h100-llama2-13b", "dataset": "builtin:wikipedia", "context_len": 32768,
     "tokens_per_iter": 200_000},
    {"id": "7b-wikipedia-128k", "profile": "h100-llama2-7b", "dataset": "builtin:wikipedia", "context_len": 131072,
     "tokens_per_iter": 1_600_000},
    {"id": "7b-prolong-128k", "profile": "h100-llama2-7b", "dataset": "builtin:prolong", "context_len": 131072,
     "tokens_per_iter": 1_600_000},
]
PACKING_SMOKE = PACKING[:1]
PACKING_SEED = 0


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
        theirs, ours = row["megatron-hcp"], row["hydraplan-hcp"]
        if theirs["mean_s_ignoring_memory"] and ours["mean_s"]:
            row["megatron_ignoring_memory_over_plugin"] = theirs["mean_s_ignoring_memory"] / ours["mean_s"]
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


def _packing_row(r: PackingRun) -> dict:
    return {"layout": r.label, "mean_iteration_s": r.mean_s if not r.why_not else None,
            "mean_propagation_s": float(np.mean(r.propagation_s)) if r.propagation_s and not r.why_not else None,
            "iteration_s": list(r.iteration_s), "why_not": r.why_not or None,
            "plan_ms_max": max(r.plan_ms, default=None)}


def packing(cfg: dict, iterations: int) -> dict:
    cluster = Cluster.of(load_profile(cfg["profile"]), GPUS)
    batches = [np.asarray(b.lengths, dtype=np.int64) for b in sample_iterations(
        load_dataset(cfg["dataset"], cfg["context_len"]), cfg["tokens_per_iter"], iterations, PACKING_SEED)]
    same = run_megatron(batches, cluster, cfg["context_len"], bl.objective_score(cluster))[0]
    runs = {(m, s.key): packing_run(m, cluster, batches, s) for s in packing_layouts(cluster, cfg["context_len"])
            for m in ("megatron-dp-balanced", "hydraplan-packing")}
    theirs = {k[1]: r for k, r in runs.items() if k[0] == "megatron-dp-balanced"}
    ours = {k[1]: r for k, r in runs.items() if k[0] == "hydraplan-packing"}
    their_best = min(theirs.values(), key=lambda r: (r.mean_s, r.scheme.gpus))
    our_best = min(ours.values(), key=lambda r: (r.mean_s, r.scheme.gpus))
    a, b = theirs[same.key], ours[same.key]
    ratios = np.asarray(a.iteration_s) / np.asarray(b.iteration_s)
    return {**cfg, "iterations": iterations,
            "same_layout": a.label, "megatron_same_s": a.mean_s, "plugin_same_s": b.mean_s,
            "speedup_same_layout": a.mean_s / b.mean_s, "min_iteration_speedup_same_layout": float(ratios.min()),
            "speedup_same_layout_propagation": float(np.mean(a.propagation_s) / np.mean(b.propagation_s)),
            "megatron_best_layout": their_best.label, "megatron_best_s": their_best.mean_s,
            "plugin_at_megatron_best_s": ours[their_best.scheme.key].mean_s,
            "speedup_megatron_best_layout": their_best.mean_s / ours[their_best.scheme.key].mean_s,
            "plugin_best_layout": our_best.label, "plugin_best_s": our_best.mean_s,
            "speedup_best_layouts": their_best.mean_s / our_best.mean_s,
            "plan_ms_max": max(max(r.plan_ms, default=0.0) for r in ours.values()),
            "plan_ms_same_layout": max(b.plan_ms, default=None), "plan_ms_best_layout": max(our_best.plan_ms, default=None),
            "layouts": [{"id": f"{m}-{r.label}", "method": m, **_packing_row(r)} for (m, _), r in runs.items()]}


def main(run: Run) -> None:
    configs, iterations = run.pick(CONFIGS, SMOKE), run.pick(20, 2)
    run.write({"profile": PROFILE, "gpus": GPUS, "seed": SEED, "objective": "propagation",
               "hybrid_cp": [hybrid_cp(c, iterations) for c in configs],
               "packing": [packing(c, iterations) for c in run.pick(PACKING, PACKING_SMOKE)]})
