"""Schedules, Seq1F1B splits and CP sharding: the issue-8 targets, measured. Writes bench/results/pipeline.json.

1. Seq1F1B vs 1F1B at 8 stages, 32 micro-batches, 4 splits (uniform micro-batches): bubble ratio and
   peak live activations (micro-batch equivalents), plus the interleaved variants for reference.
2. The seq1f1b.txt Table 6 trend on a800-llama2-7b <2,8,1> with 24K-token documents: as K grows the
   peak activation memory falls while the per-split overhead c eventually costs throughput.
3. Computation-wise split balance on packed micro-batches of builtin:prolong (target: within 1%).
4. CP sharding (cp = 4) on the same micro-batches: attention imbalance of per-sequence vs per-document
   sharding and what the adaptive choice saves (tile-padded estimate).
5. `pack --seq1f1b auto` through the Planner: canonical vs Seq1F1B estimate, K chosen, planning time.
"""

from __future__ import annotations

import json
import time

import numpy as np

from bench.run import Run
from hydraplan.core.cluster import for_gpus
from hydraplan.core.schedules import build_schedule, fb_split, simulate, unit_timeline
from hydraplan.solve.cpshard import adaptive_shard, attention_work, shard_per_document, shard_per_sequence
from hydraplan.solve.seqsplit import computation_splits, seq1f1b_max_len, split_micro_batches
from hydraplan.store.datasets import load_dataset
from hydraplan.store.profiles import load_profile

P, M, K = 8, 32, 4


def schedules() -> dict[str, dict[str, float]]:
    out = {}
    for name, k, v in (("1f1b", 1, 1), ("seq1f1b", K, 1), ("interleaved", 1, 2), ("seq1f1b-interleaved", K, 2)):
        t0 = time.perf_counter()
        tl = unit_timeline(build_schedule(P, M, k, v, name))
        out[name] = {"latency_T": tl.latency_s, "bubble_ratio": tl.bubble_ratio,
                     "peak_live_micro_batches": max(tl.peak_live_bytes or [0.0]), "simulate_s": time.perf_counter() - t0}
    return out


def table6_trend() -> list[dict[str, float]]:
    scheme = for_gpus(load_profile("a800-llama2-7b"), 64).scheme(2, 8, 1)
    per_token = scheme.memory.act_bytes_per_token / scheme.pp  # one stashed token on one stage
    mbs = [np.array([24_576])] * M
    rows = []
    for k in (1, 2, 4, 8, 16):
        sps = split_micro_batches(scheme, mbs, k)
        times = np.stack([sp.costs for sp in sps]) + scheme.time.c
        toks = np.stack([sp.tokens for sp in sps]).astype(np.float64)
        tl = simulate(build_schedule(P, M, k), *fb_split(times), act_bytes=toks * per_token)
        rows.append({"K": k, "latency_s": tl.latency_s, "tokens_per_s": M * 24_576 / tl.latency_s,
                     "bubble_ratio": tl.bubble_ratio, "peak_activation_gib": max(tl.peak_live_bytes) / 2**30,
                     "first_split_tokens": int(toks[0, 0]), "max_len": seq1f1b_max_len(scheme, k)})
    return rows


def packed_micro_batches(n: int, cap: int = 32_768, seed: int = 0) -> list[np.ndarray]:
    """Documents of builtin:prolong in sampled order, packed greedily up to `cap` tokens."""
    lengths = load_dataset("builtin:prolong", cap).lengths
    rng = np.random.default_rng(seed)
    order = rng.permutation(lengths.size)
    mbs, cur, tot = [], [], 0
    for i in order:
        l = int(lengths[i])
        if tot + l > cap and cur:
            mbs.append(np.array(cur))
            cur, tot = [], 0
            if len(mbs) == n:
                break
        cur.append(l)
        tot += l
    return mbs


def split_balance(mbs: list[np.ndarray]) -> dict[str, float]:
    scheme = for_gpus(load_profile("a800-llama2-7b"), 64).scheme(2, 8, 1)
    worst = {}
    t0 = time.perf_counter()
    for k in (2, 4, 8):
        ratios = [float(sp.costs.max() / sp.costs.min())
                  for sp in (computation_splits(mb, scheme.time.a, scheme.time.b, k, 2) for mb in mbs)]
        worst[f"K{k}_worst_max_over_min"] = max(ratios)
    worst["split_ms_per_micro_batch"] = 1e3 * (time.perf_counter() - t0) / (3 * len(mbs))
    return worst


