"""Measure the cost model on this machine: T(l, P) and activation memory of one scheme <tp, pp, cp> with one
activation recomputation mode, LNK pull/push times (the network), or whole training iterations of a run's plans
(`hydraplan profile` launches it; it writes JSON).

    torchrun --nproc-per-node TP*PP*CP runtime/profile.py --tp TP --pp PP --cp CP --recompute MODE --model tiny
             --capacity-bytes B --out m.json
    torchrun --nproc-per-node N     runtime/profile.py --network 1,1 --network 2,1 --model tiny --out n.json
    torchrun --nproc-per-node G     runtime/profile.py --check PLAN_DIR --model tiny --out c.json
(one rank: plain `python runtime/profile.py ...`). CUDA (NCCL, bf16 by default) when present, else CPU (gloo,
fp32); every second and byte is read through the device seam (runtime/device.py).

How time is measured. Each point is a training step of the runtime (Replayer.step, as run_plan and --check
run it: layer groups pulled ahead of use, gradients accumulated in fp32 and pushed per layer group, so T(l)
carries that per-action work too) of one pipeline of the scheme over all ranks, its micro-batches through
the Seq1F1B executor (runtime/seq1f1b.py; K = 1 is 1F1B) with real TP all-reduces, CP K/V gathers
(per-sequence shards) and p2p. Its attention works per document (sum of l^2, like the GPU varlen kernels).
Two clocks:
- wall (GPUs, dedicated machines): the step's propagation between barriers, minus its waits on pulls;
- cpu (default on CPU): every rank records the thread CPU seconds of each forward and backward action, a
  stage's action takes the longest of its TP and CP ranks, and the run's latency is the critical path of the
  executed schedule over those durations (hydraplan.core.schedules.simulate, no p2p latency). On a CPU shared
  with other jobs (or with more ranks than cores) wall time measures the neighbours; CPU time much less.
After `warmup` unrecorded runs the median of `repeats` is kept. A scheme's point is the latency of M = pp
identical micro-batches divided by M + pp - 1: the canonical estimate's T(m) for uniform micro-batches.
--network times runtime/lnk.py's own pull and push for homogeneous <tp, pp> layouts over all ranks (the
real pieces and all_to_all_single, at the real slice sizes), wall time between barriers.
--check replays whole iterations of every plan (iteration_phases) through the runtime's own step (pull
overlapped with the forward, push with the last backward); on the cpu clock propagation is each
pipeline's critical path over thread CPU time, plus the step's exposed LNK waits and optimizer step.

How memory is measured. Activation bytes of one micro-batch on a stage (on a CP rank: its share) are the bytes its
forward leaves allocated for the backward (what autograd saves, or under recomputation only what the layers keep,
and its output) plus its input, and its peak bytes the most bytes its forward and backward add at once (recomputed
layers included; Device.memory_in_use and Device.peak_memory: the C allocator's statistics sampled after every torch
op on CPU, runtime/memstats.py; memory_allocated and max_memory_allocated on CUDA; the parameter gradients left
behind excluded), at a few lengths; fixed bytes are the stage's weights (compute dtype) and gradient accumulators
(master dtype), its 1/N share of the fp32 master weights, the two AdamW states and the owner gradient, and LNK's
in-flight buffers (hydraplan.core.memory.lnk_terms, also recorded apart as lnk_bytes).
hydraplan.core.memory turns them into MaxLen.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    # As a script this folder would come first on sys.path and this file would shadow the standard
    # library's `profile`; drop it and import the installed package hydraplan.runtime.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]

import argparse
import json
import statistics
import time
from datetime import timedelta
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from hydraplan.core.errors import UserError
from hydraplan.core.fit import time_grid
from hydraplan.core.memory import MEMORY_LENGTHS, StageMemory, lnk_terms, scheme_max_len
from hydraplan.core.schedules import schedule_seq1f1b, simulate
from hydraplan.core.schema import BatchSeq, Estimate, MicroBatch, ModelInfo, Plan, PlanPipeline
from hydraplan.runtime import device as devices
from hydraplan.runtime import faults, hf, lnk, lnk_streams, memstats
from hydraplan.runtime.batches import PackedBatch, TokenData
from hydraplan.runtime.context_parallel import CPShards
from hydraplan.runtime.device import DTYPES, Device
from hydraplan.runtime.memstats import map_large_allocations
from hydraplan.runtime.model import ModelConfig, StageModule, TPGroup, init_full, load_full, param_specs
from hydraplan.runtime.optim import ShardedMaster, master_dtype
from hydraplan.runtime.plan_roles import rank_roles
from hydraplan.runtime.recompute import MODES
from hydraplan.runtime.replay import Replayer, StepStats

STATE_BYTES_PER_PARAM = 12  # fp32 master weight + AdamW exp_avg + exp_avg_sq, sharded over all N GPUs
MEMORY_REFITS = 3  # lengths measured beyond MEMORY_LENGTHS, each at the MaxLen of the fit before
MEMORY_SETTLED = 0.05  # a MaxLen this close above the longest length measured needs no further one


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--cp", type=int, default=1)
    ap.add_argument("--recompute", choices=MODES, default="none", help="activation recomputation of the measured scheme")
    ap.add_argument("--check", default=None, help="plan folder (or file) to replay as whole iterations")
    ap.add_argument("--network", action="append", default=None, metavar="TP,PP",
                    help="time LNK pull/push of a homogeneous <TP,PP> layout over all ranks (repeat for several)")
    ap.add_argument("--model", default="tiny", help="a runtime model config, or a Hugging Face config.json (its path)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="wall", help="see the module docstring")
    ap.add_argument("--capacity-bytes", type=float, default=2**30, help="usable memory per device for MaxLen")
    ap.add_argument("--reference-gpus", type=int, default=4, help="N sharing the optimizer states")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout-s", type=float, default=300.0)
    return ap.parse_args(argv)


def _pair(text: str) -> tuple[int, int]:
    tp, pp = (int(x) for x in text.split(","))
    return tp, pp


def replayed_pipeline(replayer: Replayer, plan: Plan, args: argparse.Namespace) -> list[float]:
    """Propagation of `plan`'s one pipeline as run_plan replays it (Replayer.step: layer groups pulled ahead, fp32
    gradient accumulation, per-layer push: the per-action work `--check` and training pay too), `repeats` runs
    after `warmup`, the same list on every rank (collective). Clock "cpu": the critical path over thread CPU
    seconds per action; "wall": the step's propagation minus its waits on pulls (LNK is the sync model's)."""
    out = []
    for i in range(args.warmup + args.repeats):
        ph = iteration_phases(replayer, plan, args.clock)
        if i >= args.warmup:
            out.append(ph.per_pipeline[0] if args.clock == "cpu" else ph.propagate_s - ph.pull_wait_s)
    return out


def critical_path(stages: list[tuple[int, int, dict[tuple[str, int, int], float]]]) -> float:
    """Latency of the executed Seq1F1B schedule from each rank's (stage, pp, CPU seconds per action); a
    stage's action lasts as long as on its slowest TP or CP rank."""
    pp = stages[0][1]
    per: list[dict[tuple[str, int, int], float]] = [{} for _ in range(pp)]
    for stage, _, secs in stages:
        for key, t in secs.items():
            per[stage][key] = max(per[stage].get(key, 0.0), t)
    M = 1 + max(m for _, m, _ in per[0])
    K = 1 + max(s for _, _, s in per[0])
    return simulate(schedule_seq1f1b(pp, M, K), lambda r, m, s, c: per[r][("F", m, s)],
                    lambda r, m, s, c: per[r][("B", m, s)]).latency_s


