"""The plan file of a core-attention disaggregation result (solve/cad): the replicas as pipelines, the `cad`
section with pieces and tasks, and the end-to-end estimate."""

from __future__ import annotations

from hydraplan.core.schema import BatchSeq, Estimate, MicroBatch, Plan, PlanPipeline, Profile
from hydraplan.core.sync import iteration_estimate
from hydraplan.solve.cad import CADResult


def cad_plan(batch, result: CADResult, view: Profile, profile_name: str, gpus: int) -> Plan:
    """The plan file of a CAD result: pipelines are the replicas (micro-batch v of replica j lists the
    sequences it holds pieces of in step v), `cad` holds pieces and tasks; estimate with the LNK sync term."""
    sec = result.section
    g = sec.tp * sec.pp * sec.cp
    sampled = batch.sampled
    seqs = [BatchSeq(id=int(i), length=int(l), doc=None if batch.docs is None else int(batch.docs[k]),
                     sampled_iteration=None if sampled is None or sampled[k] == batch.iteration else int(sampled[k]))
            for k, (i, l) in enumerate(zip(batch.ids, batch.lengths, strict=True))]
    pipes = []
    for j in range(sec.replicas):
        mbs = [MicroBatch(seqs=list(dict.fromkeys(pc.seq for pc in step.pieces if pc.rank == j))) for step in sec.steps]
        pipes.append(PlanPipeline(tp=sec.tp, pp=sec.pp, cp=sec.cp, ranks=list(range(j * g, (j + 1) * g)),
                                  micro_batches=mbs, estimate_s=result.estimate_s))
    it = iteration_estimate(view, gpus, [p.key for p in pipes], [result.estimate_s] * len(pipes))
    est = Estimate(propagation_s=result.estimate_s, sync_s=it.sync_s, iteration_s=it.iteration_s)
    for p, e in zip(pipes, it.exposed_s, strict=True):
        p.sync_s = e
    return Plan(iteration=batch.iteration, profile=profile_name, gpus=gpus, batch=seqs, strategy="cad",
                pipelines=pipes, estimate=est, cad=sec)
