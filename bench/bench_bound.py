"""How far `pack`'s plans are from the best any strategy could do: plan / tight any-strategy bound per batch.

The tight bound (planner/solve/bound.py on solve/relaxation.py) is a relaxation of every strategy of N GPUs that
prices pipelines as the cost model does (c per micro-batch, the bubble, the longest sequences whole), so plan /
bound >= 1 and the excess is an upper limit on what a better strategy, dispatch or packing could still win. The
first, looser bound (bench/loose.py) is computed first and is the tight one's floor: both are lower bounds, so
the tight bisection starts there and reports how far it rises above it. Per analytic LLaMA-2 profile (H100 and
A800 x 7B, 13B, 32B: the paper's models, `SWEEP_PROFILES`) x builtin dataset at 64 and 256 GPUs (32K context,
seed 3, 3125 tokens per GPU, the first batch), for both objectives: `pack --objective propagation` against the
propagation bound, and `pack`'s default (`--objective end-to-end`, each scheme's exposed sync) against the
end-to-end bound. The planner is pack's own
(job/planrun.py PlanRun: proposed candidates, `static`, synthesis and local search by default). Also the five
configurations of issue 28 against the better plans found there by hand, and the planning speed of `pack`
(whole process, one worker, bench_scale.measure in a fresh process) at 64, 256 and 1024 GPUs next to the planner
before issue 28's steps on the same batches, measured in the same run (bench/reference.py). Bound probes are
deterministic (node limits, no clock); sweep rows run in parallel, one process per core (CPU seconds are per
process). Writes bench/results/bound.json; `python -m bench bound sweep|long|speed` re-measures one part, keeping the others.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import time
from collections import Counter
from pathlib import Path

import numpy as np

from bench import reference
from bench.loose import loose_bound
from bench.run import Run
from hydraplan.core.cluster import Cluster
from hydraplan.core.hardware import LLAMA2_GPUS
from hydraplan.core.schema import scheme_label
from hydraplan.job.config import RunConfig
from hydraplan.job.planrun import PlanRun
from hydraplan.solve.bound import any_strategy_bound
from hydraplan.store.profiles import load_profile

CONTEXT = 32768
SEED = 3
TOKENS_PER_GPU = 3125  # 200K tokens at 64 GPUs
OBJECTIVES = ("propagation", "end-to-end")
# the sweep's profiles: a fixed set, so that bundling another model or dtype does not multiply the bench's rows
SWEEP_PROFILES = tuple(f"{gpu}-llama2-{size}" for gpu in LLAMA2_GPUS for size in ("7b", "13b", "32b"))
DATASETS = ("builtin:wikipedia", "builtin:prolong")
GPUS = (64, 256)
# issue 28's configurations and the better plan found by hand on the same batch (seconds in the objective)
BETTER = {("h100-llama2-32b", "builtin:wikipedia", 64, "propagation"): 2.021,
          ("a800-llama2-32b", "builtin:wikipedia", 64, "propagation"): 4.688,
          ("h100-llama2-13b", "builtin:wikipedia", 256, "propagation"): 0.739,
          ("h100-llama2-32b", "builtin:prolong", 256, "propagation"): 2.093,
          ("h100-llama2-13b", "builtin:wikipedia", 256, "end-to-end"): 0.810,
          ("h100-llama2-32b", "builtin:prolong", 256, "end-to-end"): 2.133}
# and its 128K row: h100-llama2-7b wikipedia, 1.6M tokens, 64 GPUs, 4 iterations; the pp=1 planner's mean
LONG = {"profile": "h100-llama2-7b", "dataset": "builtin:wikipedia", "gpus": 64, "context": 131072,
        "tokens": 1_600_000, "iterations": 4, "objective": "propagation", "better_mean_s": 2.850}
SPEED = ((64, 200_000), (256, 800_000), (1024, 3_200_000))
SPEED_ITERATIONS = 12  # plans after the first: at 1024 GPUs one batch's plan costs up to 4x another's
REFERENCE = "f697ab4"  # main before issue 28's steps: the planning speed they may not slow at 1024 GPUs
REL_TOL = 5e-3  # the bounds' bisections stop this close (below the least feasible latency: plan / bound errs high)
TARGETS = {"plan_over_bound_max": 1.05, "plan_over_bound_mean": 1.03, "s_per_iter_64": 0.3, "s_per_iter_256": 2.0}


def _short(dataset: str) -> str:
    return dataset.removeprefix("builtin:")


def _strategy(plan) -> str:
    counts = Counter(p.key for p in plan.pipelines)
    return " ".join(f"{scheme_label(k)}x{n}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[0][0], kv[0])))


def case(profile: str, dataset: str, gpus: int, objective: str, *, context: int = CONTEXT,
         tokens: int | None = None, iterations: int = 1, bounds: bool = True) -> dict:
    """pack's plans of the configuration's first `iterations` batches, each with its tight and loose bound
    (`bounds`; without, the plans alone)."""
    prof = load_profile(profile)
    cluster = Cluster.of(prof, gpus, objective)
    context = min(context, max(s.max_len for s in cluster.schemes))
    tokens = tokens or TOKENS_PER_GPU * gpus
    run = PlanRun.prepare(RunConfig(profile=profile, dataset=dataset, gpus=gpus, tokens_per_iter=tokens,
                                    iterations=iterations, context_len=context, seed=SEED, objective=objective), prof)
    schemes = list(cluster.schemes)
    transfer = cluster.scheme_charges_s  # zeros with the propagation objective: nothing charged
    rows = []
    for b in run.batches():
        w0, c0 = time.perf_counter(), time.process_time()
        plan = run.planner.solve(b).plan
        w1, c1 = time.perf_counter(), time.process_time()
        score = cluster.score(plan.estimate.propagation_s, plan.estimate.iteration_s)
        row = {"plan_s": score, "strategy": _strategy(plan), "synthesized": bool(plan.synthesized),
               "plan_cpu_s": c1 - c0, "plan_wall_s": w1 - w0}
        rows.append(row)
        if not bounds:
            continue
        loose = loose_bound(b.lengths, schemes, gpus, transfer=transfer, upper=score, upper_reached=True,
                            rel_tol=REL_TOL)
        c2 = time.process_time()
        tight = any_strategy_bound(b.lengths, schemes, gpus, transfer=transfer, upper=score, upper_reached=True,
                                   floor=loose, rel_tol=REL_TOL).latency_s
        row.update({"tight_bound_s": tight, "loose_bound_s": loose, "plan_over_bound": score / tight,
                    "tight_bound_cpu_s": time.process_time() - c2, "at_loose": tight == loose})
    out = {"id": f"{profile}_{_short(dataset)}_{gpus}_{objective}", "profile": profile, "dataset": dataset,
           "gpus": gpus, "objective": objective, "context_len": context,
           "tokens_per_iter": tokens, "iterations": iterations, "seed": SEED,
           "plan_s_mean": float(np.mean([r["plan_s"] for r in rows])), "batches": rows}
    if bounds:
        ratio = np.array([r["plan_over_bound"] for r in rows])
        out.update({"plan_over_bound_mean": float(ratio.mean()), "plan_over_bound_max": float(ratio.max())})
    key = (profile, dataset, gpus, objective)
    if key in BETTER:
        out["better_plan_s"] = BETTER[key]
    return out


def _row(args: tuple[str, str, int, str, int | None]) -> dict:
    """One sweep row in a pool process (rows are independent; each one's CPU seconds are its own process's)."""
    *key, tokens = args
    return case(*key, tokens=tokens)


def speed(gpus: int, tokens: int, iterations: int, before: Path | None, runs: int = 2) -> dict:
    """`pack`'s defaults in a fresh process (bench_scale.measure): the first plan, then seconds per iteration; and
    the same of the planner at REFERENCE (`before`, its checkout) on the same batches in the same run."""
    keep = ("gpus", "tokens_per_iter", "iterations", "candidates", "first_plan_wall_s", "first_plan_cpu_s",
            "s_per_iter_wall_mean", "s_per_iter_cpu_mean", "s_per_iter_cpu", "mean_estimate_s")
    r = reference.measure(reference.ROOT, gpus, tokens, iterations + 1, runs)
    out = {"id": str(gpus), **{k: r[k] for k in keep}}
    if before is not None:
        b = reference.measure(before, gpus, tokens, iterations + 1, runs)
        out["reference"] = {"commit": REFERENCE, **{k: b[k] for k in ("first_plan_cpu_s", "s_per_iter_cpu_mean",
                                                                      "s_per_iter_cpu", "mean_estimate_s")}}
        out["cpu_over_reference"] = r["s_per_iter_cpu_mean"] / b["s_per_iter_cpu_mean"]
        out["estimate_over_reference"] = r["mean_estimate_s"] / b["mean_estimate_s"]
    return out


def summarize(out: dict) -> None:
    """Per objective over the sweep's rows: the largest and mean plan / tight bound, how far the tight bound rose
    above the loose one it starts from, on how many rows not at all, and the rows of issue 28 as fast as the better
    plan found there."""
    out["summary"] = []
    for objective in OBJECTIVES:
        rows = [c for c in out["cases"] if c["objective"] == objective]
        if rows:
            out["summary"].append({
                "id": objective, "rows": len(rows), "plan_over_bound_max": max(c["plan_over_bound_max"] for c in rows),
                "plan_over_bound_mean": float(np.mean([c["plan_over_bound_mean"] for c in rows])),
                "rows_at_loose": sum(r["at_loose"] for c in rows for r in c["batches"]),
                "tight_over_loose_max": max(r["tight_bound_s"] / r["loose_bound_s"] for c in rows for r in c["batches"])})
    issue = [c for c in out["cases"] if "better_plan_s" in c]
    out["issue_rows_at_least_as_fast"] = sum(c["plan_s_mean"] <= c["better_plan_s"] * (1 + 5e-4) for c in issue)
    out["issue_rows"] = len(issue)
    out["issue_misses"] = len(issue) - out["issue_rows_at_least_as_fast"]


def _sweep() -> list[tuple[str, str, int, str]]:
    """The 24 configurations x both objectives, issue 28's first."""
    every = [(n, d, g, o) for n in SWEEP_PROFILES for g in GPUS for d in DATASETS for o in OBJECTIVES]
    return sorted(every, key=lambda k: k not in BETTER)


