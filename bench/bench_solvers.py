"""Dispatch and packing solvers: speed at 64 and 1024 GPUs, greedy-vs-ILP gap, packing solver paths.

Inputs are real: h100-llama2-7b, builtin:wikipedia and builtin:prolong, the candidates `propose` gives,
iterations drawn by `sample_iterations`. Writes bench/results/solvers.json.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np

from bench.run import Run
from hydraplan.core.cluster import Cluster, for_gpus
from hydraplan.solve import packing
from hydraplan.solve.dispatch import Infeasible, dispatch
from hydraplan.solve.dispatch_methods import BY_NAME as DISPATCH
from hydraplan.solve.packing import pack
from hydraplan.solve.proposal import propose
from hydraplan.store.datasets import load_dataset, sample_iterations
from hydraplan.store.profiles import load_profile

PROFILE = "h100-llama2-7b"
DATASETS = ("builtin:wikipedia", "builtin:prolong")


def candidates(profile, dataset, gpus: int, tokens: int, context: int, limit: int | None = None) -> list[list]:
    """The proposed candidates' schemes (the first `limit` of them)."""
    view = for_gpus(profile, gpus)
    strategies = propose(Cluster.of(profile, gpus), dataset, context, tokens_per_iter=tokens)
    return [[view.scheme(*p.key) for p in c.pipelines] for c in strategies.candidates[:limit]]


def speed(profile, gpus: int, tokens: int, iterations: int, context: int = 32768) -> dict:
    """Greedy dispatch + packing of every pipeline, for every candidate of every iteration. Times are
    CPU seconds of this (single-threaded) process: the machine is shared, so wall time is also kept."""
    disp_ms, pack_ms, per_iter_s, wall_s, trials, paths, optimal = [], [], [], [], Counter(), Counter(), 0
    n_seq = n_pipes = 0
    for name in DATASETS:
        ds = load_dataset(name, context)
        cands = candidates(profile, ds, gpus, tokens, context)
        for batch in sample_iterations(ds, tokens, iterations, seed=0):
            packing._pack_sorted.cache_clear()  # the cache only helps within an iteration
            n_seq += len(batch.lengths)
            it, w0 = 0.0, time.perf_counter()
            for schemes in cands:
                t0 = time.process_time()
                try:
                    d = dispatch(batch.lengths, schemes)
                except Infeasible:
                    continue
                t1 = time.process_time()
                for j, s in enumerate(schemes):
                    paths[pack(batch.lengths[d.assign == j], s).solver] += 1
                t2 = time.process_time()
                disp_ms.append(1e3 * (t1 - t0))
                pack_ms.append(1e3 * (t2 - t1))
                trials[d.trials] += 1
                optimal += d.optimal
                n_pipes += len(schemes)
                it += t2 - t0
            per_iter_s.append(it)
            wall_s.append(time.perf_counter() - w0)
    return {
        "gpus": gpus, "tokens_per_iter": tokens, "iterations": len(per_iter_s), "candidates": len(cands),
        "mean_sequences": n_seq / len(per_iter_s), "mean_pipelines": n_pipes / max(len(disp_ms), 1),
        "dispatch_ms_mean": float(np.mean(disp_ms)), "dispatch_ms_max": float(np.max(disp_ms)),
        "pack_ms_mean": float(np.mean(pack_ms)), "pack_ms_max": float(np.max(pack_ms)),
        "all_candidates_cpu_s_mean": float(np.mean(per_iter_s)), "all_candidates_cpu_s_max": float(np.max(per_iter_s)),
        "all_candidates_wall_s_mean": float(np.mean(wall_s)),
        "trials_used": {str(k): v for k, v in sorted(trials.items())},
        "dispatch_proven_optimal": optimal / max(len(disp_ms), 1),
        "pack_solver_paths": dict(paths.most_common()),
    }


def gap(profile, context: int, iterations: int, time_limit_s: float, gpus: int = 64, tokens: int = 200_000,
        limit: int | None = None) -> dict:
    """Greedy (Eq. 3 objective) over the ILP's, where the ILP proves optimality."""
    rows = []
    for name in DATASETS:
        ds = load_dataset(name, context)
        cands = candidates(profile, ds, gpus, tokens, context, limit)
        for batch in sample_iterations(ds, tokens, iterations, seed=1):
            for schemes in cands:
                try:
                    t0 = time.perf_counter()
                    g = dispatch(batch.lengths, schemes)
                    t1 = time.perf_counter()
                    i = dispatch(batch.lengths, schemes, method=DISPATCH["ilp"], time_limit_s=time_limit_s)
                    t2 = time.perf_counter()
                except Infeasible:
                    continue
                rows.append({"dataset": name, "greedy": g.cost, "ilp": i.cost, "ilp_proven": i.optimal,
                             "greedy_proven": g.optimal, "ilp_solver": i.solver,
                             "greedy_ms": 1e3 * (t1 - t0), "ilp_s": t2 - t1})
    proven = [r for r in rows if r["ilp_proven"] and not r["greedy_proven"]]
    ratios = np.array([r["greedy"] / r["ilp"] for r in proven]) if proven else np.array([np.nan])
    return {
        "context_len": context, "instances": len(rows),
        "greedy_proven_alone": sum(r["greedy_proven"] for r in rows),
        "ilp_proven_where_needed": len(proven),
        "ilp_not_proven": sum(not r["ilp_proven"] for r in rows),
        "greedy_over_ilp_mean": float(np.mean(ratios)), "greedy_over_ilp_max": float(np.max(ratios)),
        "greedy_equal_ilp_share": float(np.mean(ratios <= 1 + 1e-9)),
        "greedy_beats_unproven_ilp": sum(r["greedy"] < r["ilp"] * (1 - 1e-9) for r in rows if not r["ilp_proven"]),
        "greedy_ms_mean": float(np.mean([r["greedy_ms"] for r in rows])),
        "ilp_s_mean": float(np.mean([r["ilp_s"] for r in rows])),
        "rows": rows,
    }


