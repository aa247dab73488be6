"""The cost model against GPU measurements others published (issue 46): for every point of data/published/*.json, what
hydraplan predicts for it (hydraplan.store.fidelity): an attention kernel's TFLOP/s from its rate
(hydraplan.core.kernelrates), an nccl-tests bus bandwidth from the fabric's protocols (hydraplan.core.collectives), a
training iteration's TFLOP/s per GPU, tokens/s per GPU or MFU (by the source's own FLOP convention) from the analytic
profile generated for that model, GPU, dtype and framework and the iteration's terms (hydraplan.core.iteration: the
canonical estimate in the pipeline formula or the interleaved schedule, the distributed optimizer's traffic as
core.sync hides it, FSDP's per-layer gathers, the optimizer step, FP8 weight casts); Megatron-LM's dynamic-CP benchmark
by Megatron's own schedulers on their executors plus DDP's all-reduce and the optimizer step
(hydraplan.methods.fidelity_dcp). Points left out of the 15% set keep their reason and, where computable, their
prediction (with what it assumes). Prints predicted / published per point and per source; writes
bench/results/fidelity.json (one record per point; the summary: the kept points' statistics per source and class, the
left-out ones' apart, and the dynamic-CP benchmark's speedups). Model arithmetic only, seconds."""

from __future__ import annotations

import numpy as np

from bench.run import Run
from hydraplan.methods.fidelity_dcp import SOURCE as DCP_SOURCE
from hydraplan.methods.fidelity_dcp import predictions, speedups
from hydraplan.store.fidelity import UNITS, Prediction

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
    if p.predicted_as:
        out["predicted_as"] = p.predicted_as
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


def _left_out(preds: list[Prediction]) -> dict:
    """The left-out points: how many, how many carry a prediction, and predicted / published over those."""
    ratios = [p.ratio for p in preds if p.ratio is not None]
    return {"excluded": len(preds), "excluded_predicted": len(ratios),
            **({"excluded_" + k: v for k, v in _stats(ratios).items() if k != "points"} if ratios else {}),
            **({"excluded_ratio_range": [min(ratios), max(ratios)]} if ratios else {})}


def _ms(values: list[float]) -> list[float]:
    return [min(values) * 1e3, max(values) * 1e3]


def _dcp(preds: list[Prediction]) -> dict:
    """Megatron's dynamic-CP benchmark: the speedups of dynamic CP over dp_balanced (published, predicted), and
    the ranges of its iterations measured and predicted, term by term (ms)."""
    rows = [(p.point.value, p.predicted, p.terms) for p in preds if p.source == DCP_SOURCE and p.predicted and p.terms]
    out: dict = {"speedups": [{"id": f"{x.gpus}gpu-{x.statistic}", "gpus": x.gpus, "statistic": x.statistic,
                               "published": x.published, "predicted": x.predicted, "propagation": x.propagation,
                               "published_saved_ms": x.published_saved_s * 1e3,
                               "predicted_saved_ms": x.predicted_saved_s * 1e3} for x in speedups(preds)]}
    if rows:
        out |= {"published_ms": _ms([r[0] for r in rows]), "predicted_ms": _ms([r[1] for r in rows]),
                **{f"{k.removesuffix('_s')}_ms": _ms([r[2][k] for r in rows])
                   for k in ("propagation_s", "dp_sync_s", "optimizer_s")}}
    return out


def main(run: Run) -> None:
    preds = predictions()
    if run.smoke:  # of every source its first two points, its first kept one and its first left out with a prediction
        picked = []
        for s in dict.fromkeys(p.source for p in preds):
            mine = [p for p in preds if p.source == s]
            firsts = [next((p for p in mine if p.excluded is None), None),
                      next((p for p in mine if p.excluded is not None and p.predicted is not None), None)]
            picked += [p for p in mine if p in mine[:2] or p in firsts]
        preds = picked
    records = [record(p) for p in preds]
    kept = [p for p in preds if p.excluded is None]
    out = [p for p in preds if p.excluded is not None]
    sources = []
    for s in dict.fromkeys(p.source for p in preds):
        mine = [p for p in kept if p.source == s]
        sources.append({"id": s, "class": next(p.kind for p in preds if p.source == s),
                        **_left_out([p for p in out if p.source == s]),
                        **(_stats([p.ratio for p in mine]) if mine else {"points": 0})})  # type: ignore[misc]
    classes = {k: _stats([p.ratio for p in kept if p.kind == k]) for k in CLASSES if any(p.kind == k for p in kept)}
    for r in records:
        if r["ratio"] is not None:
            print(f"{r['source']:36s} {r['point']:42s} {r['predicted']:10.4g} {r['published']:10.4g} {r['unit']:18s} "
                  f"{r['ratio']:.3f}" + ("  (left out)" if "excluded" in r else ""))
    for s in sources:
        line = f"{s['id']:36s} {s['class']:10s} {s['points']:3d} points"
        if s["points"]:
            line += f", median {s['median_ratio']:.3f}, {s['min_ratio']:.3f}-{s['max_ratio']:.3f}"
        if s["excluded"]:
            line += f"; {s['excluded']} left out" + (f", predicted {s['excluded_min_ratio']:.2f}-{s['excluded_max_ratio']:.2f}"
                                                      if s["excluded_predicted"] else "")
        print(line)
    dcp = _dcp(preds)
    for x in dcp["speedups"]:
        print(f"dynamic CP over dp_balanced, {x['gpus']:2d} GPUs, {x['statistic']:7s}: published {x['published']:.2f}x, "
              f"predicted {x['predicted']:.2f}x (propagation {x['propagation']:.2f}x)")
    run.write({"bound": BOUND, "points": len(kept), **_left_out(out), "sources": sources, "classes": classes,
               "worst_abs_err": max(c["worst_abs_err"] for c in classes.values()),
               "dcp": dcp, "records": records})