SMOKE = [("h100-llama2-7b", "builtin:wikipedia", 16, o) for o in OBJECTIVES]


def main(run: Run) -> None:
    """Everything, or one part: `sweep`, `long` (the 128K row), `speed`; a part keeps the others' results. The
    file is rewritten after every row, so an interrupted run keeps what it measured."""
    parts = list(run.argv) or ["sweep", "long", "speed"]
    if not set(parts) <= {"sweep", "long", "speed"}:
        raise SystemExit(f"bench bound: unknown part {parts} (sweep, long, speed)")
    out = {"cases": [], "long_context": None, "speed": [], "summary": [], "targets": TARGETS}
    if run.argv:
        out.update({k: v for k, v in run.previous().items() if k in out and k != "targets"})
        summarize(out)  # the kept rows' summary and issue-28 counts
    merged = bool(run.argv)
    if "sweep" in parts:
        out["cases"] = []
        keys = run.pick(_sweep(), SMOKE)
        tokens = run.pick(None, 20_000)
        with multiprocessing.get_context("spawn").Pool(run.pick(os.cpu_count() or 1, 1)) as pool:
            rows = pool.imap(_row, [(*key, tokens) for key in keys])  # in order, one row per process at a time
            for c in rows:
                out["cases"].append(c)
                summarize(out)
                run.write(out, merged=merged)
                print(f"{c['id']:45s} plan {c['plan_s_mean']:.3f} s  / tight bound {c['plan_over_bound_max']:.3f}",
                      flush=True)
    if "long" in parts:
        # smoke: the same row's path at 32K (the proposal's length cells, most of its time, grow with the context)
        L = run.pick(LONG, {**LONG, "tokens": 200_000, "iterations": 1, "gpus": 16, "context": 32768})
        c = case(L["profile"], L["dataset"], L["gpus"], L["objective"], context=L["context"], tokens=L["tokens"],
                 iterations=L["iterations"], bounds=False)
        out["long_context"] = {**c, "better_plan_mean_s": L["better_mean_s"]}
        run.write(out, merged=merged)
        print(f"128K: plan mean {c['plan_s_mean']:.3f} s (better plan {L['better_mean_s']:.3f} s)", flush=True)
    if "speed" in parts:
        out["speed"] = []
        before = reference.checkout(REFERENCE)
        if before is None:
            print(f"speed: no commit {REFERENCE} in this clone's history, so no reference figures", flush=True)
        try:
            for gpus, tokens in run.pick(SPEED, ((64, 50_000),)):
                s = speed(gpus, tokens, run.pick(SPEED_ITERATIONS, 1), before, runs=run.pick(2, 1))
                out["speed"].append(s)
                run.write(out, merged=merged)
                print(f"speed {gpus:5d} GPUs  per iteration {s['s_per_iter_cpu_mean']:.3f} s CPU, "
                      f"{s.get('cpu_over_reference', float('nan')):.2f}x the time at {REFERENCE}", flush=True)
        finally:
            if before is not None:
                shutil.rmtree(before, ignore_errors=True)