def _replay_batch(mb: PackedBatch, cp: CPShards | None) -> PackedBatch:
    """The micro-batch as the replay runs it without splits (runtime/replay.py: 1F1B, a CP rank on its share)."""
    return mb if cp is None else cp.split(0, mb, [0, mb.num_tokens])[0]


def held_bytes(module: StageModule, x: torch.Tensor | None, mb: PackedBatch, cp: CPShards | None, dev: Device) -> int:
    """Bytes a micro-batch waiting for its backward holds on the stage (on its CP share of `mb`) as the replay
    runs it: the bytes its forward leaves allocated (what autograd saves, or under recomputation what the
    layers keep, and its output), plus its input, which the executor keeps for the backward. Counted on the heap,
    not through saved-tensor hooks, because a recomputed layer keeps its input outside them. Collective over TP
    and CP."""
    memstats.collect()
    dist.barrier()
    start = dev.memory_in_use()
    y = module(x, _replay_batch(mb, cp))
    held = dev.memory_in_use() - start
    del y
    return held + (0 if x is None else x.numel() * x.element_size())


def peak_bytes(module: StageModule, x: torch.Tensor | None, mb: PackedBatch, cp: CPShards | None, dev: Device) -> int:
    """Most bytes one forward and backward of the stage on `mb` add at once, as the replay runs them (saved
    activations plus the backward's working set; Device.peak_memory), the parameter gradients it leaves excluded
    (fixed bytes count them), plus its input: the executor holds the received activations from before the forward
    to the end of the backward, as held_bytes counts them for a waiting micro-batch. Collective over TP and CP."""
    module.zero_grad(set_to_none=True)
    memstats.collect()
    dist.barrier()
    with dev.peak_memory() as reading:
        y = module(x, _replay_batch(mb, cp))
        torch.autograd.backward(y, None if module.last else torch.ones_like(y))
    grads = sum(p.grad.numel() * p.grad.element_size() for p in module.parameters() if p.grad is not None)
    module.zero_grad(set_to_none=True)
    return reading.peak - reading.start - grads + (0 if x is None else x.numel() * x.element_size())


