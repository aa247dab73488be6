"""How far `pack`'s plans are from the best any strategy could do: plan / any-strategy bound per iteration.

The bound (planner/solve/bound.py) is a MILP relaxation over every strategy of N GPUs, so plan / bound >= 1 and the
excess is an upper limit on what a better strategy, dispatch or packing could still win. Per bundled analytic
profile x builtin dataset at 64 and 256 GPUs (32K context, 3125 tokens per GPU, seed 3), for `pack
--objective propagation` (candidates + per-batch synthesis, its default there) and with `--candidates-only`;
end to end, the plans of pack's default (`--objective end-to-end`, candidates only) over the end-to-end bound
(planner/core/sync.py's exposed sync per scheme), next to the propagation plans' end-to-end estimate. The headline
case (h100-llama2-7b, 64 GPUs, 200K tokens) runs more iterations. Speed: seconds per iteration of both paths
on the same batches (one process; the ratio is what to read on a shared machine), at 64 GPUs and at 1024
GPUs / 3.2M tokens. Each bound probe gets PROBE_LIMIT_S of wall time (an open probe counts as feasible, so a
loaded machine can only loosen the bound, never invalidate it). Writes bench/results/bound.json;
`python -m bench bound headline` re-measures the headline cases, `... bound speed` the speed runs, keeping the rest.
"""

from __future__ import annotations

import time

import numpy as np

from bench.run import Run
from hydraplan.core.cluster import Cluster
from hydraplan.core.sync import has_sync_model
from hydraplan.engine.planner import Planner
from hydraplan.solve.bound import any_strategy_bound
from hydraplan.solve.proposal import propose
from hydraplan.store.datasets import load_dataset, sample_iterations
from hydraplan.store.profiles import bundled_profiles, load_profile

CONTEXT = 32768
SEED = 3
TOKENS_PER_GPU = 3125  # 200K tokens at 64 GPUs
HEADLINE = ("h100-llama2-7b", 64)
HEADLINE_ITERATIONS = 8
ITERATIONS = 1
PROBE_LIMIT_S = 10.0  # wall seconds per MILP probe; an open probe counts as feasible, so the bound stays valid
DATASETS = ("builtin:wikipedia", "builtin:prolong")


def end_to_end(cluster: Cluster, plan) -> float:
    return cluster.estimate([p.key for p in plan.pipelines], [p.estimate_s for p in plan.pipelines]).iteration_s