def pack_quality(profile, gpus: int = 64, per_case: int = 6, mults: tuple[int, ...] = (3, 6, 12)) -> dict:
    """Packing on pipelines with pp > 1 (the proposals here pick pp = 1, whose packing the greedy solves
    exactly): real sequences worth 3, 6 and 12 x UtilLen on pp = 2, 4, 8 schemes. Default settings (ILP
    skipped or stopped within rel_gap 0.1% of the bound) against rel_gap = 0 (ILP to proof or limit)."""
    view = for_gpus(profile, gpus)
    schemes = [view.scheme(*k) for k in ((2, 2, 1), (4, 2, 1), (8, 2, 1), (2, 4, 1), (1, 8, 2))]
    rng = np.random.default_rng(0)
    rows, paths_default, paths_exact = [], Counter(), Counter()
    for name in DATASETS:
        for s in schemes:
            pool = load_dataset(name, min(32768, s.max_len)).lengths
            for mult in mults:
                for _ in range(per_case):
                    draw = rng.choice(pool, size=400)
                    lengths = draw[: int(np.searchsorted(np.cumsum(draw), mult * s.util_len)) + 1]
                    packing._pack_sorted.cache_clear()
                    t0 = time.perf_counter()
                    a = pack(lengths, s)
                    t1 = time.perf_counter()
                    b = pack(lengths, s, rel_gap=0.0)
                    t2 = time.perf_counter()
                    paths_default[a.solver] += 1
                    paths_exact[b.solver] += 1
                    rows.append((a.estimate_s / b.estimate_s - 1, 1 - b.estimate_s / b.warm_start_s,
                                 t1 - t0, t2 - t1, b.optimal, len(lengths)))
    r = np.array(rows, dtype=np.float64)
    return {
        "instances": len(rows), "mean_sequences": float(r[:, 5].mean()),
        "default_over_exact_mean": float(r[:, 0].mean()), "default_over_exact_max": float(r[:, 0].max()),
        "exact_gain_over_warm_start_mean": float(r[:, 1].mean()), "exact_gain_over_warm_start_max": float(r[:, 1].max()),
        "default_ms_mean": 1e3 * float(r[:, 2].mean()), "default_ms_max": 1e3 * float(r[:, 2].max()),
        "exact_ms_mean": 1e3 * float(r[:, 3].mean()), "exact_ms_max": 1e3 * float(r[:, 3].max()),
        "exact_proven_share": float(r[:, 4].mean()),
        "default_solver_paths": dict(paths_default.most_common()),
        "exact_solver_paths": dict(paths_exact.most_common()),
    }


def main(run: Run) -> None:
    profile = load_profile(PROFILE)
    limit = run.pick(None, 2)  # candidates per batch in the ILP gap
    out = {"profile": PROFILE, "datasets": list(DATASETS)}
    out["speed_64"] = speed(profile, 64, 200_000, iterations=run.pick(5, 1))
    out["speed_1024"] = speed(profile, *run.pick((1024, 3_200_000), (128, 400_000)), iterations=run.pick(2, 1))
    out["gap_32k"] = gap(profile, 32768, run.pick(2, 1), run.pick(10.0, 1.0), limit=limit)
    out["gap_8k"] = gap(profile, 8192, run.pick(2, 1), run.pick(10.0, 1.0), limit=limit)
    out["pack_quality"] = pack_quality(profile, per_case=run.pick(6, 1), mults=run.pick((3, 6, 12), (3,)))
    run.write(out)

    print(f"{'CPU time':<22}{'dispatch ms/cand':>18}{'pack ms/cand':>14}{'all cands s/iter':>18}{'(wall)':>8}")
    for k in ("speed_64", "speed_1024"):
        r = out[k]
        print(f"{r['gpus']:>4} GPUs {r['tokens_per_iter']:>9} tok{r['dispatch_ms_mean']:>16.1f}  "
              f"{r['pack_ms_mean']:>12.1f}  {r['all_candidates_cpu_s_mean']:>16.3f}{r['all_candidates_wall_s_mean']:>8.3f}")
    for k in ("gap_32k", "gap_8k"):
        r = out[k]
        print(f"gap ctx {r['context_len']}: {r['instances']} dispatches, greedy proven alone {r['greedy_proven_alone']}, "
              f"ILP proven where needed {r['ilp_proven_where_needed']}: greedy/ILP mean {r['greedy_over_ilp_mean']:.4f} "
              f"max {r['greedy_over_ilp_max']:.4f}; greedy {r['greedy_ms_mean']:.0f} ms vs ILP {r['ilp_s_mean']:.1f} s")
    q = out["pack_quality"]
    print(f"packing pp>1 ({q['instances']} pipelines, {q['mean_sequences']:.0f} seqs): default {q['default_ms_mean']:.1f} ms, "
          f"within {100 * q['default_over_exact_max']:.3f}% of rel_gap=0 ({q['exact_ms_mean']:.0f} ms, proven "
          f"{100 * q['exact_proven_share']:.0f}%); ILP gain over warm start mean "
          f"{100 * q['exact_gain_over_warm_start_mean']:.3f}% "
          f"max {100 * q['exact_gain_over_warm_start_max']:.3f}%")