def _synthetic(data: TokenData, lengths: list[int], first_id: int, dev: Device) -> PackedBatch:
    return data.pack([BatchSeq(id=first_id + i, length=n) for i, n in enumerate(lengths)], dev)


def measure_scheme(cfg: ModelConfig, tp: int, pp: int, cp: int, args: argparse.Namespace, dev: Device) -> dict | None:
    """Memory then time of <tp, pp, cp> with recomputation `args.recompute` on this job's tp*pp*cp ranks (in the
    rank order of docs/formats.md); the result on rank 0 (None elsewhere)."""
    from hydraplan.runtime.groups import GroupCache

    map_large_allocations()  # stable allocator statistics for peak_bytes (runtime/memstats.py)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != tp * pp * cp:
        raise UserError(f"--tp {tp} --pp {pp} --cp {cp} needs {tp * pp * cp} ranks but WORLD_SIZE is {world}")
    dtype = DTYPES[args.dtype]
    layout = Plan(iteration=0, profile="", gpus=world, batch=[], strategy="", estimate=Estimate(propagation_s=0.0),
                  pipelines=[PlanPipeline(tp=tp, pp=pp, cp=cp, recompute=args.recompute, ranks=list(range(world)),
                                          micro_batches=[], estimate_s=0.0)])
    groups = GroupCache(timedelta(seconds=args.timeout_s))
    groups.ensure(layout)
    role = rank_roles(layout, world)[rank]
    stage = role.stage
    device = dev.torch
    module = StageModule(cfg, pp=pp, stage=stage, tp=TPGroup(groups.get(role.tp_ranks) if tp > 1 else None, tp, role.tp_rank),
                         dtype=dtype, device=device, recompute=args.recompute)
    load_full(module, [init_full(s, i, 0, dtype) for i, s in enumerate(param_specs(cfg))], tp, role.tp_rank)
    data = TokenData(cfg.vocab)

    def shares(mbs: list[PackedBatch]) -> CPShards | None:
        """This rank's per-sequence CP shares of synthetic micro-batches (None without CP)."""
        return None if cp == 1 else CPShards.of(mbs, [None] * len(mbs), role.cp_rank, role.cp_ranks,
                                                groups.get(role.cp_ranks))

    gen = torch.Generator().manual_seed(rank)

    def measure(n: int, module: StageModule = module) -> tuple[int, int]:
        """(held, peak) bytes of one micro-batch holding one sequence of n tokens."""
        mb = _synthetic(data, [n], 0, dev)
        share = shares([mb])
        local = n if share is None else sum(e - s for s, e in share.ranges[0][role.cp_rank])
        rows = module.tp.rows(local)  # this TP rank's sequence-parallel rows of its CP share
        x = None if module.first else torch.randn(rows, cfg.hidden, generator=gen, dtype=dtype).to(device).requires_grad_()
        saved = held_bytes(module, x, mb, share, dev)
        return saved, peak_bytes(module, x if x is None else x.detach().requires_grad_(), mb, share, dev)

    measure(MEMORY_LENGTHS[0])  # warms the allocator up
    lengths = list(MEMORY_LENGTHS)
    act, peak = (list(x) for x in zip(*map(measure, lengths), strict=True))
    stage_params = sum(p.numel() for p in module.parameters())
    total_params = sum(s.numel for s in param_specs(cfg))
    mdt = master_dtype(dtype)
    info = ModelInfo(name=cfg.name, layers=cfg.layers, hidden=cfg.hidden, ffn=cfg.ffn, heads=cfg.heads, vocab=cfg.vocab,
                     params=total_params)
    lnk_bytes = sum(t.bytes for t in lnk_terms(info, tp, pp, stage, dtype.itemsize))
    fixed = (stage_params * (dtype.itemsize + mdt.itemsize) + lnk_bytes
             + (STATE_BYTES_PER_PARAM + mdt.itemsize) * total_params / args.reference_gpus)
    mems: list[StageMemory | None] = [None] * world
    for refit in range(MEMORY_REFITS + 1):
        mem = StageMemory(stage=stage, fixed_bytes=fixed, stash=pp - stage, lengths=list(lengths), act_bytes=list(act),
                          peak_bytes=list(peak), lnk_bytes=lnk_bytes)
        dist.all_gather_object(mems, mem)
        max_len = scheme_max_len(mems, args.capacity_bytes)  # every rank computes the same
        if refit == MEMORY_REFITS or max_len <= lengths[-1] * (1 + MEMORY_SETTLED):
            break
        # far beyond the lengths measured: a fit over short sequences extrapolates (an allocator's quadratic-looking
        # growth at 2K tokens is not the one at 13K); measure where MaxLen lands and fit again
        held, top = measure(max_len)
        lengths.append(max_len)
        act.append(held)
        peak.append(top)

    del module
    replayer = Replayer(cfg, data, dtype, 0, 1e-3, dev, timedelta(seconds=args.timeout_s))
    replayer.record_actions = True
    points = []
    for lengths in time_grid(max_len):
        n = len(lengths)
        batch = [BatchSeq(id=m * n + i, length=x) for m in range(pp) for i, x in enumerate(lengths)]
        pipe = PlanPipeline(tp=tp, pp=pp, cp=cp, recompute=args.recompute, ranks=list(range(world)), estimate_s=0.0,
                            micro_batches=[MicroBatch(seqs=list(range(m * n, (m + 1) * n))) for m in range(pp)])
        plan = layout.model_copy(update={"batch": batch, "pipelines": [pipe]})
        runs = replayed_pipeline(replayer, plan, args)
        points.append({"lengths": lengths, "seconds": statistics.median(runs) / (2 * pp - 1), "runs": runs})
    if rank != 0:
        return None
    return {"tp": tp, "pp": pp, "cp": cp, "recompute": args.recompute, "max_len": max_len, "micro_batches": pp, "points": points,
            "memory": [m.__dict__ for m in mems]}


