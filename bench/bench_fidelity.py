"""The cost model against GPU measurements others published (issue 46): for every point of data/published/*.json, what
hydraplan predicts for it (hydraplan.store.fidelity): an attention kernel's TFLOP/s from its rate
(hydraplan.core.kernelrates), an nccl-tests bus bandwidth from the fabric's protocols (hydraplan.core.collectives), a
training iteration's TFLOP/s per GPU, tokens/s per GPU or MFU (by the source's own FLOP convention) from the analytic
profile generated for that model, GPU, dtype and framework and the iteration's terms (hydraplan.core.iteration: the
canonical estimate in the pipeline formula or the interleaved schedule, the distributed optimizer's traffic as
core.sync hides it, FSDP's per-layer gathers, the optimizer step, FP8 weight casts). Prints predicted / published per
point and per source; writes bench/results/fidelity.json (one record per point, the excluded ones with the reason).
Model arithmetic only, seconds."""

from __future__ import annotations

import numpy as np

from bench.run import Run
from hydraplan.store.fidelity import UNITS, Prediction, predictions

BOUND = 0.15  # every point within 15% of its published value
CLASSES = ("kernel", "iteration", "collective")


def record(p: Prediction) -> dict:
    c = p.point.config
    out: dict = {"id": f"{p.source}/{p.point.id}", "source": p.source, "point": p.point.id, "class": p.kind,
                 "quantity": p.point.quantity, "unit": UNITS[p.point.quantity], "published": p.point.value,
                 "predicted": p.predicted, "ratio": p.ratio, "where": p.point.where,
                 "read_off_plot": p.point.read_off_plot, "config": c.model_dump(exclude_none=True)}
    if p.excluded:
        out["excluded"] = p.excluded
    if p.scheme_in_profile is not None:
        out["scheme_in_profile"] = p.scheme_in_profile
    if p.terms:
        out["terms_s"] = p.terms
    return out


def _stats(ratios: list[float]) -> dict:
    r = np.asarray(ratios, dtype=np.float64)
    err = np.abs(r - 1)
    return {"points": int(r.size), "median_ratio": float(np.median(r)), "min_ratio": float(r.min()),
            "max_ratio": float(r.max()), "median_abs_err": float(np.median(err)), "worst_abs_err": float(err.max()),
            "within_bound": int((err <= BOUND).sum())}


def main(run: Run) -> None:
    preds = predictions()
    if run.smoke:  # two points of every source
        preds = [p for s in dict.fromkeys(p.source for p in preds) for p in [q for q in preds if q.source == s][:2]]
    records = [record(p) for p in preds]
    kept = [p for p in preds if p.ratio is not None]
    sources = []
    for s in dict.fromkeys(p.source for p in preds):
        mine = [p for p in kept if p.source == s]
        sources.append({"id": s, "class": next(p.kind for p in preds if p.source == s),
                        "excluded": sum(p.source == s and p.excluded is not None for p in preds),
                        **(_stats([p.ratio for p in mine]) if mine else {"points": 0})})  # type: ignore[misc]
    classes = {k: _stats([p.ratio for p in kept if p.kind == k]) for k in CLASSES if any(p.kind == k for p in kept)}
    for r in records:
        if r["ratio"] is not None:
            print(f"{r['source']:36s} {r['point']:42s} {r['predicted']:10.4g} {r['published']:10.4g} {r['unit']:18s} "
                  f"{r['ratio']:.3f}")
    for s in sources:
        if s["points"]:
            print(f"{s['id']:36s} {s['class']:10s} {s['points']:3d} points, median {s['median_ratio']:.3f}, "
                  f"{s['min_ratio']:.3f}-{s['max_ratio']:.3f}" + (f", {s['excluded']} excluded" if s["excluded"] else ""))
    run.write({"bound": BOUND, "points": len(kept), "excluded": len(preds) - len(kept),
               "sources": sources, "classes": classes, "worst_abs_err": max(c["worst_abs_err"] for c in classes.values()),
               "records": records})
