"""hydraplan vs Megatron-LM, HotSPa, WLB-LLM, FlexSP and the Hydraulis ablations (issues 5 and 12).

Every method plans the same sampled batches and is scored end to end (propagation + exposed LNK pull/push,
docs/formats.md) and on propagation alone. Each configuration runs twice: with the end-to-end objective (static
choices and hydraplan minimize iteration time; the issue 12 targets) and with the propagation objective
(the paper's; issue 5's figures). Configurations:
- the issue 12 grid: h100-llama2-7b, 64 GPUs, 32K context, builtin:wikipedia and builtin:prolong, at 200K
  and 1.6M tokens per iteration;
- the earlier grid at 200K tokens: a800-llama2-13b and a800-llama2-32b (Hydraulis §8.4's case study).
Targets, end to end (both paying sync): hydraplan >= 1.35x over megatron at 200K tokens, ahead of every
method that trains each batch in its own iteration; hydraplan-delay ahead of wlb-llm (both delay outliers
across iterations; their average delay per token is reported next to each other).
Per configuration the full report (compare.json, report.html, PNGs) goes to
bench/results/compare/<profile>_<dataset>_<tokens>_<objective>/ (git-ignored), the summary to
bench/results/compare.json, with the LNK transfer time per direction of the schemes the text discusses.
`python -m bench compare --grid issue12` runs only the issue 12 grid; `--only NAME` (a report folder's name)
runs one configuration and `--summarize` rebuilds the summary from the report folders, so several processes
can share a grid.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.run import Run
from hydraplan.app.report import write_report
from hydraplan.core.cluster import Cluster
from hydraplan.methods.baselines import SwitchModel, model_param_bytes
from hydraplan.methods.compare import CompareConfig, run_compare
from hydraplan.schema import CompareResult
from hydraplan.store.profiles import load_profile

DATASETS = ("builtin:wikipedia", "builtin:prolong")
GPUS, CONTEXT, SEED = 64, 32768, 0
ITERS = {200_000: 20, 1_600_000: 6}  # 1.6M tokens: 8x the sequences per iteration, so fewer iterations
GRIDS = {
    "issue12": [("h100-llama2-7b", d, t) for t in (200_000, 1_600_000) for d in DATASETS],
    "extra": [(p, d, 200_000) for p in ("a800-llama2-13b", "a800-llama2-32b") for d in DATASETS],
}
SMOKE = {"grid": [("h100-llama2-7b", "builtin:wikipedia", 20_000)], "gpus": 8, "iterations": 2}
OBJECTIVES = ("end-to-end", "propagation")
LNK_SCHEMES = ((1, 1), (2, 1))  # <tp, pp> whose transfer time the text quotes, with each method's most used
UNDELAYED = ("megatron", "hotspa", "wlb-nodelay", "flexsp", "homo-maxlen", "homo-pack", "hetero-static")


@dataclass(frozen=True)
class Setup:
    """Where the reports go and how big each configuration is (the full grid or the smoke one)."""

    figures: Path
    gpus: int
    iterations: dict[int, int] | int

    def folder(self, profile: str, dataset: str, tokens: int, objective: str) -> Path:
        return self.figures / f"{profile}_{dataset.replace('builtin:', '')}_{tokens // 1000}K_{objective}"

    def iters(self, tokens: int) -> int:
        return self.iterations if isinstance(self.iterations, int) else self.iterations[tokens]


def run(setup: Setup, profile: str, dataset: str, tokens: int, objective: str) -> None:
    t0 = time.perf_counter()
    outcome = run_compare(CompareConfig(profile=profile, dataset=dataset, gpus=setup.gpus, tokens_per_iter=tokens,
                                         iterations=setup.iters(tokens), seed=SEED, context_len=CONTEXT,
                                         objective=objective))
    out = setup.folder(profile, dataset, tokens, objective)
    write_report(outcome, out)
    (out / "wall_s.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")


def lnk(profile: str, gpus: int, strategies: dict[str, str]) -> dict:
    """One direction of the LNK pull (or push) per GPU, for the schemes the text names and each method's."""
    cluster = Cluster.of(load_profile(profile), gpus)
    keys = {f"<{tp},{pp},1>": (tp, pp) for tp, pp in LNK_SCHEMES}
    for label in strategies.values():  # "<2,1,4>x8": a homogeneous layout
        if label.startswith("<") and "x" in label:
            tp, pp, _ = (int(v) for v in label[1:label.index(">")].split(","))
            keys[label[:label.index(">") + 1]] = (tp, pp)
    params = cluster.profile.model.params or 0
    pp1 = [s for s in cluster.view.schemes if s.pp == 1][:2]
    switch_gbs = CompareConfig.model_fields["switch_bandwidth_gbs"].default
    switch = SwitchModel(model_param_bytes(cluster.profile.model), switch_gbs * 1e9)
    per_direction = {k: {"GB": 2 * params / (tp * pp) / 1e9, "s": float(cluster.transfer_s(tp, pp))}
                     for k, (tp, pp) in keys.items()}
    megatron = strategies.get("megatron", "")
    scheme = megatron[:megatron.index(">") + 1] if ">" in megatron else None
    return {"bandwidth_GBps": cluster.bandwidth_GBps, "per_direction": per_direction,
            "megatron": {"scheme": scheme, **per_direction[scheme]} if scheme in per_direction else None,
            "hotspa_switch_GBps": switch.bandwidth_Bps / 1e9, "hotspa_switch_s_pp1": switch.switch_s(*pp1)}