class Phases(NamedTuple):
    """Seconds of one replayed training iteration (Replayer.step: pull overlapped with the forward, push with
    the last backward). pull_s/push_s: time each direction had an exchange in flight; exposed_s: time compute
    waited on it after every rank had posted; peer_wait_s: waits on a slower rank; propagate_s: the slowest
    pipeline (per_pipeline: each); iteration_s: the whole step on this clock (see `iteration_phases`)."""

    pull_s: float
    propagate_s: float
    push_s: float
    step_s: float
    exposed_s: float
    peer_wait_s: float
    iteration_s: float
    per_pipeline: list[float]
    pull_wait_s: float = 0.0  # of propagate_s, waits on pulls


def _barrier_timed(fn, dev: Device):
    """Run fn between two barriers, the device synchronized before each; (its result, wall seconds): what the
    slowest rank takes."""
    dev.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    out = fn()
    dev.synchronize()
    dist.barrier()
    return out, time.perf_counter() - t0


def iteration_phases(replayer: Replayer, plan: Plan, clock: str) -> Phases:
    """One training iteration of `plan` exactly as run_plan replays it (Replayer.step), between barriers.

    Clock "wall": the step's own wall seconds. Clock "cpu" (a CPU shared with other jobs, or more ranks than
    cores): propagation is each pipeline's critical path over its ranks' thread CPU seconds per forward and
    backward action (the clock the profile's T(l) was fitted on), and the whole iteration is that plus what
    the step measured outside propagation: the exposed pull/push waits and the optimizer step.
    Collective over all ranks."""
    dist.barrier()
    stats = replayer.step(plan)
    dist.barrier()
    got: list = [None] * dist.get_world_size()
    dist.all_gather_object(got, replayer.last_actions)
    return phases_of(stats, got, len(plan.pipelines), clock)


