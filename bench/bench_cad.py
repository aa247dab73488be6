"""Core-attention disaggregation (hydraplan.solve.cad) vs heterogeneous pipelines vs WLB-LLM, end to end (issue 17).

On the same sampled batches: wlb-nodelay (WLB-LLM var-len packing, no outlier delay), hydraplan (per-iteration
choice among heterogeneous candidates), cad (DistCA-style: homogeneous cp=1 replicas, attention tasks balanced
across them) and hydraplan-cad (per iteration the faster of the two). Every figure is the end-to-end estimate
(propagation + exposed LNK sync, hydraplan.core.sync), the propagation estimate next to it. 64 GPUs; the h100-llama2-7b
and a800-llama2-13b profiles; wikipedia and prolong; 32K and 128K context; 200K and 1.6M tokens per iteration
(configurations no scheme can hold are recorded as skipped). Writes bench/results/cad.json after every
configuration; `--table` prints the README table from it, `--target` runs the target configuration only.

Target (h100-llama2-7b, prolong, 32K, 200K): hydraplan-cad >= 1.15x over wlb-nodelay, ahead of hydraplan and cad.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from hydraplan.core.errors import UserError
from hydraplan.methods.compare import CompareConfig, run_compare
from hydraplan.store.paths import ROOT

RESULTS = ROOT / "bench" / "results" / "cad.json"
METHODS = ("wlb-nodelay", "hydraplan", "cad", "hydraplan-cad")
PROFILES = ("h100-llama2-7b", "a800-llama2-13b")
DATASETS = ("builtin:prolong", "builtin:wikipedia")
CONTEXTS = (32768, 131072)
TOKENS = (200_000, 1_600_000)
GPUS, SEED = 64, 0
ITERS = {200_000: 4, 1_600_000: 2}
TARGET = ("h100-llama2-7b", "builtin:prolong", 32768, 200_000)


def run_config(profile: str, dataset: str, context: int, tokens: int) -> dict:
    t0 = time.perf_counter()
    try:
        out = run_compare(CompareConfig(profile=profile, dataset=dataset, gpus=GPUS, tokens_per_iter=tokens,
                                         iterations=ITERS[tokens], seed=SEED, context_len=context, methods=METHODS))
    except UserError as e:
        return {"profile": profile, "dataset": dataset, "context_len": context, "tokens_per_iter": tokens,
                "skipped": str(e)}
    e2e = {m: r.mean_iteration_s for m, r in out.result.methods.items()}
    prop = {m: r.mean_estimate_s for m, r in out.result.methods.items()}
    chose = out.runs["hydraplan-cad"].plans
    return {
        "profile": profile, "dataset": dataset, "context_len": context, "tokens_per_iter": tokens,
        "iterations": ITERS[tokens], "wall_s": time.perf_counter() - t0,
        "end_to_end_s": e2e, "propagation_s": prop,
        "speedup_vs_wlb_nodelay": {m: e2e["wlb-nodelay"] / v for m, v in e2e.items()},
        "cad_share": float(np.mean([p.strategy.startswith("cad") for p in chose])),
        "cad_layout": sorted({p.strategy for p in out.runs["cad"].plans}),
        "winner": min(("hydraplan", "cad"), key=lambda m: e2e[m]),
    }


def table(summary: dict) -> str:
    """The README table: one row per configuration, end-to-end seconds of wlb-nodelay and speedups over it."""
    rows = ["| profile | dataset | context | tokens | `wlb-nodelay` | `hydraplan` | `cad` | `hydraplan-cad` | CAD chosen |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in summary["configs"]:
        head = f"| {c['profile']} | {c['dataset'].replace('builtin:', '')} | {c['context_len'] // 1024}K | " \
               f"{c['tokens_per_iter'] / 1e6:g}M |"
        if "skipped" in c:
            rows.append(head + " no scheme holds it | | | | |")
            continue
        s, e = c["speedup_vs_wlb_nodelay"], c["end_to_end_s"]
        best = max(("hydraplan", "cad", "hydraplan-cad"), key=lambda m: s[m])
        cells = [f"**{s[m]:.2f}x**" if m == best else f"{s[m]:.2f}x" for m in ("hydraplan", "cad", "hydraplan-cad")]
        rows.append(head + f" {e['wlb-nodelay']:.3g} s | " + " | ".join(cells) + f" | {c['cad_share']:.0%} |")
    return "\n".join(rows)


def main(argv: list[str]) -> None:
    if "--table" in argv:
        print(table(json.loads(RESULTS.read_text())))
        return
    quick = "--target" in argv
    grid = [TARGET] if quick else [(p, d, c, t) for p in PROFILES for d in DATASETS for c in CONTEXTS for t in TOKENS]
    configs: list[dict] = []
    for cfg in grid:
        r = run_config(*cfg)
        configs.append(r)
        print(json.dumps(r), flush=True)
        summary = summarize(configs, complete=len(configs) == len(grid))
        if not quick:  # rewritten after every configuration: a stopped run keeps what it measured
            RESULTS.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary["target"]))


def summarize(configs: list[dict], complete: bool) -> dict:
    target = next(c for c in configs if (c["profile"], c["dataset"], c["context_len"], c["tokens_per_iter"]) == TARGET)
    s = target["speedup_vs_wlb_nodelay"]
    e = target["end_to_end_s"]
    return {
        "model": "end to end (propagation + exposed LNK sync)",
        "gpus": GPUS, "seed": SEED, "complete": complete,
        "target": {"config": list(TARGET), "hydraplan_cad_vs_wlb_nodelay": s["hydraplan-cad"],
                   "met_1_15x": s["hydraplan-cad"] >= 1.15,
                   "ahead_of_both": e["hydraplan-cad"] < min(e["hydraplan"], e["cad"])},
        "configs": configs,
    }


if __name__ == "__main__":
    main(sys.argv[1:])
