"""Long contexts (issue 24): sequence parallelism, activation recomputation and CP across nodes in the plans.

1. MaxLen of the analytic a800-llama2-7b profile at <TP,1,1> (no recomputation) against Hydraulis' 22K,
   46K, 85K and 138K, and the same layouts with selective and full recomputation.
2. `pack --profile h100-llama2-13b --dataset builtin:prolong --gpus 32 --context-len 131072` (1M tokens per
   iteration): the schemes its plans use and their estimate against the static Megatron baseline.
3. `compare` on that configuration, every method with every scheme of the profile (recomputing ones too).
4. `pack --profile h100-llama2-7b --dataset builtin:wikipedia --gpus 1024 --context-len 2097152` (8M tokens per
   iteration) and its `compare` against Megatron (with the CP it needs), WLB-LLM without queues and FlexSP.
5. The runtime's peak memory (`run_plan --memory`, 4 gloo ranks, fp32) against cpu-tiny's memory model, for
   every scheme of the profile in every recomputation mode, micro-batches at MaxLen, each plan run twice (the
   first warms the allocator up; the second is reported).
Figures 2-4 are the canonical cost model's, end to end (propagation plus the exposed LNK pull/push). Iteration
counts are kept small (4 at 32 GPUs, 2 at 1024) so the whole run finishes on a 2-core machine.
Writes bench/results/long.json (`python -m bench.bench_long memory` reruns part 5 alone into it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from hydraplan.app.config import PackConfig
from hydraplan.app.pack import run_pack
from hydraplan.core.hardware import HYDRAULIS_MAX_LEN
from hydraplan.methods.compare import CompareConfig, run_compare
from hydraplan.schema import BatchSeq, Estimate, MicroBatch, Plan, PlanPipeline, Summary
from hydraplan.store.fileio import load_model, write_model
from hydraplan.store.paths import ROOT
from hydraplan.store.profiles import load_profile

RESULTS = Path(__file__).parent / "results" / "long.json"
LONG_13B = {"profile": "h100-llama2-13b", "dataset": "builtin:prolong", "gpus": 32, "context_len": 131072,
            "tokens_per_iter": 1 << 20, "iterations": 4}
MILLION = {"profile": "h100-llama2-7b", "dataset": "builtin:wikipedia", "gpus": 1024, "context_len": 1 << 21,
           "tokens_per_iter": 1 << 23, "iterations": 2}
MILLION_METHODS = ("megatron", "wlb-nodelay", "flexsp", "hydraplan")


def max_len_rows() -> list[dict]:
    prof = load_profile("a800-llama2-7b")
    rows = []
    for tp, ref in HYDRAULIS_MAX_LEN[("a800", "llama2-7b")].items():
        ml = {m: s.max_len for m in ("none", "selective", "full") if (s := prof.scheme(tp, 1, 1, m)) is not None}
        rows.append({"scheme": f"<{tp},1,1>", "hydraulis": ref, "max_len": ml, "deviation": ml["none"] / ref - 1})
    return rows


def pack_run(cfg: dict) -> dict:
    """Plan the configuration with `pack`; the schemes of every plan and the estimates against the baseline."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run_pack(PackConfig(out=Path(tmp), seed=0, workers=1, **cfg))
        wall = time.perf_counter() - t0
        summary = load_model(Summary, Path(tmp) / "summary.json")
        plans = [load_model(Plan, p) for p in sorted(Path(tmp).glob("iter_*.json"))]
    return {
        "wall_s": wall,
        "mean_iteration_s": summary.mean_iteration_s,
        "baseline": summary.baseline,
        "mean_baseline_iteration_s": summary.mean_baseline_iteration_s,
        "speedup_vs_baseline": summary.mean_baseline_iteration_s / summary.mean_iteration_s,
        "plans": [{"iteration": p.iteration, "longest": max(s.length for s in p.batch),
                   "pipelines": dict(Counter(q.label for q in p.pipelines)),
                   "iteration_s": p.estimate.iteration_s} for p in plans],
    }


def compare_run(cfg: dict, methods: tuple[str, ...] | None = None) -> dict:
    t0 = time.perf_counter()
    outcome = run_compare(CompareConfig(seed=0, methods=methods, **cfg))
    wall = time.perf_counter() - t0
    res = outcome.result.methods
    return {
        "wall_s": wall,
        "methods": {n: {"mean_iteration_s": r.mean_iteration_s, "speedup_vs_megatron": r.end_to_end_speedup_vs_megatron,
                        "strategy": Counter(r.strategies).most_common(1)[0][0],
                        "pipelines": {s: r.strategy_labels.get(s, s) for s in dict.fromkeys(r.strategies)},
                        "mean_mfu": float(np.mean(r.mfu))} for n, r in res.items()},
    }


