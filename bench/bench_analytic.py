"""The bundled analytic LLaMA-2 profiles (hydraplan.core.analytic) as shipped: schemes per profile and their MaxLen range
at the reference job size, and the A800 LLaMA-2 7B profile against Hydraulis' fitted coefficients and published
MaxLen: the time coefficients a, b, c as ratios ours / theirs; MaxLen of the shipped profile (sequence
parallelism and fp32 gradient accumulators, as the runtime) without recomputation against Hydraulis', and with
selective and full recomputation. Model arithmetic only, no timing. Writes bench/results/analytic.json.
"""

from __future__ import annotations

from bench.run import Run
from hydraplan.core.hardware import MODELS
from hydraplan.store.profiles import bundled_profiles, load_profile
from tests.helpers import HYDRAULIS_MAX_LEN, HYDRAULIS_TIME

PROFILE = "a800-llama2-7b"


def main(run: Run) -> None:
    profiles = [load_profile(p.stem) for p in bundled_profiles()]
    analytic = {p.name: {"schemes": len(p.schemes), "max_len_min": min(s.max_len for s in p.schemes),
                         "max_len_max": max(s.max_len for s in p.schemes), "reference_gpus": p.reference_gpus}
                for p in profiles if p.source == "analytic" and p.model.name in MODELS}  # LLaMA-2's: bench_models has the rest
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
               "shipped_max_len_max": max(r["max_len_shipped"] for r in rows)})
    for r in rows:
        print(r)