def summary(setup: Setup, profile: str, dataset: str, tokens: int, objective: str) -> dict:
    out = setup.folder(profile, dataset, tokens, objective)
    result = CompareResult.model_validate_json((out / "compare.json").read_text())
    m = result.methods
    e2e = {n: r.mean_iteration_s for n, r in m.items()}
    hydra, delay = e2e["hydraplan"], e2e["hydraplan-delay"]
    strategy = {n: Counter(r.strategies).most_common(1)[0][0] for n, r in m.items()}
    sim = {n: max(abs(s / e - 1.0) for s, e in zip(r.sim_iterations_s, r.iterations_s)) for n, r in m.items()}
    return {
        "id": out.name, "profile": profile, "dataset": dataset, "tokens_per_iter": tokens,
        "iterations": result.iterations, "objective": objective, "wall_s": float((out / "wall_s.txt").read_text()),
        "mean_iteration_s": e2e,
        "mean_estimate_s": {n: r.mean_estimate_s for n, r in m.items()},
        "mean_sync_s": {n: r.mean_sync_s for n, r in m.items()},
        "end_to_end_speedup_vs_megatron": {n: r.end_to_end_speedup_vs_megatron for n, r in m.items()},
        "propagation_speedup_vs_megatron": {n: r.propagation_speedup_vs_megatron for n, r in m.items()},
        "mean_gap": {n: float(np.mean(r.gap)) for n, r in m.items()},
        "mean_mfu": {n: float(np.mean(r.mfu)) for n, r in m.items()},
        "strategy": strategy,
        "wlb_imbalance": float(np.mean(m["wlb-llm"].imbalance)),
        "wlb_delay_iters_per_token": m["wlb-llm"].avg_delay_iters_per_token,
        "hydraplan_delay_iters_per_token": m["hydraplan-delay"].avg_delay_iters_per_token,
        "hydraplan_delay_vs_wlb_llm_end_to_end": e2e["wlb-llm"] / delay,
        "hydraplan_vs_wlb_nodelay_end_to_end": e2e["wlb-nodelay"] / hydra,
        "hydraplan_behind_wlb_llm_end_to_end": bool(hydra > e2e["wlb-llm"]),
        "sim_vs_closed_max_rel": max(sim.values()), "sim_vs_closed_max_rel_by_method": sim,
        "lnk": lnk(profile, setup.gpus, strategy),
        "target_1_35x_end_to_end_over_megatron": bool(m["hydraplan"].end_to_end_speedup_vs_megatron >= 1.35),
        "target_ahead_of_undelayed_end_to_end": bool(all(hydra <= e2e[n] for n in UNDELAYED if n in e2e)),
        "target_delay_ahead_of_wlb_llm_end_to_end": bool(delay <= e2e["wlb-llm"]),
    }


