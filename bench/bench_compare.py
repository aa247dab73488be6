"""hydraplan vs Megatron-LM, HotSPa, WLB-LLM, FlexSP and the Hydraulis ablations (issue 5 targets).

builtin:wikipedia and builtin:prolong on h100-llama2-7b and a800-llama2-13b, 64 GPUs, 32K context,
200K tokens per iteration, the same sampled batches for every method. Per configuration the full
report (compare.json, report.html, PNGs) goes to bench/results/compare/<profile>_<dataset>/, and the
summary with the target checks to bench/results/compare.json:
- hydraplan >= 1.3x over megatron and ahead of every other method in mean estimate: hydraplan (no delay)
  ahead of every method that trains each batch in its own iteration, hydraplan-delay ahead of wlb-llm (both
  delay outliers across iterations; their average delay per token is reported next to each other);
- WLB-LLM imbalance degree near its paper's 1.05 with two queues;
- the 1F1B simulator vs the closed form (they agree exactly for uniform micro-batches, tests/test_compare.py).
a800-llama2-32b (Hydraulis §8.4's case study) runs the same way as an extra configuration.
"""

from __future__ import annotations

import json
import time

import numpy as np

from hydraplan.compare import BASELINE_METHODS, CompareOptions, run_compare
from hydraplan.paths import ROOT
from hydraplan.report import write_report

RESULTS = ROOT / "bench" / "results" / "compare.json"
FIGURES = ROOT / "bench" / "results" / "compare"
PROFILES = ("h100-llama2-7b", "a800-llama2-13b")
EXTRA = ("a800-llama2-32b",)  # Hydraulis §8.4's case study (32B, 64 GPUs, 200K tokens, 32K), beyond the targets
DATASETS = ("builtin:wikipedia", "builtin:prolong")
GPUS, CONTEXT, TOKENS, ITERS, SEED = 64, 32768, 200_000, 30, 0


def main() -> None:
    configs = []
    for profile in PROFILES + EXTRA:
        for dataset in DATASETS:
            t0 = time.perf_counter()
            outcome = run_compare(CompareOptions(profile=profile, dataset=dataset, gpus=GPUS, tokens_per_iter=TOKENS,
                                                 iterations=ITERS, seed=SEED, context_len=CONTEXT))
            wall = time.perf_counter() - t0
            out = FIGURES / f"{profile}_{dataset.replace('builtin:', '')}"
            write_report(outcome, out)
            m = outcome.result.methods
            hydra, hydra_delay = m["hydraplan"].mean_estimate_s, m["hydraplan-delay"].mean_estimate_s
            others = {n: r.mean_estimate_s for n, r in m.items() if n not in ("hydraplan", "hydraplan-delay")}
            undelayed = {n: v for n, v in others.items() if n != "wlb-llm"}
            best_other = min((n for n in others if n in BASELINE_METHODS), key=others.get)
            configs.append({
                "profile": profile, "dataset": dataset, "target_config": profile in PROFILES, "wall_s": wall,
                "report": str(out.relative_to(ROOT)),
                "mean_estimate_s": {n: r.mean_estimate_s for n, r in m.items()},
                "mean_sim_s": {n: r.mean_sim_s for n, r in m.items()},
                "speedup_vs_megatron": {n: r.speedup_vs_megatron for n, r in m.items()},
                "mean_gap": {n: float(np.mean(r.gap)) for n, r in m.items()},
                "mean_mfu": {n: float(np.mean(r.mfu)) for n, r in m.items()},
                "static": {n: run.static for n, run in outcome.runs.items()},
                "wlb_imbalance": float(np.mean(m["wlb-llm"].imbalance)),
                "wlb_delay_iters_per_token": m["wlb-llm"].avg_delay_iters_per_token,
                "hydraplan_delay_iters_per_token": m["hydraplan-delay"].avg_delay_iters_per_token,
                "hydraplan_delay_vs_wlb_llm": others["wlb-llm"] / hydra_delay,
                "sim_vs_closed_max_rel": max(abs(s / e - 1.0) for r in m.values()
                                             for s, e in zip(r.sim_iterations_s, r.iterations_s)),
                "best_baseline": best_other,
                "hydraplan_vs_best_baseline": others[best_other] / hydra,
                "target_1_3x_over_megatron": bool(m["hydraplan"].speedup_vs_megatron >= 1.3),
                "target_ahead_of_every_method": bool(all(min(hydra, hydra_delay) <= v for v in others.values())),
                "target_nodelay_ahead_of_undelayed_methods": bool(all(hydra <= v for v in undelayed.values())),
                "target_delay_ahead_of_wlb_llm": bool(hydra_delay <= others["wlb-llm"]),
            })
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"gpus": GPUS, "context_len": CONTEXT, "tokens_per_iter": TOKENS,
                                   "iterations": ITERS, "seed": SEED, "configs": configs}, indent=1) + "\n")
    methods = list(configs[0]["mean_estimate_s"])
    head = f"{'profile':16s} {'dataset':10s} " + " ".join(f"{n[:11]:>11s}" for n in methods)
    for title, key, fmt in (("mean estimate (s)", "mean_estimate_s", "{:11.3f}"),
                            ("speedup over megatron", "speedup_vs_megatron", "{:10.2f}x")):
        print(title)
        print(head)
        for c in configs:
            print(f"{c['profile']:16s} {c['dataset'].replace('builtin:', ''):10s} "
                  + " ".join(fmt.format(c[key][n]) for n in methods))
    for c in configs:
        print(f"{c['profile']} {c['dataset']}: hydraplan {c['speedup_vs_megatron']['hydraplan']:.2f}x over megatron "
              f"[{'ok' if c['target_1_3x_over_megatron'] else 'MISSED'}], vs best baseline {c['best_baseline']} "
              f"{c['hydraplan_vs_best_baseline']:.2f}x; hydraplan-delay vs wlb-llm {c['hydraplan_delay_vs_wlb_llm']:.2f}x "
              f"[{'ok' if c['target_delay_ahead_of_wlb_llm'] else 'MISSED'}], ahead of every method "
              f"[{'ok' if c['target_ahead_of_every_method'] else 'MISSED'}]; wlb-llm imbalance {c['wlb_imbalance']:.3f}, "
              f"delay per token: wlb-llm {c['wlb_delay_iters_per_token']:.2f}, hydraplan-delay "
              f"{c['hydraplan_delay_iters_per_token']:.2f} it, "
              f"sim vs closed form max {c['sim_vs_closed_max_rel']:.1%}")
    print(f"wrote {RESULTS} and reports under {FIGURES}")


if __name__ == "__main__":
    main()
