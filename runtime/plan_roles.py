"""Reading plans for replay, checking them against the job, and each rank's role in one (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from hydraplan.core.errors import UserError
from hydraplan.core.memory import rank_memory_bytes
from hydraplan.core.schema import BatchSeq, Estimate, MicroBatch, Plan, PlanPipeline, Profile
from hydraplan.runtime.context_parallel import check_ranges
from hydraplan.runtime.lnk import Role
from hydraplan.runtime.model import ModelConfig, check_layout, stage_param_indices
from hydraplan.store.planfile import read_plan
from hydraplan.store.runfolder import plan_files


def load_plans(path: str | Path, iterations: int | None) -> list[tuple[str, Plan]]:
    """(source, plan) for a plan file, or for a run folder's plan files (JSON or compact) in order, the first
    `iterations`."""
    path = Path(path)
    files = plan_files(path) if path.is_dir() else [path]
    if not files:
        raise UserError(f"{path}: no iter_*.json (or .parquet) plan files in this folder")
    if iterations is not None:
        if iterations > len(files):
            raise UserError(f"--iterations: {iterations} requested but {path} holds {len(files)} plan(s)")
        files = files[:iterations]
    return [(str(f), read_plan(f)) for f in files]


def check_plan(plan: Plan, source: str, world: int, cfg: ModelConfig) -> None:
    """Raise UserError (one line: file, field, value) if this job cannot replay the plan."""
    if plan.gpus != world:
        raise UserError(f"{source}: field gpus: plan is for {plan.gpus} GPUs but WORLD_SIZE is {world}")
    if plan.cad is not None:
        from hydraplan.runtime.cad import check_cad

        if (why := check_cad(plan, source)) is not None:
            raise UserError(why)
    lengths = {s.id: s.length for s in plan.batch}
    used: set[int] = set()
    seen: set[int] = set()
    for i, p in enumerate(plan.pipelines):
        where = f"{source}: field pipelines.{i}"
        if len(p.ranks) != p.tp * p.pp * p.cp:
            raise UserError(f"{where}.ranks: {len(p.ranks)} ranks but tp*pp*cp = {p.tp * p.pp * p.cp}")
        bad = [r for r in p.ranks if not 0 <= r < world or r in seen]
        if bad:
            raise UserError(f"{where}.ranks: rank {bad[0]} is out of range or used by another pipeline")
        seen.update(p.ranks)
        if (why := check_layout(cfg, p.tp, p.pp)) is not None:
            raise UserError(f"{where}: {why}")
        for j, mb in enumerate(p.micro_batches):
            for sid in mb.seqs:
                if sid not in lengths or (sid in used and plan.cad is None):
                    raise UserError(f"{where}.micro_batches.{j}.seqs: sequence id {sid} is not in batch or is used twice")
                used.add(sid)
            if mb.cp_shard is not None and (why := check_ranges(mb.cp_shard.ranges, p.cp,
                                                                 sum(lengths[sid] for sid in mb.seqs))) is not None:
                raise UserError(f"{where}.micro_batches.{j}.cp_shard.ranges: {why}")
    if not used:
        raise UserError(f"{source}: field pipelines: no micro-batches, nothing to train on")


def strategy_key(plan: Plan) -> tuple:
    return tuple((*p.key, tuple(p.ranks)) for p in plan.pipelines)


@dataclass(frozen=True)
class RankRole:
    """Where one rank sits in an iteration: pipeline, stage, TP and CP rank, and its neighbours."""

    pipeline: int
    stage: int
    tp_rank: int
    tp: int
    pp: int
    tp_ranks: tuple[int, ...]  # the stage's ranks at this CP rank, by TP rank
    prev: int | None  # same TP and CP rank on the previous stage
    next: int | None
    cp_rank: int = 0
    cp: int = 1
    cp_ranks: tuple[int, ...] = ()  # the stage's ranks at this TP rank, by CP rank
    recompute: str = "none"  # the pipeline's activation recomputation (runtime/recompute.py)

    def link_role(self, cfg: ModelConfig) -> Role:
        """CP ranks hold the same slices as their TP rank: to LNK they are replicas (lnk.py)."""
        return Role(_stage_params(cfg, self.pp, self.stage), self.tp, self.tp_rank)


@lru_cache(maxsize=4096)
def _stage_params(cfg: ModelConfig, pp: int, stage: int) -> tuple[int, ...]:
    """stage_param_indices, kept: every rank of a 1024-GPU layout asks for one of a few stages' lists."""
    return tuple(stage_param_indices(cfg, pp, stage))


