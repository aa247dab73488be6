"""The runtime, measured on this machine (tiny model, CPU, fp32, one thread). Writes bench/results/profile.json.

1. Seq1F1B against 1F1B in the executor: a 4-stage pipeline run in one process over 8 packed
   micro-batches of builtin:wikipedia documents (~1K tokens each), K = 1, 2, 4 computation-wise splits.
   Peak activation bytes held by each stage (bytes autograd saved in each split's forward, summed over
   the splits live at once in the executed order) against K = 1, next to the planner's memory factor
   (P - 1 + K) / (K * P) (planner/solve/seqsplit.py), and the pipeline's CPU time (critical path over each
   action's thread CPU time) against K = 1.
2. Packed-micro-batch attention cost: one 1024-token document against 4 x 256 and 16 x 64, forward +
   backward of one layer's attention, with attention.py's CPU fallback (one block-diagonal mask) and the
   executor's per-document attention. The cost model assumes sum(l_i^2): only the latter follows it.
3. End to end (`hydraplan profile` then `profile --check`), all in this run, on 2 and on 4 gloo ranks: measure
   a profile of the tiny model (<1,1,1>, <2,1,1>, <1,2,1>, and <4,1,1> on 4 ranks, plus LNK bandwidth and
   model.params; each point the median of 3 runtime launches), pack 6 iterations of builtin:wikipedia with
   it (context 768, 384 tokens per rank), and replay them as whole iterations (pull + propagate + push +
   step, median of 3 launches) against the plans' end-to-end estimate (iteration_s, docs/formats.md):
   whole-iteration error, and the propagation and sync parts of it.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.run import Run
from hydraplan.app import measure
from hydraplan.app.cmd_profile import CPU_MEMORY_GIB
from hydraplan.core.schedules import schedule_seq1f1b, simulate
from hydraplan.runtime.attention import varlen_attention
from hydraplan.runtime.batches import TokenData
from hydraplan.runtime.model import CONFIGS, StageModule, init_full, load_full, param_specs
from hydraplan.runtime.profile import critical_path
from hydraplan.runtime.seq1f1b import Seq1F1BStage, cached_attention, run_in_process, split_views
from hydraplan.schema import BatchSeq
from hydraplan.solve.seqsplit import computation_splits
from hydraplan.store.datasets import load_dataset
from hydraplan.store.fileio import write_model

P, M, TOKENS = 4, 8, 1024
CFG = CONFIGS["tiny"]


def micro_batches(m: int) -> list[list[int]]:
    """m micro-batches of wikipedia documents (context 512) in sampled order, packed up to TOKENS."""
    lengths = load_dataset("builtin:wikipedia", 512).lengths
    rng = np.random.default_rng(0)
    out, cur = [], []
    for n in rng.choice(lengths, size=4 * m * TOKENS // 64):
        if sum(cur) + n > TOKENS:
            out.append(cur)
            cur = []
            if len(out) == m:
                break
        cur.append(int(n))
    return out


def seq1f1b_vs_1f1b(m: int = M) -> list[dict[str, float]]:
    docs = micro_batches(m)
    data = TokenData(CFG.vocab)
    mbs, sid = [], 0
    for d in docs:
        mbs.append(data.pack([BatchSeq(id=sid + i, length=n) for i, n in enumerate(d)]))
        sid += len(d)
    full = [init_full(s, i, 0, torch.float32) for i, s in enumerate(param_specs(CFG))]
    rows = []
    for K in (1, 1, 2, 4):  # the first K = 1 pass warms up torch's kernels and allocator and is dropped
        splits = [computation_splits(np.array(d), 3e-7, 2e-5, K).bounds.tolist() for d in docs]
        stages = []
        for r in range(P):
            mod = StageModule(CFG, pp=P, stage=r)
            load_full(mod, full)
            stages.append(Seq1F1BStage(mod, mbs, splits, 1.0))
        params = {p.untyped_storage().data_ptr() for st in stages for p in st.module.parameters()}
        saved: dict[tuple[int, int, int], dict[int, int]] = {}
        current: list = [None]

        def before(r, a):
            current[0] = (r, a.mb, a.split) if a.op == "F" else None

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if current[0] is not None and ptr not in params:
                saved.setdefault(current[0], {})[ptr] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            run_in_process(stages, before)
        tl = simulate(schedule_seq1f1b(P, m, K), 1.0, 1.0,
                      act_bytes=lambda r, m, s, c: float(sum(saved.get((r, m, s), {}).values())))
        cpu = critical_path([(r, P, st.cpu_s) for r, st in enumerate(stages)])
        rows.append({"K": K, "peak_bytes_per_stage": tl.peak_live_bytes, "cpu_s": cpu,
                     "planner_memory_factor": (P - 1 + K) / (K * P)})
    rows = rows[1:]
    base = rows[0]
    for row in rows:
        row["peak_vs_1f1b"] = max(row["peak_bytes_per_stage"]) / max(base["peak_bytes_per_stage"])
        row["cpu_vs_1f1b"] = row["cpu_s"] / base["cpu_s"]
    return rows


def attention_cost(runs_per_case: int = 7) -> list[dict[str, float]]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    for docs in ([1024], [256] * 4, [64] * 16):
        T = sum(docs)
        q, k, v = (torch.randn(T, CFG.heads, CFG.head_dim, generator=gen, requires_grad=True) for _ in range(3))
        mb = TokenData(CFG.vocab).pack([BatchSeq(id=i, length=n) for i, n in enumerate(docs)])
        view = split_views(mb, [0, T])[0]
        row: dict[str, float] = {"documents": len(docs)}
        for name, fn in (("varlen_s", lambda: varlen_attention(q, k, v, mb.cu_seqlens, mb.max_seqlen)),
                         ("seq1f1b_cached_s", lambda: cached_attention(q, k, v, view))):
            runs = []
            for i in range(runs_per_case):
                t0 = time.thread_time()
                fn().sum().backward()
                if i:
                    runs.append(time.thread_time() - t0)
            row[name] = statistics.median(runs)
        rows.append(row)
    for row in rows:
        for name in ("varlen_s", "seq1f1b_cached_s"):
            row[name.replace("_s", "_vs_one_doc")] = row[name] / rows[0][name]
    return rows


# (ranks, schemes, pack arguments): 4 gloo ranks on this 2-core machine (two per core: an exchange in flight can
# only progress when compute leaves a core free) and 2 ranks (a core each, as a GPU has its own copy engines)
E2E = {4: ([(1, 1, 1), (2, 1, 1), (1, 2, 1), (4, 1, 1)], "1536"), 2: ([(1, 1, 1), (2, 1, 1), (1, 2, 1)], "768")}
E2E_LAUNCHES, E2E_REPEATS, E2E_ITERATIONS = 3, 5, 6  # launches: separate runtime jobs, their median kept
TARGET_MEAN_REL_ERR = 0.15  # profile --check: mean whole-iteration error
# smoke: half the memory, so each scheme's MaxLen (and the timing grid up to it, O(l^2) attention) is ~0.6x; the
# plans at context 768 still use both schemes and the same measure -> pack -> replay path runs
SMOKE_E2E = {"schemes": [(1, 1, 1), (2, 1, 1)], "launches": 1, "repeats": 1, "iterations": 2,
             "memory_gib": CPU_MEMORY_GIB / 2}


def e2e_pack(ranks: int, iterations: int = E2E_ITERATIONS) -> list[str]:
    return ["--dataset", "builtin:wikipedia", "--gpus", str(ranks), "--tokens-per-iter", E2E[ranks][1], "--context-len",
            "768", "--iterations", str(iterations), "--seed", "1"]


def end_to_end_check(ranks: int, smoke: bool = False) -> dict:
    """Measure a profile on `ranks` ranks, plan with it, replay the plans as whole iterations; `profile --check`."""
    schemes, launches, repeats, iterations, memory_gib = (
        (SMOKE_E2E["schemes"], SMOKE_E2E["launches"], SMOKE_E2E["repeats"], SMOKE_E2E["iterations"],
         SMOKE_E2E["memory_gib"]) if smoke
        else (E2E[ranks][0], E2E_LAUNCHES, E2E_REPEATS, E2E_ITERATIONS, CPU_MEMORY_GIB))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench-tiny.json"
        runs = measure.Runs(model="tiny", device="cpu", clock="cpu", repeats=repeats, launches=launches)
        prof, fits = measure.measure_profile(path.stem, runs, [(*s, "none") for s in schemes], memory_gib * 2**30,
                                             gpus_per_node=ranks)
        write_model(path, prof)
        run = Path(tmp) / "run"
        subprocess.run([str(Path(sys.executable).parent / "hydraplan"), "pack", "--profile", str(path),
                        *e2e_pack(ranks, iterations), "--out", str(run)], check=True, capture_output=True)
        rows = measure.check_plans(str(run), prof, runs)
    return {"id": str(ranks), "ranks": ranks, "launches": launches, "repeats": repeats,
            "profile": {"network": prof.network.model_dump(), "params": prof.model.params,
                        "network_note": prof.notes["network"],
                        "schemes": [{"scheme": s.label, "max_len": s.max_len, **s.time.model_dump(), "r2": f.r2,
                                     "worst_rel_err": f.worst_rel_err} for s, f in zip(prof.schemes, fits)]},
            "pack": " ".join(e2e_pack(ranks, iterations)), **measure.check_summary(rows),
            "iterations": [measure.check_row_json(r) for r in rows]}


def main(run: Run) -> None:
    """All three parts, or with argument `check` only the end-to-end checks (the other parts kept from the file)."""
    part = run.argv[0] if run.argv else None
    if part not in (None, "check"):
        raise SystemExit(f"bench profile: unknown part {part!r} (check)")
    torch.set_num_threads(1)
    checks = [end_to_end_check(r, run.smoke) for r in run.pick((2, 4), (2,))]
    if part == "check":
        out = {**run.previous(), "end_to_end_check": checks}
    else:
        out = {"seq1f1b_vs_1f1b": seq1f1b_vs_1f1b(run.pick(M, 4)), "attention": attention_cost(run.pick(7, 2)),
               "end_to_end_check": checks}
    out["target_mean_rel_err"] = TARGET_MEAN_REL_ERR
    for e in out["end_to_end_check"]:
        e["target_met"] = e["mean_rel_err"] <= TARGET_MEAN_REL_ERR
    run.write(out, merged=part is not None)
    print(f"Seq1F1B in the executor, P={P}, micro-batches of ~{TOKENS} tokens (tiny model, CPU):")
    print("  K  peak act. vs 1F1B  planner factor  CPU time vs 1F1B")
    for r in out["seq1f1b_vs_1f1b"]:
        print(f"  {r['K']}  {r['peak_vs_1f1b']:17.3f}  {r['planner_memory_factor']:14.3f}  {r['cpu_vs_1f1b']:16.3f}")
    print("attention F+B of 1024 packed tokens, relative to one document (the cost model says 1, 1/4, 1/16):")
    print("  documents  varlen_attention  seq1f1b cached_attention")
    for r in out["attention"]:
        print(f"  {r['documents']:9d}  {r['varlen_vs_one_doc']:16.3f}  {r['seq1f1b_cached_vs_one_doc']:24.3f}")
    for e2e in checks:
        print(f"profile --check, end to end on {e2e['ranks']} gloo ranks (measured profile, LNK "
              f"{e2e['profile']['network']['intra_node_GBps']:.4g} GB/s, then pack {e2e['pack']}):")
        print("  iteration  pipelines  estimated s  measured s   error  prop. error  sync error")
        for r in e2e["iterations"]:
            pipes = "+".join(sorted({p["scheme"] for p in r["pipelines"]}))
            print(f"  {r['iteration']:9d}  {pipes:9s}  {r['estimate_s']:11.4f}  {r['measured_s']:10.4f}  {r['err']:+6.1%}  "
                  f"{r['propagation_err']:+11.1%}  {r['sync_err']:+10.1%}")
        print(f"  mean error {e2e['mean_rel_err']:.1%}, worst {e2e['worst_rel_err']:.1%} (iteration "
              f"{e2e['worst_iteration']}); mean share of the measured iteration: propagation "
              f"{e2e['mean_propagation_err']:+.1%}, sync {e2e['mean_sync_err']:+.1%}")
