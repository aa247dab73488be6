"""The bundled analytic LLaMA-2 profiles (hydraplan.core.analytic) as shipped: schemes per profile and their MaxLen range
at the reference job size, and the A800 LLaMA-2 7B profile against Hydraulis' fitted coefficients and published
MaxLen: the time coefficients a, b, c as ratios ours / theirs; MaxLen of the shipped profile (sequence
parallelism and fp32 gradient accumulators, as the runtime) without recomputation against Hydraulis', and with
selective and full recomputation. For every bundled analytic profile, the canonical form's fit error against the stage
model over the lengths each scheme serves (worst and median over its schemes). Small shapes: Megatron's dynamic-CP
benchmark model (12 layers, hidden 2048) on H100, CP 4 against CP 1 at 2K tokens per rank, term by term. Model
arithmetic only, no timing. Writes bench/results/analytic.json.
"""

from __future__ import annotations

import numpy as np

from bench.run import Run
from hydraplan.core.analytic import analytic_scheme
from hydraplan.core.cost import seq_time
from hydraplan.core.hardware import GPUS, MODELS
from hydraplan.store.profiles import bundled_profiles, load_profile, model_by_name
from tests.helpers import HYDRAULIS_MAX_LEN, HYDRAULIS_TIME

PROFILE = "a800-llama2-7b"
SMALL_MODEL, SMALL_CHUNK, SMALL_CP = "megatron-dcp-bench", 2048, 4


def fit_errors(profiles: list) -> list[dict]:
    """Per bundled analytic profile: the worst and median fit error over its schemes, and the worst scheme."""
    out = []
    for p in profiles:
        errs = np.array([s.time.fit_rel_err or 0.0 for s in p.schemes])
        worst = p.schemes[int(errs.argmax())]
        out.append({"id": p.name, "worst": float(errs.max()), "median": float(np.median(errs)),
                    "worst_scheme": worst.label, "exact_share": float(np.mean(errs == 0))})
    return out


def small_shapes() -> dict:
    """CP 4 against CP 1 for the dynamic-CP benchmark's model on H100 (the runtime's framework constants): one
    micro-batch of SMALL_CP x SMALL_CHUNK tokens on CP 4 against the same tokens on one GPU divided by 4 (perfect
    scaling), and each scheme's c term by term."""
    model, gpu = model_by_name(SMALL_MODEL), GPUS["h100"]
    l = SMALL_CP * SMALL_CHUNK
    one, _ = analytic_scheme(gpu, model, 1, 1, 1)
    ring, _ = analytic_scheme(gpu, model, 1, 1, SMALL_CP)
    cp_ms, ideal_ms = seq_time(ring, l) * 1e3, seq_time(one, l) / SMALL_CP * 1e3
    return {"model": SMALL_MODEL, "gpu": "h100", "chunk_tokens": SMALL_CHUNK, "cp": SMALL_CP, "tokens": l,
            "cp_ms": cp_ms, "cp1_over_cp_ms": ideal_ms, "overhead_ms": cp_ms - ideal_ms,
            "speedup": seq_time(one, l) / seq_time(ring, l),
            "c_terms_ms": {k: v * 1e3 for k, v in (ring.time.c_terms or {}).items()},
            "cp1_c_terms_ms": {k: v * 1e3 for k, v in (one.time.c_terms or {}).items()},
            "b_terms_ms": {k: v * l * 1e3 for k, v in (ring.time.b_terms or {}).items()}}


def main(run: Run) -> None:
    profiles = [load_profile(p.stem) for p in bundled_profiles()]
    fits = fit_errors([p for p in profiles if p.source == "analytic"])
    analytic = {p.name: {"schemes": len(p.schemes), "max_len_min": min(s.max_len for s in p.schemes),
                         "max_len_max": max(s.max_len for s in p.schemes), "reference_gpus": p.reference_gpus}
                for p in profiles if p.source == "analytic" and p.model.name in MODELS and p.dtype != "fp8"}  # LLaMA-2 bf16
    ours = load_profile(PROFILE)
    rows = []
    for key in sorted(HYDRAULIS_TIME.keys() | HYDRAULIS_MAX_LEN.keys(), key=lambda k: k[0]):
        s = ours.scheme(*key)
        row: dict = {"id": f"<{key[0]},{key[1]},{key[2]}>", "scheme": f"<{key[0]},{key[1]},{key[2]}>"}
        if key in HYDRAULIS_TIME:
            a, b, c = HYDRAULIS_TIME[key]
            row.update(a_ratio=s.time.a * 1e3 / a, b_ratio=s.time.b * 1e3 / b, c_ratio=s.time.c * 1e3 / c)
        ref = HYDRAULIS_MAX_LEN[key]
        row.update(max_len_shipped=s.max_len, max_len_hydraulis=ref, shipped_over_hydraulis=s.max_len / ref,
                   max_len_selective=ours.scheme(*key, "selective").max_len, max_len_full=ours.scheme(*key, "full").max_len)
        rows.append(row)
    counts = [v["schemes"] for v in analytic.values()]
    coef = [r[f"{x}_ratio"] for r in rows for x in "abc" if f"{x}_ratio" in r]
    run.write({"profiles": analytic, "schemes_min": min(counts), "schemes_max": max(counts),
               "hydraulis_profile": PROFILE, "hydraulis": rows, "coefficient_ratio_range": [min(coef), max(coef)],
               "shipped_max_len_min": min(r["max_len_shipped"] for r in rows),
               "shipped_max_len_max": max(r["max_len_shipped"] for r in rows), "fit": fits,
               "fit_worst": max(f["worst"] for f in fits), "fit_median_max": max(f["median"] for f in fits),
               "small_shapes": small_shapes()})
    for f in fits:
        print(f"{f['id']:24s} fit error worst {f['worst']:.3f} ({f['worst_scheme']}), median {f['median']:.3f}")
    for r in rows:
        print(r)
