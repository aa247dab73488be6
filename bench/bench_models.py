"""The models people train now (issue 41): profiles generated from a Hugging Face config.json (`hydraplan profiles
generate --hf-config`) for Llama-3.1-8B and a Llama-3.1-70B shape (8 K/V heads, 128K vocabulary) on H100, planned
like the LLaMA-2 ones, with h100-llama2-7b on the same configurations next to them.

1. terms: per bundled profile (LLaMA-2 7B and 32B, and every HF-config one), the parameter count, the per-token K/V
   bytes and logits bytes at TP 8, and MaxLen of <8,1,1>, <8,1,8,full> and the longest scheme (N = 64; null: no
   such scheme fits).
2. runs: `pack` (plans checked by `validate`) and `compare` on builtin:prolong at 64 GPUs and 32K context (1M
   tokens per iteration, 2 iterations) and at 512 GPUs and 128K (4M tokens, 1 iteration). FlexSP is left out for
   the 70B: it needs a pp = 1 scheme, and 70B's weights and gradients fit no pp = 1 scheme on 80 GB.
Model arithmetic and planning only, no timing but each run's wall time. Writes bench/results/models.json.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.run import Run
from hydraplan.app.config import PackConfig
from hydraplan.app.pack import run_pack
from hydraplan.app.validate import validate_path
from hydraplan.methods.compare import CompareConfig, run_compare
from hydraplan.store.profiles import bundled_profiles, load_profile

PROFILES = ("h100-llama2-7b", "h100-llama3.1-8b", "h100-llama3.1-70b")
SETTINGS = {"64_32k": {"gpus": 64, "context_len": 32768, "tokens_per_iter": 1 << 20, "iterations": 2},
            "512_128k": {"gpus": 512, "context_len": 131072, "tokens_per_iter": 1 << 22, "iterations": 1}}
METHODS = ("megatron", "wlb-nodelay", "flexsp", "hydraplan")
SMOKE = {"64_32k": {"gpus": 64, "context_len": 16384, "tokens_per_iter": 1 << 17, "iterations": 1},
         "512_128k": {"gpus": 64, "context_len": 32768, "tokens_per_iter": 1 << 17, "iterations": 1}}


def terms() -> list[dict]:
    rows = []
    for path in bundled_profiles():
        p = load_profile(path.stem)
        if p.source != "analytic" or p.gpu.name.startswith("A800") or "13b" in p.name:
            continue
        s, full = p.scheme(8, 1, 1), p.scheme(8, 1, 8, "full")
        tp8 = next(x for x in p.schemes if x.tp == 8)  # K/V bytes per token depend on TP alone
        rows.append({"id": p.name, "profile": p.name, "params": p.model.params, "kv_heads": p.model.kv_heads or p.model.heads,
                     "vocab": p.model.vocab, "kv_bytes_per_token_tp8": tp8.memory.kv_bytes_per_token,
                     "logits_bytes_per_token_tp8": 10 * p.model.vocab / 8,
                     "max_len_8_1_1": s.max_len if s else None, "max_len_8_1_8_full": full.max_len if full else None,
                     "max_len_best": max(x.max_len for x in p.schemes),
                     "best_scheme": max(p.schemes, key=lambda x: x.max_len).label, "schemes": len(p.schemes)})
    return rows


def one_run(profile: str, setting: dict) -> dict:
    cfg = {"profile": profile, "dataset": "builtin:prolong", **setting}
    methods = tuple(m for m in METHODS if not (m == "flexsp" and "70b" in profile))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        summary = run_pack(PackConfig(out=Path(tmp), seed=0, workers=1, **cfg))
        pack_wall = time.perf_counter() - t0
        report = validate_path(Path(tmp), load_profile(profile))
    t0 = time.perf_counter()
    outcome = run_compare(CompareConfig(seed=0, methods=methods, **cfg))
    return {
        "id": profile, "profile": profile, "config": cfg,
        "pack": {"wall_s": pack_wall, "mean_iteration_s": summary.mean_iteration_s, "baseline": summary.baseline,
                 "mean_baseline_iteration_s": summary.mean_baseline_iteration_s,
                 "speedup_vs_baseline": summary.mean_baseline_iteration_s / summary.mean_iteration_s},
        "validate": {"ok": report.ok, "plans": report.plans, "pipelines": report.pipelines,
                     "micro_batches": report.micro_batches, "errors": len(report.errors)},
        "compare": {"wall_s": time.perf_counter() - t0,
                    "methods": [{"id": n, "method": n, "mean_iteration_s": r.mean_iteration_s,
                                 "speedup_vs_megatron": r.end_to_end_speedup_vs_megatron,
                                 "strategy": Counter(r.strategies).most_common(1)[0][0]}
                                for n, r in outcome.result.methods.items()]},
    }


def main(run: Run) -> None:
    settings = run.pick(SETTINGS, SMOKE)
    profiles = run.pick(PROFILES, ("h100-llama3.1-8b",))
    out: dict = {"terms": terms(), "runs": {}}
    for name, setting in settings.items():
        out["runs"][name] = []
        for profile in profiles:
            r = one_run(profile, setting)
            out["runs"][name].append(r)
            print(f"{name} {profile}: pack {r['pack']['mean_iteration_s']:.3f} s vs {r['pack']['baseline']} "
                  f"{r['pack']['mean_baseline_iteration_s']:.3f} s ({r['pack']['speedup_vs_baseline']:.2f}x), validate "
                  f"{'ok' if r['validate']['ok'] else 'FAILED'}; compare " + ", ".join(
                      f"{m['method']} {m['speedup_vs_megatron']:.2f}x" for m in r["compare"]["methods"]), flush=True)
    for t in out["terms"]:
        print(t)
    run.write(out)