def phases_of(stats: StepStats, got: list, pipelines: int, clock: str) -> Phases:
    """`iteration_phases` from the step's statistics and every rank's Replayer.last_actions (None on a rank in
    no pipeline). A pipeline without a micro-batch this iteration (idle: none of its ranks ran an action)
    propagated for 0 s on either clock."""
    actions = [[g[1:] for g in got if g is not None and g[0] == j] for j in range(pipelines)]
    idle = [not any(secs for _, _, secs in stages) for stages in actions]
    if clock == "cpu":
        per = [0.0 if idle[j] else critical_path(actions[j]) for j in range(pipelines)]
        prop = max(per, default=0.0)
        whole = prop + stats.exposed_s + stats.step_s
    else:  # wall: pipelines run at once, only the slowest is seen
        prop = stats.propagate_s
        per = [0.0 if idle[j] else prop for j in range(pipelines)]
        whole = stats.iteration_s
    return Phases(stats.pull_s, prop, stats.push_s, stats.step_s, stats.exposed_s, stats.peer_wait_s, whole, per,
                  stats.pull_wait_s)


def check_plans(cfg: ModelConfig, args: argparse.Namespace, dev: Device, at: list | None = None) -> dict | None:
    """Phase seconds of whole iterations of every plan (median of `repeats` after `warmup`, each phase on
    its own; every repeat is a real training step). `at` is kept at the plan being replayed: [iteration, file]."""
    from hydraplan.runtime.plan_roles import check_plan, load_plans
    from hydraplan.runtime.seq1f1b import check_splits

    rank, world = dist.get_rank(), dist.get_world_size()
    replayer = Replayer(cfg, TokenData(cfg.vocab), DTYPES[args.dtype], 0, 1e-3, dev, timedelta(seconds=args.timeout_s))
    replayer.record_actions = True
    out = []
    for source, plan in load_plans(args.check, None):
        if at is not None:
            at[:] = [plan.iteration, source]
        check_plan(plan, source, world, cfg)
        check_splits(plan, source)
        runs = [iteration_phases(replayer, plan, args.clock) for _ in range(args.warmup + args.repeats)][args.warmup:]
        med = {k: statistics.median(getattr(r, k) for r in runs)
               for k in ("pull_s", "propagate_s", "push_s", "step_s", "exposed_s", "peer_wait_s", "iteration_s")}
        pipes = [{"seconds": statistics.median(r.per_pipeline[j] for r in runs)} for j in range(len(plan.pipelines))]
        out.append({"source": source, "iteration": plan.iteration, **med, "pipelines": pipes,
                    "runs": [r._asdict() for r in runs]})
    return {"plans": out} if rank == 0 else None


