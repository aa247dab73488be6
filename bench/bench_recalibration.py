"""What the recalibration of the analytic profiles moved (issue 46: physical terms, their constants fitted to
published GPU measurements): the headline figures of README.md and docs/ as they stood at BEFORE, the last commit
with the old profiles, read from that commit's bench/results in git history. The docs' `recalibration` table sets
each beside today's value in bench/results (bench/tables.py), so this file holds the "before" side only and does not
depend on the order the benches run in. Writes bench/results/recalibration.json.
"""

from __future__ import annotations

import json
import subprocess

from bench.docs import Results
from bench.run import Run
from hydraplan.store.paths import ROOT

BEFORE = "8e8153393c930c7b7d61858c3818dda322e68529"
"""The last commit before issue 46's profiles (2026-11-28)."""

# (id, what the figure is, the cost model it uses, its unit (x: a speedup, s: seconds, "": a ratio), results file,
#  selector as the docs' figures write it)
FIGURES: tuple[tuple[str, str, str, str, str, str], ...] = (
    ("compare-megatron", "compare: Megatron's static layout, 7B H100, wikipedia 200K, mean iteration (s)", "end to end", "s",
     "compare",
     "configs/h100-llama2-7b_wikipedia_200K_end-to-end/mean_iteration_s/megatron"),
    ("demo-pack", "demo: `pack`'s plans, mean iteration (s)", "end to end", "s", "demo", "pack_mean_iteration_s"),
    *((f"compare-{d}-{t}", f"compare: hydraplan over Megatron, 7B H100, {d} {t}", "end to end", "x", "compare",
       f"configs/h100-llama2-7b_{d}_{t}_end-to-end/end_to_end_speedup_vs_megatron/hydraplan")
      for t in ("200K", "1600K") for d in ("wikipedia", "prolong")),
    ("compare-delay-wikipedia-200K", "compare: hydraplan-delay over Megatron, 7B H100, wikipedia 200K", "end to end",
     "x", "compare", "configs/h100-llama2-7b_wikipedia_200K_end-to-end/end_to_end_speedup_vs_megatron/hydraplan-delay"),
    ("compare-wlb-wikipedia-200K", "compare: WLB-LLM over Megatron, 7B H100, wikipedia 200K", "end to end", "x",
     "compare", "configs/h100-llama2-7b_wikipedia_200K_end-to-end/end_to_end_speedup_vs_megatron/wlb-llm"),
    ("long-13b", "long: `pack` over Megatron, 13B at 128K on 32 H100s", "end to end", "x", "long",
     "long_13b/pack/speedup_vs_baseline"),
    ("long-2m", "long: `pack` over Megatron, 7B at 2M on 1,024", "end to end", "x", "long", "million/pack/speedup_vs_baseline"),
    ("long-2m-megatron", "long: Megatron's static layout, 7B at 2M on 1,024, mean iteration (s)", "end to end", "s", "long",
     "million/pack/mean_baseline_iteration_s"),
    ("long-2m-pack", "long: `pack`'s plans, 7B at 2M on 1,024, mean iteration (s)", "end to end", "s", "long",
     "million/pack/mean_iteration_s"),
    ("models-8b", "models: `pack` over Megatron, Llama 3.1 8B, 64 GPUs, 32K", "end to end", "x", "models",
     "runs/64_32k/h100-llama3.1-8b/pack/speedup_vs_baseline"),
    ("models-70b", "models: `pack` over Megatron, Llama 3.1 70B, 64 GPUs, 32K", "end to end", "x", "models",
     "runs/64_32k/h100-llama3.1-70b/pack/speedup_vs_baseline"),
    ("megatron-hcp", "megatron: hybrid CP plugin over Megatron's scheduler, wikipedia 32K", "propagation", "x", "megatron",
     "hybrid_cp/wikipedia-32k/speedup_best_tp"),
    ("bound-max", "bound: plan / tight any-strategy bound, worst row", "both", "", "bound",
     "max(summary/*/plan_over_bound_max)"),
    ("scale-8192", "scale: modeled iteration at 8192 GPUs (s)", "end to end", "s", "scale", "runs/8192/mean_estimate_s"),
)


def _old(name: str) -> dict | None:
    """bench/results/NAME.json at BEFORE, None when the history lacks it (a shallow clone, an archive)."""
    res = subprocess.run(["git", "-C", str(ROOT), "show", f"{BEFORE}:bench/results/{name}.json"], capture_output=True,
                         text=True)
    return json.loads(res.stdout) if res.returncode == 0 else None


def main(run: Run) -> None:
    found = {name: _old(name) for name in {f for *_, f, _ in FIGURES}}
    if not all(found.values()):
        if not run.smoke:
            raise SystemExit(f"bench recalibration: the git history lacks commit {BEFORE} (a shallow clone?)")
        run.write({"before_commit": BEFORE, "figures": []})
        return
    old = Results.of(found)  # type: ignore[arg-type]  # every value is a file, checked above
    rows = [{"id": i, "figure": what, "model": model, "unit": unit, "file": f, "selector": sel,
             "before": old.select(f, sel)} for i, what, model, unit, f, sel in FIGURES]
    run.write({"before_commit": BEFORE, "figures": rows})
