"""`hydraplan pack` benchmark: planning speed (64 and 1024 GPUs) and plan quality.

Speed is measured with the default end-to-end objective and, in the same run on the same batches, with the
propagation objective, both on the proposed candidates only (no per-batch synthesis): their ratio is what
planning end to end costs. Quality is measured with the propagation objective (the LP bound is a
propagation bound), candidates only, three ways on h100-llama2-7b, 64 GPUs, 32K context, 200K tokens per
iteration:
- against the LP lower bound of the chosen strategy (fractional dispatch, solved with HiGHS);
- greedy dispatch against `--dispatch ilp` where the ILP proves its dispatch optimal;
- against the best static homogeneous strategy with max-length FFD packing (Megatron-style).
Writes bench/results/pack.json.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import highspy
import numpy as np

from bench.run import Run
from hydraplan.app.config import PackConfig
from hydraplan.app.pack import run_pack
from hydraplan.app.validate import validate_path
from hydraplan.core.cluster import Cluster
from hydraplan.core.cost import seq_cost
from hydraplan.engine.candidate import candidate_bound
from hydraplan.engine.planner import Planner
from hydraplan.methods.compare import run_megatron
from hydraplan.methods.hydra import homo_candidate
from hydraplan.schema import Candidate, PipelineSpec, Scheme, Strategies
from hydraplan.solve import milp
from hydraplan.solve.proposal import propose, strategy_label
from hydraplan.store.datasets import load_dataset, sample_iterations
from hydraplan.store.profiles import load_profile

PROFILE = "h100-llama2-7b"
CONTEXT = 32768


def lp_lower_bound(lengths: np.ndarray, schemes: Sequence[Scheme]) -> float:
    """min X over fractional dispatches x_ij (each sequence split over pipelines that can hold it):

    pipeline j:  sum_i x_ij (a l^2 + b l + c l / MaxLen_j) + (pp_j - 1) y_j <= X,  y_j >= x_ij (a l^2 + b l + c)
                 sum_i x_ij (a l^2 + b l) + c + (pp_j - 1) y_j <= X,  y_j >= c   (if pp_j c_j <= floor)
    sequence i:  X >= floor = max_i min_j pp_j (a l^2 + b l + c)     (it must run whole somewhere)

    Every integral dispatch + packing satisfies these with X = its canonical estimate (V_j >= tokens_j /
    MaxLen_j micro-batches, and the longest sequence's micro-batch bounds max_v t(m_v)), so the optimum is
    a lower bound of the best plan of this strategy. The second row is V_j >= 1 (the convex hull of
    V_j >= max(1, ceil(tokens_j / MaxLen_j)) is V_j >= max(1, tokens_j / MaxLen_j)): without it the LP pays
    c * tokens/MaxLen per pipeline, ~0.5 c on a <1,1,1> pipeline holding one micro-batch, 5% of a 64-GPU
    iteration. An empty pipeline satisfies it with y_j = c too, because X >= floor >= pp_j c_j.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n, d = lengths.size, len(schemes)
    w = np.stack([seq_cost(s, lengths) for s in schemes], axis=1)  # n x d
    c = np.array([s.time.c for s in schemes])
    pp = np.array([s.pp for s in schemes])
    ok = lengths[:, None] <= np.array([s.max_len for s in schemes])[None, :]
    pairs_i, pairs_j = np.nonzero(ok)
    nx = pairs_i.size
    ys = np.flatnonzero(pp > 1)
    y_col = {j: nx + k for k, j in enumerate(ys)}
    x_col = nx + len(ys)  # the objective X
    floor = float(np.max(np.min(np.where(ok, pp * (w + c), np.inf), axis=1)))

    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0
    # each sequence fully dispatched
    rows += pairs_i.tolist(); cols += list(range(nx)); vals += [1.0] * nx
    lo += [1.0] * n; hi += [1.0] * n
    r = n
    # pipeline loads
    load = w[pairs_i, pairs_j] + c[pairs_j] * lengths[pairs_i] / np.array([s.max_len for s in schemes])[pairs_j]
    rows += (r + pairs_j).tolist(); cols += list(range(nx)); vals += load.tolist()
    for j in ys:
        rows.append(r + j); cols.append(y_col[j]); vals.append(float(pp[j] - 1))
    rows += [r + j for j in range(d)]; cols += [x_col] * d; vals += [-1.0] * d
    lo += [-highspy.kHighsInf] * d; hi += [0.0] * d
    r += d
    # every pipeline pays c at least once (V_j >= 1)
    once = np.flatnonzero(pp * c <= floor)
    for k, j in enumerate(once):
        mine = np.flatnonzero(pairs_j == j)
        rows += [r + k] * (mine.size + 1); cols += [*mine.tolist(), x_col]; vals += [*w[pairs_i[mine], j], -1.0]
        if j in y_col:
            rows.append(r + k); cols.append(y_col[j]); vals.append(float(pp[j] - 1))
    lo += [-highspy.kHighsInf] * once.size; hi += (-c[once]).tolist()
    r += once.size
    # y_j >= x_ij (w_ij + c_j)
    for k in np.flatnonzero(pp[pairs_j] > 1):
        j = int(pairs_j[k])
        rows += [r, r]; cols += [int(k), y_col[j]]; vals += [float(w[pairs_i[k], j] + c[j]), -1.0]
        lo.append(-highspy.kHighsInf); hi.append(0.0)
        r += 1

    rows_a = np.asarray(rows)
    order = np.argsort(rows_a, kind="stable")
    indptr = np.searchsorted(rows_a[order], np.arange(r + 1))
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = x_col + 1, r
    lp.col_cost_ = np.r_[np.zeros(x_col), 1.0]
    lp.col_lower_ = np.r_[np.zeros(nx), np.where(pp[ys] * c[ys] <= floor, c[ys], 0.0), floor]
    lp.col_upper_ = np.r_[np.ones(nx), np.full(len(ys), highspy.kHighsInf), highspy.kHighsInf]
    lp.row_lower_, lp.row_upper_ = np.array(lo), np.array(hi)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = indptr
    lp.a_matrix_.index_ = np.asarray(cols)[order]
    lp.a_matrix_.value_ = np.asarray(vals, dtype=np.float64)[order]
    h = milp.highs_model()
    h.passModel(lp)
    sol = milp.highs(h, mip=False)
    if sol.status != "optimal" or sol.objective_value is None:
        raise RuntimeError(f"LP bound: HiGHS status {sol.status}")
    return sol.objective_value


def batches_of(dataset: str, gpus_tokens: int, iterations: int, seed: int = 0) -> tuple[object, list]:
    ds = load_dataset(dataset, CONTEXT)
    return ds, sample_iterations(ds, gpus_tokens, iterations, seed)


def speed(gpus: int, tokens: int, iterations: int) -> dict:
    """Single-process CPU seconds per iteration (the per-iteration planning cost), with and without pruning."""
    profile = load_profile(PROFILE)
    ds, batches = batches_of("builtin:wikipedia", tokens, iterations)
    t0 = time.perf_counter()
    strategies = propose(Cluster.of(profile, gpus), ds, CONTEXT, tokens_per_iter=tokens)
    propose_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    by_propagation = propose(Cluster.of(profile, gpus, "propagation"), ds, CONTEXT, tokens_per_iter=tokens)
    propose_propagation_s = time.perf_counter() - t0
    def timed(planner: Planner) -> list[float]:
        """CPU seconds of this process per batch: on a shared machine wall time also counts the other jobs."""
        times = []
        for b in batches:
            t0 = time.process_time()
            planner.solve(b)
            times.append(time.process_time() - t0)
        return times

    planner = Planner(profile, strategies, gpus, context_len=CONTEXT)
    times = timed(planner)
    propagation = timed(Planner(profile, by_propagation, gpus, context_len=CONTEXT, objective="propagation",
                                synthesize=False))
    unpruned = timed(Planner(profile, strategies, gpus, context_len=CONTEXT, prune=False))
    return {
        "id": str(gpus), "gpus": gpus, "tokens_per_iter": tokens, "iterations": iterations,
        "candidates": len(planner.candidates),
        "sequences_per_iter": float(np.mean([b.lengths.size for b in batches])), "propose_s": propose_s,
        "propose_propagation_objective_s": propose_propagation_s,
        "s_per_iter_mean": float(np.mean(times)), "s_per_iter_median": float(np.median(times)),
        "s_per_iter_max": float(np.max(times)), "s_per_iter_mean_without_pruning": float(np.mean(unpruned)),
        "s_per_iter_mean_propagation_objective": float(np.mean(propagation)),
        "end_to_end_over_propagation_objective_time": float(np.mean(times) / np.mean(propagation)),
    }


def pool_throughput(gpus: int, tokens: int, iterations: int, workers: int) -> dict:
    """Wall seconds per iteration of `hydraplan pack` end to end (pool start-up, sampling, writing)."""
    out = Path(tempfile.mkdtemp(prefix="bench_pack_"))
    try:
        t0 = time.perf_counter()
        run_pack(PackConfig(profile=PROFILE, dataset="builtin:wikipedia", gpus=gpus, tokens_per_iter=tokens,
                             iterations=iterations, out=out, context_len=CONTEXT, workers=workers))
        wall = time.perf_counter() - t0
        ok = validate_path(out, load_profile(PROFILE)).ok
    finally:
        shutil.rmtree(out)
    return {"gpus": gpus, "workers": workers, "iterations": iterations, "wall_s_per_iter": wall / iterations,
            "plans_valid": ok}


def quality(dataset: str, iterations: int, ilp_iterations: int, gpus: int = 64, tokens: int = 200_000,
            ilp_limit_s: float = 10.0) -> dict:
    """Dispatch and packing of the proposed candidates (no per-batch synthesis: its strategies are not
    candidates of the ILP check, and bench_bound measures them against any strategy)."""
    profile = load_profile(PROFILE)
    ds, batches = batches_of(dataset, tokens, iterations)
    strategies = propose(Cluster.of(profile, gpus, "propagation"), ds, CONTEXT, tokens_per_iter=tokens)
    greedy = Planner(profile, strategies, gpus, context_len=CONTEXT, prune=False,  # every candidate's estimate
                     objective="propagation", synthesize=False)
    results = [greedy.solve(b) for b in batches]
    est = np.array([r.summary.estimate_s for r in results])
    by_name = {c.name: c for c in greedy.candidates}
    chosen = [by_name[r.plan.strategy] for r in results]
    lb = np.array([lp_lower_bound(b.lengths, c.schemes) for b, c in zip(batches, chosen)])
    floor = np.array([candidate_bound(c, b.lengths) for b, c in zip(batches, chosen)])

    ilp = Planner(profile, strategies, gpus, context_len=CONTEXT, dispatch="ilp", prune=False, objective="propagation",
                  synthesize=False, dispatch_time_limit_s=ilp_limit_s)
    gaps, ilp_s = [], []
    for b, g in zip(batches[:ilp_iterations], results[:ilp_iterations]):
        t0 = time.perf_counter()
        r = ilp.solve(b)
        ilp_s.append(time.perf_counter() - t0)
        gaps += [gc.estimate_s / ic.estimate_s - 1 for gc, ic in zip(g.summary.candidates, r.summary.candidates)
                 if ic.estimate_s is not None and ic.dispatch_optimal]

    # the static baseline, and the same scheme as one more candidate of ours (dispatch + packing on it)
    scheme, static_plans = run_megatron([b.lengths for b in batches], Cluster.of(profile, gpus, "propagation"), CONTEXT)
    static = np.array([p.estimate_s for p in static_plans])
    homo = Strategies(candidates=[homo_candidate(scheme, gpus)])
    homo_est = np.array([Planner(profile, homo, gpus, objective="propagation", synthesize=False).solve(b).summary.estimate_s
                         for b in batches])
    with_homo = np.minimum(est, homo_est)
    hand = Planner(profile, Strategies(candidates=[*strategies.candidates, *hand_candidates(scheme, gpus)]), gpus,
                   objective="propagation", synthesize=False)
    hand_est = np.array([hand.solve(b).summary.estimate_s for b in batches])
    ratio = est / lb
    return {
        "id": dataset.removeprefix("builtin:"), "dataset": dataset, "gpus": gpus, "tokens_per_iter": tokens,
        "context_len": CONTEXT, "iterations": iterations,
        "candidates": {c.name: strategy_label(c) for c in strategies.candidates},
        "chosen": [r.plan.strategy for r in results],
        "mean_estimate_s": float(est.mean()),
        "estimate_over_lp_bound_median": float(np.median(ratio)), "estimate_over_lp_bound_max": float(ratio.max()),
        "estimate_over_lp_bound": np.round(ratio, 4).tolist(),
        "lp_bound_is_longest_sequence_alone": float(np.mean(np.isclose(lb, floor, rtol=1e-6))),
        "ilp_iterations": ilp_iterations, "ilp_time_limit_s": ilp_limit_s,
        "ilp_s_per_iter": float(np.mean(ilp_s)) if ilp_s else None,
        "ilp_proven_candidates": len(gaps),
        "greedy_over_ilp_gap_median": float(np.median(gaps)) if gaps else None,
        "greedy_over_ilp_gap_max": float(np.max(gaps)) if gaps else None,
        "static_scheme": f"{scheme.label}x{gpus // scheme.gpus}", "static_mean_s": float(static.mean()),
        "speedup_vs_static": float(static.mean() / est.mean()),
        "static_scheme_packed_by_us_mean_s": float(homo_est.mean()),
        "speedup_vs_static_with_static_as_candidate": float(static.mean() / with_homo.mean()),
        "speedup_vs_static_with_hand_candidates": float(static.mean() / hand_est.mean()),
    }


def hand_candidates(static: Scheme, gpus: int) -> list[Candidate]:
    """Proposed + static + a few hand-written mixes that give the longest sequences a wide pipeline:
    shows what the selection loop reaches once the candidate set holds such strategies."""
    def p(tp: int, pp: int, cp: int, n: int) -> list[PipelineSpec]:
        return [PipelineSpec(tp=tp, pp=pp, cp=cp)] * n

    mixes = {
        "hand-a": p(8, 1, 2, 1) + p(2, 1, 4, 1) + p(1, 1, 1, 40),
        "hand-b": p(8, 1, 2, 1) + p(2, 1, 2, 4) + p(1, 1, 1, 32),
        "hand-c": p(8, 1, 4, 1) + p(1, 1, 1, 32),
    }
    return [homo_candidate(static, gpus),  # the mixes are written for 64 GPUs (a smoke run has fewer)
            *(Candidate(name=k, pipelines=v) for k, v in mixes.items() if sum(p.gpus for p in v) == gpus)]


def main(run: Run) -> None:
    small = (16, 50_000)  # the smoke run's GPUs and tokens per iteration
    out = {
        "speed": [speed(*run.pick((64, 200_000), small), run.pick(10, 1)),
                  *([] if run.smoke else [speed(1024, 3_200_000, 3)])],
        "pool": [pool_throughput(*run.pick((64, 200_000), small), run.pick(50, 4), workers=os.cpu_count() or 1)],
        "quality": [quality(d, run.pick(20, 1), run.pick(5, 1), *run.pick((64, 200_000), small), run.pick(10.0, 0.5))
                    for d in ("builtin:wikipedia", "builtin:prolong")],
        "targets": {"s_per_iter_64": 0.25, "s_per_iter_1024": 2.0, "estimate_over_lp_bound": 1.05,
                    "greedy_over_ilp_gap": 0.02, "speedup_vs_static": 1.3},
    }
    run.write(out)
    for s in out["speed"]:
        print(f"speed  {s['gpus']:5d} GPUs {s['tokens_per_iter']:>9,d} tok  {s['candidates']:2d} candidates  "
              f"{s['sequences_per_iter']:7.0f} seqs  {s['s_per_iter_mean']:.3f} s/iter (max {s['s_per_iter_max']:.3f}, "
              f"{s['s_per_iter_mean_without_pruning']:.3f} without pruning; propagation objective "
              f"{s['s_per_iter_mean_propagation_objective']:.3f}, ratio {s['end_to_end_over_propagation_objective_time']:.2f})")
    for p in out["pool"]:
        print(f"pool   {p['gpus']:5d} GPUs {p['workers']} workers  {p['wall_s_per_iter']:.3f} s/iter wall  "
              f"valid={p['plans_valid']}")
    for q in out["quality"]:
        gap = q["greedy_over_ilp_gap_median"]
        print(f"quality {q['dataset']:18s} est/LP median {q['estimate_over_lp_bound_median']:.3f} "
              f"(max {q['estimate_over_lp_bound_max']:.3f})  greedy/ilp-1 median "
              f"{'n/a' if gap is None else f'{gap:+.4f}'} over {q['ilp_proven_candidates']} proven  "
              f"{q['speedup_vs_static']:.2f}x vs {q['static_scheme']} "
              f"({q['speedup_vs_static_with_static_as_candidate']:.2f}x with it as a candidate, "
              f"{q['speedup_vs_static_with_hand_candidates']:.2f}x with hand mixes)")