def cp_sharding(mbs: list[np.ndarray], cp: int = 4) -> dict[str, float]:
    a = for_gpus(load_profile("a800-llama2-7b"), 64).scheme(2, 1, 4).time.a
    seq_imb, doc_imb, picks, saved = [], [], {"per-sequence": 0, "per-document": 0}, []
    t0 = time.perf_counter()
    for mb in mbs:
        ws = attention_work(mb, shard_per_sequence(mb, cp), cp, tile=1)
        wd = attention_work(mb, shard_per_document(mb, cp), cp, tile=1)
        seq_imb.append(ws.max() / ws.mean())
        doc_imb.append(wd.max() / wd.mean())
        pick = adaptive_shard(mb, cp, a)
        picks[pick.strategy] += 1
        per_seq = a * cp * attention_work(mb, shard_per_sequence(mb, cp), cp).max()
        saved.append(1 - pick.max_s / per_seq)
    return {"micro_batches": len(mbs), "per_sequence_imbalance_mean": float(np.mean(seq_imb)),
            "per_sequence_imbalance_max": float(np.max(seq_imb)), "per_document_imbalance_max": float(np.max(doc_imb)),
            "adaptive_picks": picks, "adaptive_attention_saved_vs_per_sequence_mean": float(np.mean(saved)),
            "ms_per_micro_batch": 1e3 * (time.perf_counter() - t0) / len(mbs)}


def pack_with_seq1f1b(iterations: int = 3) -> dict[str, object]:
    """Planner on builtin:prolong, a800-llama2-7b, 16 GPUs as two <2,4,1> pipelines, 200K tokens: at
    16K context both ways are feasible; at 32K only Seq1F1B's raised MaxLen holds the batch."""
    from hydraplan.core.errors import UserError
    from hydraplan.engine.planner import Planner
    from hydraplan.schema import Candidate, PipelineSpec, Strategies
    from hydraplan.store.datasets import sample_iterations

    strategies = Strategies(candidates=[Candidate(name="2x<2,4,1>", pipelines=[PipelineSpec(tp=2, pp=4, cp=1)] * 2)])
    out: dict[str, object] = {}
    for ctx in (16_384, 32_768):
        batches = sample_iterations(load_dataset("builtin:prolong", ctx), 200_000, iterations, seed=0)
        row: dict[str, object] = {}
        for mode in (None, "auto"):
            planner = Planner("a800-llama2-7b", strategies, 16, seq1f1b=mode)
            t0 = time.perf_counter()
            try:
                plans = [planner.plan(b) for b in batches]
            except UserError as e:
                row[str(mode)] = {"infeasible": str(e)}
                continue
            row[str(mode)] = {
                "canonical_mean_s": float(np.mean([p.estimate.propagation_s for p in plans])),
                "seq1f1b_mean_s": None if mode is None else float(np.mean([p.estimate.seq1f1b_estimate_s for p in plans])),
                "K_chosen": None if mode is None else sorted({q.seq1f1b_splits for p in plans for q in p.pipelines}),
                "plan_s_per_iteration": (time.perf_counter() - t0) / iterations,
            }
        out[f"context_{ctx}"] = row
    return out


def main(run: Run) -> None:
    sch = schedules()
    trend = table6_trend()
    mbs = packed_micro_batches(run.pick(200, 20))
    res = {"schedules_P8_M32_K4": sch, "table6_trend_a800_7b_pp8_24k": trend,
           "split_balance_prolong_32k": split_balance(mbs), "cp_sharding_prolong_32k_cp4": cp_sharding(mbs),
           "pack_prolong_16gpus_2x_2_4_1": pack_with_seq1f1b(run.pick(3, 1))}
    one, seq = sch["1f1b"], sch["seq1f1b"]
    res["table6_throughput_k4_over_k1"] = trend[2]["tokens_per_s"] / trend[0]["tokens_per_s"]
    res["split_balance_prolong_32k"]["spread_K4"] = res["split_balance_prolong_32k"]["K4_worst_max_over_min"] - 1
    res["targets"] = {
        "seq1f1b_bubble_lower": seq["bubble_ratio"] < one["bubble_ratio"],
        "peak_live_ratio_seq1f1b_over_1f1b": seq["peak_live_micro_batches"] / one["peak_live_micro_batches"],
        "splits_within_1pct": all(v <= 1.01 for k, v in res["split_balance_prolong_32k"].items() if k.startswith("K")),
    }
    run.write(res)
    print(f"{'schedule':22s} {'latency/T':>9s} {'bubble':>7s} {'peak live (mb)':>14s}")
    for name, r in sch.items():
        print(f"{name:22s} {r['latency_T']:9.3f} {r['bubble_ratio']:7.1%} {r['peak_live_micro_batches']:14.2f}")
    print(f"{'K':>3s} {'latency s':>10s} {'tokens/s':>9s} {'bubble':>7s} {'peak act GiB':>12s} {'MaxLen':>7s}")
    for r in trend:
        print(f"{r['K']:3d} {r['latency_s']:10.3f} {r['tokens_per_s']:9.0f} {r['bubble_ratio']:7.1%} "
              f"{r['peak_activation_gib']:12.1f} {r['max_len']:7d}")
    print("split balance:", res["split_balance_prolong_32k"])
    print("cp sharding:", res["cp_sharding_prolong_32k_cp4"])
    print("pack --seq1f1b:", json.dumps(res["pack_prolong_16gpus_2x_2_4_1"]))
    print("targets:", res["targets"])
