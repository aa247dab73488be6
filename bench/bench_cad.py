"""Core-attention disaggregation (hydraplan.solve.cad) vs heterogeneous pipelines vs WLB-LLM, end to end (issue 17).

On the same sampled batches: wlb-nodelay (WLB-LLM var-len packing, no outlier delay), hydraplan (per-iteration
choice among heterogeneous candidates), cad (DistCA-style: homogeneous cp=1 replicas, attention tasks balanced
across them) and hydraplan-cad (per iteration the faster of the two). Every figure is the end-to-end estimate
(propagation + exposed LNK sync, hydraplan.core.sync), the propagation estimate next to it. 64 GPUs; the h100-llama2-7b
and a800-llama2-13b profiles; wikipedia and prolong; 32K and 128K context; 200K and 1.6M tokens per iteration
(configurations no scheme can hold are recorded as skipped). Writes bench/results/cad.json after every
configuration; `python -m bench cad target` re-measures the target configuration only, keeping the others.

Target (h100-llama2-7b, prolong, 32K, 200K): hydraplan-cad >= 1.15x over wlb-nodelay, ahead of hydraplan and cad.
"""

from __future__ import annotations

import json
import time

import numpy as np

from bench.run import Run
from hydraplan.core.errors import UserError
from hydraplan.methods.compare import CompareConfig, run_compare

METHODS = ("wlb-nodelay", "hydraplan", "cad", "hydraplan-cad")
PROFILES = ("h100-llama2-7b", "a800-llama2-13b")
DATASETS = ("builtin:prolong", "builtin:wikipedia")
CONTEXTS = (32768, 131072)
TOKENS = (200_000, 1_600_000)
GPUS, SEED = 64, 0
ITERS = {200_000: 4, 1_600_000: 2}
TARGET = ("h100-llama2-7b", "builtin:prolong", 32768, 200_000)
SMOKE = ("h100-llama2-7b", "builtin:prolong", 32768, 50_000)  # on 16 GPUs, one iteration


def config_id(profile: str, dataset: str, context: int, tokens: int) -> str:
    return f"{profile}_{dataset.removeprefix('builtin:')}_{context // 1024}K_{tokens // 1000}K"


def run_config(profile: str, dataset: str, context: int, tokens: int, gpus: int = GPUS, iterations: int | None = None) -> dict:
    t0 = time.perf_counter()
    iterations = iterations or ITERS[tokens]
    head = {"id": config_id(profile, dataset, context, tokens), "profile": profile, "dataset": dataset,
            "context_len": context, "tokens_per_iter": tokens, "gpus": gpus}
    try:
        out = run_compare(CompareConfig(profile=profile, dataset=dataset, gpus=gpus, tokens_per_iter=tokens,
                                         iterations=iterations, seed=SEED, context_len=context, methods=METHODS))
    except UserError as e:
        return {**head, "skipped": str(e)}
    e2e = {m: r.mean_iteration_s for m, r in out.result.methods.items()}
    prop = {m: r.mean_estimate_s for m, r in out.result.methods.items()}
    chose = out.runs["hydraplan-cad"].plans
    speedup = {m: e2e["wlb-nodelay"] / v for m, v in e2e.items()}
    return {
        **head, "iterations": iterations, "wall_s": time.perf_counter() - t0,
        "end_to_end_s": e2e, "propagation_s": prop, "speedup_vs_wlb_nodelay": speedup,
        "cad_share": float(np.mean([p.strategy.startswith("cad") for p in chose])),
        "cad_layout": sorted({p.strategy for p in out.runs["cad"].plans}),
        "winner": min(("hydraplan", "cad"), key=lambda m: e2e[m]),
        "best": max(("hydraplan", "cad", "hydraplan-cad"), key=lambda m: speedup[m]),
    }


def main(run: Run) -> None:
    part = run.argv[0] if run.argv else None
    if part not in (None, "target"):
        raise SystemExit(f"bench cad: unknown part {part!r} (target)")
    if run.smoke:
        grid, gpus, iterations = [SMOKE], 16, 1
    else:
        grid = [TARGET] if part else [(p, d, c, t) for p in PROFILES for d in DATASETS for c in CONTEXTS for t in TOKENS]
        gpus, iterations = GPUS, None
    configs = {c["id"]: c for c in run.previous().get("configs", [])} if part else {}
    for cfg in grid:
        r = run_config(*cfg, gpus=gpus, iterations=iterations)
        configs[r["id"]] = r
        print(json.dumps(r), flush=True)
        target = config_id(*(SMOKE if run.smoke else TARGET))  # the smoke run's one configuration stands in for it
        run.write(summarize(list(configs.values()), gpus, target), merged=part is not None)  # a stopped run keeps it


def summarize(configs: list[dict], gpus: int, target_id: str) -> dict:
    """The configurations and how the target configuration (when measured) meets its target."""
    out: dict = {"model": "end to end (propagation + exposed LNK sync)", "gpus": gpus, "seed": SEED}
    ran = [c for c in configs if "skipped" not in c]
    target = next((c for c in ran if c["id"] == target_id), None)
    if target is not None:
        s, e = target["speedup_vs_wlb_nodelay"], target["end_to_end_s"]
        out["target"] = {"id": target["id"], "hydraplan_cad_vs_wlb_nodelay": s["hydraplan-cad"],
                         "met_1_15x": s["hydraplan-cad"] >= 1.15,
                         "ahead_of_both": e["hydraplan-cad"] < min(e["hydraplan"], e["cad"])}
    name = lambda c: (f"{c['profile']} {c['dataset'].removeprefix('builtin:')} {c['context_len'] // 1024}K "  # noqa: E731
                      f"{c['tokens_per_iter'] / 1e6:g}M")
    out["cad_wins"] = [name(c) for c in ran if c["winner"] == "cad"]
    out["hydraplan_wins"] = [name(c) for c in ran if c["winner"] == "hydraplan"]
    return {**out, "configs": configs}