def overall(configs: list[dict]) -> dict:
    """Under the end-to-end objective, where a method that trains each batch in its own iteration (CAD aside)
    is faster than hydraplan, and which; the fastest method per configuration; where the 1F1B simulator
    differs most from the closed form."""
    e2e = [c for c in configs if c["objective"] == "end-to-end"]
    faster = {c["id"]: [m for m in UNDELAYED if c["mean_iteration_s"][m] < c["mean_iteration_s"]["hydraplan"]]
              for c in e2e}
    def name(c: dict) -> str:
        t = c["tokens_per_iter"]
        return f"{c['profile']} {c['dataset'].removeprefix('builtin:')} {f'{t / 1e6:g}M' if t >= 1e6 else f'{t // 1000}K'}"

    sim = [(v, m, c["id"]) for c in configs for m, v in c["sim_vs_closed_max_rel_by_method"].items()]
    worst = max(sim)
    return {"end_to_end_configs": len(e2e), "hydraplan_ahead_of_undelayed": sum(not f for f in faster.values()),
            "undelayed_ahead_of_hydraplan": [f"{name(c)}: {', '.join(faster[c['id']])}" for c in e2e if faster[c["id"]]],
            "fastest_end_to_end": [f"{name(c)}: {max(c['mean_iteration_s'], key=lambda m: -c['mean_iteration_s'][m])}"
                                   for c in e2e],
            "sim_vs_closed": {"max_rel": worst[0], "method": worst[1], "config": worst[2],
                              "max_rel_other_methods": max((v for v, m, _ in sim if m != worst[1]), default=0.0)}}


def main(bench: Run) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench compare")
    parser.add_argument("--grid", choices=[*GRIDS, "all"], default="all")
    parser.add_argument("--only", help="one configuration, by its report folder name")
    parser.add_argument("--summarize", action="store_true", help="only rebuild the summary from the report folders")
    args = parser.parse_args(bench.argv)
    figures = bench.results / "compare"
    if bench.smoke:
        setup, grid = Setup(figures, SMOKE["gpus"], SMOKE["iterations"]), SMOKE["grid"]
    else:
        setup, grid = Setup(figures, GPUS, ITERS), [c for g in GRIDS if args.grid in (g, "all") for c in GRIDS[g]]
    todo = [(p, d, t, o) for o in OBJECTIVES for p, d, t in grid]
    if args.only is not None:
        todo = [c for c in todo if setup.folder(*c).name == args.only]
        if not todo:
            raise SystemExit(f"--only {args.only}: no such configuration")
    if not args.summarize:
        for c in todo:
            run(setup, *c)
    if args.only is not None:
        return
    configs = [summary(setup, *c) for c in todo if (setup.folder(*c) / "wall_s.txt").exists()]
    bench.write({"gpus": setup.gpus, "context_len": CONTEXT, "seed": SEED, **overall(configs), "configs": configs})
    _print(configs)


def _print(configs: list[dict]) -> None:
    methods = list(configs[0]["mean_iteration_s"])
    print("speedup over megatron, end to end (both paying sync) / propagation only")
    print(f"{'profile':16s} {'dataset':9s} {'tokens':>6s} {'objective':11s} " + " ".join(f"{n[:11]:>11s}" for n in methods))
    for c in configs:
        print(f"{c['profile']:16s} {c['dataset'].replace('builtin:', ''):9s} {c['tokens_per_iter'] // 1000:5d}K "
              f"{c['objective']:11s} " + " ".join(
                  f"{c['end_to_end_speedup_vs_megatron'][n]:5.2f}/{c['propagation_speedup_vs_megatron'][n]:4.2f}"
                  for n in methods))
    for c in configs:
        if c["objective"] != "end-to-end":
            continue
        ok = lambda k: "ok" if c[k] else "MISSED"  # noqa: E731
        print(f"{c['profile']} {c['dataset']} {c['tokens_per_iter'] // 1000}K: hydraplan "
              f"{c['end_to_end_speedup_vs_megatron']['hydraplan']:.2f}x over megatron end to end "
              f"[{ok('target_1_35x_end_to_end_over_megatron') if c['tokens_per_iter'] == 200_000 else 'no target'}], "
              f"ahead of undelayed methods [{ok('target_ahead_of_undelayed_end_to_end')}]; hydraplan-delay vs wlb-llm "
              f"{c['hydraplan_delay_vs_wlb_llm_end_to_end']:.2f}x [{ok('target_delay_ahead_of_wlb_llm_end_to_end')}]; "
              f"delay per token wlb-llm {c['wlb_delay_iters_per_token']:.2f}, hydraplan-delay "
              f"{c['hydraplan_delay_iters_per_token']:.2f}; exposed sync hydraplan {c['mean_sync_s']['hydraplan']:.3f} s, "
              f"megatron {c['mean_sync_s']['megatron']:.3f} s")