def case(profile_name: str, dataset: str, gpus: int, iterations: int, probe_limit_s: float = PROBE_LIMIT_S) -> dict:
    profile = load_profile(profile_name)
    cluster = Cluster.of(profile, gpus)
    view = cluster.view
    tokens = TOKENS_PER_GPU * gpus
    ds = load_dataset(dataset, CONTEXT)
    context = min(CONTEXT, max(s.max_len for s in view.schemes))
    batches = sample_iterations(ds, tokens, iterations, SEED)
    prop = propose(Cluster.of(profile, gpus, "propagation"), ds, context, tokens_per_iter=tokens)
    paths = {"default": Planner(profile, prop, gpus, context_len=context, objective="propagation"),  # synthesizes
             "candidates_only": Planner(profile, prop, gpus, context_len=context, objective="propagation",
                                        synthesize=False)}
    e2e_planner = Planner(profile, propose(cluster, ds, context, tokens_per_iter=tokens), gpus, context_len=context)
    transfer = np.array([cluster.transfer_s(s.tp, s.pp) for s in view.schemes]) \
        if has_sync_model(profile) else None
    rows: dict[str, list] = {k: [] for k in ("bound_s", "bound_e2e_s", "default_s", "candidates_only_s",
                                             "default_e2e_s", "candidates_only_e2e_s", "default_solve_s",
                                             "candidates_only_solve_s", "synthesized", "e2e_plan_s")}
    for b in batches:
        lengths = np.minimum(b.lengths, context)
        plans = {}
        for name, planner in paths.items():
            t0 = time.perf_counter()
            plans[name] = planner.solve(lengths, b.iteration).plan
            rows[f"{name}_solve_s"].append(time.perf_counter() - t0)
            rows[f"{name}_s"].append(plans[name].estimate.propagation_s)
            rows[f"{name}_e2e_s"].append(end_to_end(cluster, plans[name]))
        rows["synthesized"].append(bool(plans["default"].synthesized))
        best = min(rows["default_s"][-1], rows["candidates_only_s"][-1])
        rows["bound_s"].append(any_strategy_bound(lengths, view.schemes, gpus, upper=best, rel_tol=2e-3,
                                                  time_limit_s=probe_limit_s).latency_s)
        if transfer is not None:
            rows["e2e_plan_s"].append(e2e_planner.solve(lengths, b.iteration).plan.estimate.iteration_s)
            upper = min(rows["e2e_plan_s"][-1], rows["default_e2e_s"][-1])
            rows["bound_e2e_s"].append(any_strategy_bound(lengths, view.schemes, gpus, transfer=transfer, upper=upper,
                                                          rel_tol=2e-3, time_limit_s=probe_limit_s).latency_s)
    out = {"id": f"{profile_name}_{dataset.removeprefix('builtin:')}_{gpus}", "profile": profile_name,
           "dataset": dataset, "gpus": gpus, "tokens_per_iter": tokens, "context_len": context,
           "iterations": iterations, "seed": SEED}
    bound = np.array(rows["bound_s"])
    for name in paths:
        ratio = np.array(rows[f"{name}_s"]) / bound
        out[f"{name}_over_bound"] = np.round(ratio, 4).tolist()
        out[f"{name}_over_bound_mean"] = float(ratio.mean())
        out[f"{name}_over_bound_max"] = float(ratio.max())
        if rows["bound_e2e_s"]:
            e2e = np.array(rows[f"{name}_e2e_s"]) / np.array(rows["bound_e2e_s"])
            out[f"{name}_e2e_over_e2e_bound_mean"] = float(e2e.mean())
            out[f"{name}_e2e_over_e2e_bound_max"] = float(e2e.max())
        out[f"{name}_s_per_iter"] = float(np.mean(rows[f"{name}_solve_s"]))
    if rows["bound_e2e_s"]:  # the end-to-end objective's own plans (pack's default) over the end-to-end bound
        e2e = np.array(rows["e2e_plan_s"]) / np.array(rows["bound_e2e_s"])
        out["e2e_objective_over_e2e_bound"] = np.round(e2e, 4).tolist()
        out["e2e_objective_over_e2e_bound_mean"] = float(e2e.mean())
        out["e2e_objective_over_e2e_bound_max"] = float(e2e.max())
    out["synthesized_iterations"] = int(sum(rows["synthesized"]))
    out["bound_s"] = np.round(bound, 6).tolist()
    return out


def speed(gpus: int, tokens: int, iterations: int) -> dict:
    """Seconds per iteration with and without per-batch synthesis (end-to-end objective) on the same batches, one process."""
    profile = load_profile("h100-llama2-7b")
    ds = load_dataset("builtin:wikipedia", CONTEXT)
    batches = sample_iterations(ds, tokens, iterations, 0)
    strategies = propose(Cluster.of(profile, gpus), ds, CONTEXT, tokens_per_iter=tokens)
    out = {"id": str(gpus), "gpus": gpus, "tokens_per_iter": tokens, "iterations": iterations,
           "candidates": len(strategies.candidates)}
    for name, synth in (("synthesis", True), ("candidates_only", False)):
        planner = Planner(profile, strategies, gpus, context_len=CONTEXT, synthesize=synth)
        t0 = time.perf_counter()
        res = [planner.solve(b).summary for b in batches]
        out[f"{name}_s_per_iter"] = (time.perf_counter() - t0) / iterations
        out[f"{name}_mean_iteration_s"] = float(np.mean([r.iteration_s for r in res]))
        if synth:
            out["synthesized_won"] = sum(r.strategy.startswith("batch:") for r in res)
            out["candidates_held"] = iterations - out["synthesized_won"]
    out["time_ratio"] = out["synthesis_s_per_iter"] / out["candidates_only_s_per_iter"]
    out["synthesis_mean_lower_by"] = 1 - out["synthesis_mean_iteration_s"] / out["candidates_only_mean_iteration_s"]
    return out