MEMORY_LINE = re.compile(r"^memory: iteration (\d+) rank (\d+) pipeline \d+ (<[^>]+>) stage (\d) largest micro-batch (\d+) "
                         r"tokens: peak ([\d.]+) MiB, model ([\d.]+) MiB, measured/model ([\d.]+)$", re.M)
MEMORY_LAYOUTS = (((2, 1, [0, 1], 1), (1, 2, [2, 3], 2)), tuple((1, 1, [k], 1) for k in range(4)),
                  ((4, 1, [0, 1, 2, 3], 1),), ((2, 2, [0, 1, 2, 3], 2),), ((1, 4, [0, 1, 2, 3], 4),))
"""Pipelines (tp, pp, ranks, micro-batches) on 4 ranks covering every scheme of cpu-tiny; deeper ones stash more."""


def memory_rows() -> list[dict]:
    """`run_plan --memory` on plans whose micro-batches are at cpu-tiny's MaxLen, per recomputation mode."""
    prof = load_profile("cpu-tiny")
    rows = []
    for mode in ("none", "selective", "full"):
        ml = {s.key[:2]: s.max_len for s in prof.schemes if s.recompute == mode}
        with tempfile.TemporaryDirectory() as tmp:
            sid = 0
            for it in range(2 * len(MEMORY_LAYOUTS)):
                pipes, batch = [], []
                for tp, pp, ranks, mbs in MEMORY_LAYOUTS[it // 2]:
                    micro = [MicroBatch(seqs=[sid + m]) for m in range(mbs)]
                    batch += [BatchSeq(id=sid + m, length=ml[(tp, pp)]) for m in range(mbs)]
                    sid += mbs
                    pipes.append(PlanPipeline(tp=tp, pp=pp, cp=1, recompute=mode, ranks=ranks, micro_batches=micro,
                                              estimate_s=0.0))
                write_model(Path(tmp) / f"iter_{it:06d}.json", Plan(iteration=it, profile="cpu-tiny", gpus=4, batch=batch,
                            strategy=mode, pipelines=pipes, estimate=Estimate(propagation_s=0.0)))
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4",
                   str(ROOT / "runtime" / "run_plan.py"), tmp, "--memory"]
            res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), check=True)
        for it, rank, label, stage, tokens, peak, model, ratio in MEMORY_LINE.findall(res.stdout):
            if int(it) % 2:
                rows.append({"mode": mode, "scheme": label, "rank": int(rank), "stage": int(stage), "tokens": int(tokens),
                             "peak_mib": float(peak), "model_mib": float(model), "ratio": float(ratio)})
    return rows


def main(part: str = "all") -> None:
    out = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if part == "all":
        out = {"max_len_a800_llama2_7b": max_len_rows(),
               "long_13b": {"config": LONG_13B, "pack": pack_run(LONG_13B), "compare": compare_run(LONG_13B)},
               "million": {"config": MILLION, "pack": pack_run(MILLION), "compare": compare_run(MILLION, MILLION_METHODS)}}
    out["memory"] = memory_rows()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    ratios = [r["ratio"] for r in out["memory"]]
    print(f"run_plan --memory: {len(ratios)} ranks x modes, measured/model {min(ratios):.3f}-{max(ratios):.3f}")
    if part != "all":
        return
    for r in out["max_len_a800_llama2_7b"]:
        print(f"a800-llama2-7b {r['scheme']}: MaxLen {r['max_len']['none']:,} vs Hydraulis {r['hydraulis']:,} "
              f"({r['deviation']:+.1%}); selective {r['max_len']['selective']:,}, full {r['max_len']['full']:,}")
    for name in ("long_13b", "million"):
        c = out[name]
        print(f"{name}: pack {c['pack']['mean_iteration_s']:.3f} s vs {c['pack']['baseline']} "
              f"{c['pack']['mean_baseline_iteration_s']:.3f} s ({c['pack']['speedup_vs_baseline']:.2f}x)")
        for m, r in c["compare"]["methods"].items():
            print(f"  {m:16s} {r['mean_iteration_s']:8.3f} s  {r['speedup_vs_megatron']:.2f}x  {r['strategy']}")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main(*sys.argv[1:])
