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
3. Dynamic context parallelism (Megatron-LM dev): Megatron's DefaultDynamicCPScheduler (`megatron-dcp`, equal to dev's
code, tests/test_megatron_dcp.py) against hydraplan's (`hydraplan-dcp`), every schedule scored as that executor runs
it (propagation: the <tp,1,k> schemes, each pack with its constant once, micro-batches chained per rank) and checked
by its rule checker, each sample padded as Megatron's varlen datasets pad it. (a) Megatron's own benchmark
(examples/dynamic_context_parallel/benchmark_dcp.sh): h100-megatron-dcp-bench, TP 1, CP 4, PP 1,
max_seqlen_per_dp_cp_rank 2048, 8 samples per DP replica (global batch 2 x GPUs samples) of its lognormal mock
dataset, 30 global batches per GPU count (seed 3), dp_balanced at CP 4 beside (what NVIDIA compares DCP with).
(b) The corpora above, h100-llama2-7b on 64 GPUs: each method's setting chosen on 6 tuning batches (seed 1;
Megatron over TP and max_seqlen_per_dp_cp_rank from MaxLen of <tp,1,1> down, the plugin over TP), then measured on
20 held-out batches (seed 3); the plugin also at Megatron's setting (never slower on a batch); CPU ms per batch.
`python -m bench megatron dcp` reruns only this part.
Writes bench/results/megatron.json.
"""

from __future__ import annotations

import time

import numpy as np

from bench.run import Run
from hydraplan.core.cluster import Cluster
from hydraplan.core.executors import (
    DynamicCP,
    HybridCP,
    MegatronPacking,
    dynamic_cp_lower_bound,
    dynamic_cp_padded,
    dynamic_cp_time,
    dynamic_cp_violations,
    hybrid_cp_lower_bound,
)
from hydraplan.methods import baselines as bl
from hydraplan.methods.compare import run_megatron
from hydraplan.methods.megatron_seams import (
    DynamicCPRun,
    PackingRun,
    best_run,
    dcp_run,
    dcp_runs,
    dcp_target,
    dcp_tps,
    hybrid_cp_runs,
    packing_layouts,
    packing_run,
)
from hydraplan.solve.megatron.dcp_bound import dynamic_cp_lp_bound
from hydraplan.solve.megatron.default_dynamic_cp import default_dynamic_cp_schedule
from hydraplan.solve.megatron.dp_balanced import dp_balanced_schedule
from hydraplan.solve.megatron.dynamic_cp import schedule_dynamic_cp
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
    layouts = packing_layouts(cluster, cfg["context_len"])  # Megatron's default, no recompute, and the baseline's
    layouts += [] if same.recompute == "none" else packing_layouts(cluster, cfg["context_len"], same.recompute)
    runs = {(m, s.key): packing_run(m, cluster, batches, s) for s in layouts
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


# -------------------------------------------------------------------------------------------- dynamic CP
DCP_BENCH = {"profile": "h100-megatron-dcp-bench", "dataset": "lognormal:mean=1024,sigma=1.5,min=128,max=8192",
             "tp": 1, "cp": 4, "max_seqlen_per_dp_cp_rank": 2048, "samples_per_replica": 8}
DCP_GPUS, DCP_GPUS_SMOKE = (4, 8, 16, 32, 64), (4, 8)
TUNING_SEED = 1


def dcp_benchmark(gpus: int, iterations: int) -> dict:
    """Megatron's benchmark at `gpus` GPUs: DCP's schedulers and dp_balanced at CP 4 on the same samples."""
    cfg = DCP_BENCH
    profile = load_profile(cfg["profile"])
    dp, limit = gpus // cfg["cp"], cfg["max_seqlen_per_dp_cp_rank"]
    lengths = load_dataset(cfg["dataset"]).lengths
    order = np.random.default_rng(SEED).permutation(lengths.size)
    per_batch = cfg["samples_per_replica"] * dp
    target = DynamicCP.of(profile, tp=1, dpcp=gpus, max_seqlen_per_rank=limit)
    packing_target = MegatronPacking.of(profile, tp=1, pp=1, cp=cfg["cp"], dp=dp, capacity=limit * cfg["cp"], multiple=dp)
    rows: dict[str, list[float]] = {k: [] for k in ("megatron", "plugin", "bound", "closed_form_bound", "dp_balanced",
                                                    "plan_ms", "megatron_mb", "plugin_mb")}
    invalid = {"megatron": 0, "plugin": 0}
    for k in range(iterations):
        raw = lengths[order[k * per_batch:(k + 1) * per_batch]]
        padded = dynamic_cp_padded(raw, gpus)  # 2 x DPxCP, as the mock dataset pads for dynamic CP
        theirs = default_dynamic_cp_schedule(padded, dpcp=gpus, max_seqlen_per_rank=limit)
        t0 = time.process_time()
        ours = schedule_dynamic_cp(padded, target)
        rows["plan_ms"].append((time.process_time() - t0) * 1e3)
        invalid["megatron"] += bool(dynamic_cp_violations(theirs, padded, target))
        invalid["plugin"] += bool(dynamic_cp_violations(ours, padded, target))
        rows["megatron"].append(dynamic_cp_time(target, theirs, padded))
        rows["plugin"].append(dynamic_cp_time(target, ours, padded))
        rows["bound"].append(dynamic_cp_lp_bound(target, padded))
        rows["closed_form_bound"].append(dynamic_cp_lower_bound(target, padded))
        rows["megatron_mb"].append(len(theirs))
        rows["plugin_mb"].append(len(ours))
        packed = -(-raw // (2 * cfg["cp"])) * (2 * cfg["cp"])  # 2 x CP, as the mock dataset pads for dp_balanced
        sched = dp_balanced_schedule(packed.tolist(), limit * cfg["cp"], dp, cfg["cp"])
        rows["dp_balanced"].append(max(packing_target.propagation_s(sched, packed)))
    mean = {k: float(np.mean(v)) for k, v in rows.items()}
    ratios = np.asarray(rows["megatron"]) / np.asarray(rows["plugin"])
    return {"id": f"{gpus}gpus", "gpus": gpus, "dp": dp, "samples": per_batch, "iterations": iterations,
            "megatron_s": mean["megatron"], "plugin_s": mean["plugin"], "bound_s": mean["bound"],
            "dp_balanced_s": mean["dp_balanced"], "speedup": mean["megatron"] / mean["plugin"],
            "min_iteration_speedup": float(ratios.min()), "plugin_vs_bound": mean["plugin"] / mean["bound"],
            "megatron_vs_bound": mean["megatron"] / mean["bound"], "closed_form_bound_s": mean["closed_form_bound"],
            "megatron_over_dp_balanced": mean["dp_balanced"] / mean["megatron"],
            "plugin_over_dp_balanced": mean["dp_balanced"] / mean["plugin"],
            "megatron_micro_batches": mean["megatron_mb"], "plugin_micro_batches": mean["plugin_mb"],
            "megatron_invalid": invalid["megatron"], "plugin_invalid": invalid["plugin"],
            "plan_ms_max": float(np.max(rows["plan_ms"]))}


def _dcp_row(r: DynamicCPRun) -> dict:
    return {"id": f"{r.method}-tp{r.tp}-{r.max_seqlen_per_rank}", "method": r.method, "tp": r.tp,
            "max_seqlen_per_dp_cp_rank": r.max_seqlen_per_rank, "mean_s": r.mean_s if r.iteration_s else None,
            "invalid": r.invalid, "why_not": r.why_not or None}


def _held_out(tried: list[DynamicCPRun], method: str, profile, held: list[np.ndarray]) -> tuple[DynamicCPRun, list]:
    """The method's settings fastest first on the tuning batches, run on the held-out ones: the first that schedules
    every held-out batch within the executor's rules, and the ones before it that did not (what a user meeting such
    a batch would step down from)."""
    ranked = sorted((r for r in tried if r.method == method and r.iteration_s is not None and not r.invalid),
                    key=lambda r: (r.mean_s, r.tp, -r.max_seqlen_per_rank))
    broke = []
    for r in ranked:
        run = dcp_run(method, profile, held, GPUS, r.tp, r.max_seqlen_per_rank)
        if run.iteration_s is not None and not run.invalid:
            return run, broke
        broke.append({"tp": run.tp, "max_seqlen_per_dp_cp_rank": run.max_seqlen_per_rank, "invalid": run.invalid,
                      "why": run.why_not or None})
    raise AssertionError(f"{method} runs no setting on every held-out batch")  # both run some setting of every config


def dcp_corpus(cfg: dict, iterations: int, tuning: int) -> dict:
    """One corpus on 64 GPUs: settings chosen on tuning batches, measured on held-out ones."""
    profile = load_profile(PROFILE)
    data = load_dataset(cfg["dataset"], cfg["context_len"])
    tune = [b.lengths for b in sample_iterations(data, cfg["tokens_per_iter"], tuning, TUNING_SEED)]
    held = [b.lengths for b in sample_iterations(data, cfg["tokens_per_iter"], iterations, SEED)]
    tried = dcp_runs(profile, tune, GPUS, cfg["context_len"])
    m, m_broke = _held_out(tried, "megatron-dcp", profile, held)
    o, o_broke = _held_out(tried, "hydraplan-dcp", profile, held)
    same = dcp_run("hydraplan-dcp", profile, held, GPUS, m.tp, m.max_seqlen_per_rank)
    ratios = np.asarray(m.scored_s) / np.asarray(same.scored_s)
    target = dcp_target(profile, GPUS, o.tp, o.max_seqlen_per_rank)
    bound = float(np.mean([dynamic_cp_lp_bound(target, dynamic_cp_padded(raw, target.dpcp, o.tp)) for raw in held]))
    return {**cfg, "iterations": iterations, "tuning_iterations": tuning,
            "tps": dcp_tps(profile, GPUS, context_len=cfg["context_len"]),
            "megatron_tp": m.tp, "megatron_limit": m.max_seqlen_per_rank, "megatron_s": m.mean_s,
            "megatron_invalid": m.invalid, "megatron_settings_broken_on_held_out": m_broke,
            "plugin_tp": o.tp, "plugin_limit": o.max_seqlen_per_rank, "plugin_settings_broken_on_held_out": o_broke,
            "plugin_s": o.mean_s, "plugin_invalid": o.invalid + same.invalid, "speedup": m.mean_s / o.mean_s,
            "bound_s": bound, "closed_form_bound_s": float(np.mean(o.bound_s)), "plugin_vs_bound": o.mean_s / bound,
            "speedup_bound": m.mean_s / bound,
            "plugin_same_setting_s": same.mean_s, "speedup_same_setting": m.mean_s / same.mean_s,
            "min_iteration_speedup_same_setting": float(ratios.min()),
            "plan_ms_max": max(o.plan_ms), "plan_ms_mean": float(np.mean(o.plan_ms)),
            "megatron_plan_ms_max": max(m.plan_ms), "tuning": [_dcp_row(r) for r in tried]}


def dynamic_cp(run: Run) -> dict:
    return {"benchmark": {**DCP_BENCH, "seed": SEED, "rows": [dcp_benchmark(g, run.pick(30, 3))
                                                              for g in run.pick(DCP_GPUS, DCP_GPUS_SMOKE)]},
            "corpora": [dcp_corpus(c, run.pick(20, 2), run.pick(6, 1)) for c in run.pick(CONFIGS, SMOKE)]}


def main(run: Run) -> None:
    configs, iterations = run.pick(CONFIGS, SMOKE), run.pick(20, 2)
    if run.argv == ("dcp",) and not run.smoke:  # only the dynamic-CP part, the rest of the file kept
        run.write({**run.previous(), "dynamic_cp": dynamic_cp(run)}, merged=True)
        return
    run.write({"profile": PROFILE, "gpus": GPUS, "seed": SEED, "objective": "propagation",
               "hybrid_cp": [hybrid_cp(c, iterations) for c in configs],
               "packing": [packing(c, iterations) for c in run.pick(PACKING, PACKING_SMOKE)],
               "dynamic_cp": dynamic_cp(run)})