SPEED_RUNS = ((64, 200_000, 9), (1024, 3_200_000, 3))
TARGETS = {"plan_over_bound_mean": 1.05, "plan_over_bound_max": 1.20, "s_per_iter_64": 0.3, "s_per_iter_1024": 1.0}


def sweep_summary(cases: list[dict]) -> dict:
    """What the text says of the cases besides the headline: the range of plan / bound, where synthesis won."""
    rest = [c for c in cases if (c["profile"], c["gpus"]) != HEADLINE]
    if not rest:
        return {}
    ratios = [c["default_over_bound_mean"] for c in rest]
    return {"others_over_bound": [min(ratios), max(ratios)],
            "others_synthesis_won": [c["id"] for c in rest if c["synthesized_iterations"]],
            "others_synthesis_lower": [c["id"] for c in rest
                                       if c["default_over_bound_mean"] < c["candidates_only_over_bound_mean"] - 1e-9]}


def _report(c: dict) -> None:
    e2e = c.get("e2e_objective_over_e2e_bound_mean")
    print(f"{c['profile']:16s} {c['dataset']:18s} {c['gpus']:4d} GPUs  plan/bound {c['default_over_bound_mean']:.3f} "
          f"(max {c['default_over_bound_max']:.3f}; candidates only {c['candidates_only_over_bound_mean']:.3f})"
          f"  end to end {'n/a' if e2e is None else f'{e2e:.3f}'}", flush=True)


def main(run: Run) -> None:
    """The headline cases and the speed runs first, then the sweep; the file is rewritten after every case, so
    an interrupted run keeps what it measured. With argument `speed` only the speed runs, with `headline`
    only the headline cases (the other cases kept)."""
    part = run.argv[0] if run.argv else None
    if part not in (None, "headline", "speed"):
        raise SystemExit(f"bench bound: unknown part {part!r} (headline, speed)")
    out = run.previous() if part else {}
    out.update(targets=TARGETS, probe_limit_s=run.pick(PROBE_LIMIT_S, 1.0))
    headline = [(*HEADLINE, d, HEADLINE_ITERATIONS) for d in DATASETS]
    runs = run.pick(headline, [("h100-llama2-7b", 16, "builtin:wikipedia", 1)])
    speeds = run.pick(SPEED_RUNS, ((16, 50_000, 1),))
    if part is None and not run.smoke:
        runs += [(p.stem, g, d, ITERATIONS) for p in bundled_profiles() if load_profile(p.stem).source == "analytic"
                 for g in (64, 256) for d in DATASETS if (p.stem, g) != HEADLINE]
    if part != "speed":
        cases = {c["id"]: c for c in out.get("cases", [])} if part else {}
        for name, gpus, dataset, its in runs:
            c = case(name, dataset, gpus, its, out["probe_limit_s"])
            cases[c["id"]] = c
            out["cases"] = list(cases.values())
            out["sweep"] = sweep_summary(out["cases"])
            run.write(out, merged=part is not None)
            _report(c)
            if part is None and c["id"] == f"{HEADLINE[0]}_{DATASETS[-1].removeprefix('builtin:')}_{HEADLINE[1]}":
                _speeds(run, out, speeds, merged=False)
    if part == "speed" or run.smoke:
        _speeds(run, out, speeds, merged=part is not None)


def _speeds(run: Run, out: dict, speeds, merged: bool) -> None:
    out["speed"] = []
    for args in speeds:
        s = speed(*args)
        out["speed"].append(s)
        print(f"speed {s['gpus']:5d} GPUs  with synthesis {s['synthesis_s_per_iter']:.3f} s/iter  candidates only "
              f"{s['candidates_only_s_per_iter']:.3f} s/iter  (x{s['time_ratio']:.2f})", flush=True)
        run.write(out, merged=merged)