def rank_roles(plan: Plan, world: int) -> list[RankRole | None]:
    """Role of every rank (None: idle this iteration). Rank order of docs/formats.md: ranks[(s*cp + c)*tp + t]."""
    roles: list[RankRole | None] = [None] * world
    for i, p in enumerate(plan.pipelines):
        def at(s: int, c: int, t: int) -> int:
            return p.ranks[(s * p.cp + c) * p.tp + t]

        for s in range(p.pp):
            for c in range(p.cp):
                for t in range(p.tp):
                    roles[at(s, c, t)] = RankRole(
                        pipeline=i, stage=s, tp_rank=t, tp=p.tp, pp=p.pp,
                        tp_ranks=tuple(at(s, c, u) for u in range(p.tp)),
                        prev=at(s - 1, c, t) if s > 0 else None,
                        next=at(s + 1, c, t) if s < p.pp - 1 else None,
                        cp_rank=c, cp=p.cp, cp_ranks=tuple(at(s, d, t) for d in range(p.cp)),
                        recompute=p.recompute,
                    )
    return roles



def largest_micro_batch(plan: Plan, pipeline: int) -> int:
    """Tokens of the pipeline's largest micro-batch (0 without any)."""
    lengths = {s.id: s.length for s in plan.batch}
    return max((sum(lengths[i] for i in mb.seqs) for mb in plan.pipelines[pipeline].micro_batches), default=0)


def rank_model_bytes(plan: Plan, world: int, rank: int, profile: Profile | None, value_bytes: int) -> float | None:
    """The profile's memory model of `rank` under `plan` (its scheme, stage and largest micro-batch;
    hydraplan.core.memory.rank_memory), None for an idle rank or a scheme the profile lacks."""
    role = rank_roles(plan, world)[rank]
    if role is None or profile is None:
        return None
    pipe = plan.pipelines[role.pipeline]
    scheme = profile.scheme(*pipe.key)
    if scheme is None:
        return None
    return rank_memory_bytes(profile, scheme, role.stage, plan.gpus, largest_micro_batch(plan, role.pipeline), value_bytes)


def build_plan(iteration: int, strategy: str, gpus: int, pipes: list[tuple[int, int, int, list[int], list[list[int]]]],
               first_id: int = 0, profile: str = "cpu-tiny") -> Plan:
    """A plan written by hand (hydraplan doctor, tests): pipes are (tp, pp, cp, ranks, micro-batches as lists of
    sequence lengths); sequence ids are numbered from first_id."""
    batch, out, sid = [], [], first_id
    for tp, pp, cp, ranks, mbs in pipes:
        micro = []
        for lengths in mbs:
            micro.append(MicroBatch(seqs=list(range(sid, sid + len(lengths)))))
            batch += [BatchSeq(id=sid + i, length=n) for i, n in enumerate(lengths)]
            sid += len(lengths)
        out.append(PlanPipeline(tp=tp, pp=pp, cp=cp, ranks=ranks, micro_batches=micro, estimate_s=0.0))
    return Plan(iteration=iteration, profile=profile, gpus=gpus, batch=batch, strategy=strategy, pipelines=out,
                estimate=Estimate(propagation_s=0.0))
