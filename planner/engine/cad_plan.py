"""The plan file of a core-attention disaggregation result (solve.cad): replicas as pipelines, the `cad` section."""

from __future__ import annotations

from hydraplan.core.batch import Batch
from hydraplan.core.cluster import Cluster
from hydraplan.core.schema import Estimate, MicroBatch, Plan, PlanPipeline
from hydraplan.engine.assemble import batch_seqs
from hydraplan.solve.cad import CADResult
from hydraplan.solve.placement import replica_ranks

CAD_CANDIDATE = "cad"


def cad_plan(batch: Batch, result: CADResult, cluster: Cluster) -> Plan:
    """Pipelines are the replicas (micro-batch v of replica j lists the sequences it holds pieces of in step v),
    `cad` holds pieces and tasks; the estimate has the LNK sync term like every plan's."""
    sec = result.section
    g = sec.tp * sec.pp * sec.cp
    pipes = []
    for j in range(sec.replicas):
        mbs = [MicroBatch(seqs=list(dict.fromkeys(pc.seq for pc in step.pieces if pc.rank == j))) for step in sec.steps]
        pipes.append(PlanPipeline(tp=sec.tp, pp=sec.pp, cp=sec.cp, recompute=sec.recompute, ranks=replica_ranks(g, j),
                                  micro_batches=mbs, estimate_s=result.estimate_s))
    it = cluster.estimate([p.key for p in pipes], [result.estimate_s] * len(pipes))
    est = Estimate(propagation_s=result.estimate_s, sync_s=it.sync_s, iteration_s=it.iteration_s)
    for p, e in zip(pipes, it.exposed_s, strict=True):
        p.sync_s = e
    return Plan(iteration=batch.iteration, profile=cluster.name, gpus=cluster.gpus, batch=batch_seqs(batch),
                strategy=CAD_CANDIDATE, pipelines=pipes, estimate=est, cad=sec)