def measure_network(cfg: ModelConfig, schemes: list[tuple[int, int]], args: argparse.Namespace,
                    dev: Device) -> dict | None:
    """Wall seconds of LNK pull and push (runtime/lnk.py itself, between barriers) when all ranks of this
    job run one homogeneous <tp, pp> layout: each rank moves its stage's slice for its TP rank from and to
    owners spread over every rank, the runtime's own messages at the real slice sizes. Median of
    `repeats` after `warmup` per scheme and direction."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = DTYPES[args.dtype]
    specs = param_specs(cfg)
    numels = np.array([s.numel for s in specs], dtype=np.int64)
    sharded = np.array([s.sharded for s in specs], dtype=bool)
    master = ShardedMaster(cfg, rank, world, master_dtype(dtype), 0, 1e-3, dev.torch)
    shard = master.weights.detach()
    out = []
    for tp, pp in schemes:
        d = tp * pp
        if world % d:
            raise UserError(f"network: <{tp},{pp}> needs a multiple of {d} ranks but WORLD_SIZE is {world}")
        layout = Plan(iteration=0, profile="", gpus=world, batch=[], strategy="", estimate=Estimate(propagation_s=0.0),
                      pipelines=[PlanPipeline(tp=tp, pp=pp, cp=1, ranks=list(range(i * d, (i + 1) * d)), micro_batches=[],
                                              estimate_s=0.0) for i in range(world // d)])
        link = lnk.plan_link(numels, sharded, [r.link_role(cfg) for r in rank_roles(layout, world)], rank)
        grads = torch.ones(link.local.total, dtype=master_dtype(dtype), device=dev.torch)
        pulls, pushes = [], []
        for i in range(args.warmup + args.repeats):
            _, t_pull = _barrier_timed(lambda: lnk_streams.pull(link, shard, dtype, dev=dev), dev)
            _, t_push = _barrier_timed(lambda: lnk_streams.push(link, grads, dtype, dev=dev, master_dtype=shard.dtype), dev)
            if i >= args.warmup:
                pulls.append(t_pull)
                pushes.append(t_push)
        moved: list = [None] * world
        dist.all_gather_object(moved, link.local.total)
        out.append({"tp": tp, "pp": pp, "elements": max(moved), "wire_bytes_per_element": dtype.itemsize,
                    "pull_s": statistics.median(pulls), "push_s": statistics.median(pushes),
                    "pull_runs": pulls, "push_runs": pushes})
    return {"ranks": world, "params": int(numels.sum()), "samples": out} if rank == 0 else None


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    dev = devices.pick()
    devices.init_distributed(dev, timedelta(seconds=args.timeout_s))
    args.dtype = args.dtype or devices.default_dtype(dev)
    watchdog = faults.Watchdog(dist.get_rank(), "profile")  # one line for the job, whichever ranks fail
    at: list = [None, None]  # the plan iteration and file --check replays
    try:
        cfg = hf.model_config(args.model)
        if args.check:
            result = check_plans(cfg, args, dev, at)
        elif args.network:
            result = measure_network(cfg, [_pair(x) for x in args.network], args, dev)
        else:
            result = measure_scheme(cfg, args.tp, args.pp, args.cp, args, dev)
        if result is not None:
            Path(args.out).write_text(json.dumps(result, indent=1))
        return 0
    except UserError as e:
        watchdog.fail(f"profile: {e}", 2)  # several ranks: never returns
        return 2
    except Exception as e:
        watchdog.handle(e, *at)
        return 1
    finally:
        watchdog.stop()
        dist.destroy_process_group()


if __name__ == "__main__":
    from hydraplan.runtime.groups import exit_process

    exit_process(main())
