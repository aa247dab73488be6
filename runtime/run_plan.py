"""Replay hydraplan plans: heterogeneous pipelines per iteration, LNK resharding, one global update.

    torchrun --nproc-per-node N runtime/run_plan.py PLAN_DIR_OR_FILE [--iterations K] [--model tiny | --init-from HF_DIR]
             [--dtype fp64|fp32|bf16] [--dataset TOKENIZED_DATASET] [--verify] [--save DIR] [--resume DIR]
             [--no-overlap] [--memory] [--compile]
    torchrun ... runtime/run_plan.py --profile P --dataset D --tokens-per-iter T --iterations K [pack's options]
             [--planners-per-node 2] [--plan-ahead A] [--save-plans DIR [--format compact]] [--stop-at I] ...

Without a plan argument the job plans its own iterations while it trains, exactly `hydraplan pack`'s plans
for the same options (runtime/online.py).

Before the first iteration every rank creates the TP, CP and CAD groups of all the plans it belongs to
(runtime/groups.py: members only, one global order). Per iteration every rank pulls its stage's parameters
from the owners' master shards (lnk.py), runs its pipeline's micro-batches with 1F1B (pipeline_exec.py; a
CP rank on its share of the tokens, context_parallel.py), pushes its gradients to the owners, and each
owner takes one AdamW step on its shard.
Pull and push go one layer group at a time: layer k+1 is pulled while layer k computes, and a layer's
gradients are pushed as soon as the last backward has produced them (`--no-overlap`: all before / after).
Each iteration prints its phases (replay.StepStats): pull, propagate, push and step times, how long compute
was blocked on LNK ("sync exposed") and how much in-flight LNK time it did not wait for ("hidden").
The loss is the token mean over the whole global batch, so the result equals single-process training on
the same batch; `--verify` checks exactly that against runtime/reference.py.
Without torchrun it runs as a single process. CUDA (NCCL, bf16 by default, TF32 allowed) is used when present,
else CPU (gloo, fp32 by default); every time and byte it reports is read through runtime/device.py.
--init-from loads a local Hugging Face Llama, Mistral or Qwen2 checkpoint (runtime/hf.py: each owner reads only its
shard); --hf-config FILE takes the model from a config.json alone (seeded initial weights);
--save / --resume write and read the sharded masters, AdamW states and step (runtime/checkpoint.py).
--memory prints each rank's peak bytes per step (the C heap on CPU, the CUDA caching allocator on GPU) next
to the memory model of the plan's profile for the rank's scheme, stage and largest micro-batch.
A failure inside training prints one line naming the rank, host, iteration and plan file (planning while
training: the iteration's planning node) and ends every rank within seconds (runtime/faults.py;
HYDRAPLAN_INJECT_FAULT=KIND@RANK:ITERATION injects one).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    # Run as a script, this file's folder would come first on sys.path and its modules (profile.py)
    # could shadow the standard library; drop it and import the installed package hydraplan.runtime.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]

import argparse
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from hydraplan.core.errors import UserError
from hydraplan.core.options import add_flags, options
from hydraplan.core.schema import Plan, scheme_label
from hydraplan.job.config import build
from hydraplan.job.planrun import PlanRun
from hydraplan.runtime import checkpoint, device, faults, hf, kernels, liveness, memstats, online
from hydraplan.runtime.attention import choice_for
from hydraplan.runtime.batches import TokenData
from hydraplan.runtime.groups import RankSet, plan_groups, warm_up
from hydraplan.runtime.lnk import owner_ranges
from hydraplan.runtime.memstats import map_large_allocations
from hydraplan.runtime.model import ModelConfig, get_config
from hydraplan.runtime.optim import Schedule, master_dtype
from hydraplan.runtime.plan_roles import check_plan, largest_micro_batch, load_plans, rank_model_bytes, rank_roles
from hydraplan.runtime.replay import Replayer
from hydraplan.runtime.seq1f1b import check_splits
from hydraplan.runtime.train_config import TrainConfig
from hydraplan.runtime.verify import Verifier, fp64_attention_refusal, tolerance
from hydraplan.solve.placement import groups_per_rank
from hydraplan.store.profiles import load_profile


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        if os.environ.get("RANK", "0") == "0":  # every rank parses the same arguments: one line for the job
            print(f"run_plan: {message}", file=sys.stderr)
        sys.exit(2)


def parser() -> argparse.ArgumentParser:
    """run_plan's flags, generated from their declarations: its own (train_config.py), then the planning ones."""
    ap = _Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(ap, options(TrainConfig), typed=True)
    online.add_arguments(ap)
    return ap


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return parser().parse_args(argv)


def configure(args: argparse.Namespace, dtype: device.DtypeName, world: int) -> TrainConfig:
    """The flags typed and checked once, or one UserError: run_plan's own, and without a plan argument the run it
    plans on `world` ranks; `dtype` is the device's default compute dtype."""
    if args.plan is not None:
        online.check_replay_args(args)
    planning = online.online_config(args, world) if args.plan is None else None
    own = {o.name: getattr(args, o.name) for o in options(TrainConfig)}
    return build(TrainConfig, **{**own, "dtype": args.dtype or dtype}, planning=planning)


def describe(plan: Plan) -> str:
    counts = Counter(p.label for p in plan.pipelines)
    return "+".join(f"{n}x{k}" for k, n in counts.items())


def train(cfg: ModelConfig, data: TokenData, plans: Collection[Plan], groups: list[RankSet], config: TrainConfig,
          schedule: Schedule, dev: device.Device, hf_weights: hf.Checkpoint | None, done: int | None,
          source: Callable[[Plan], str], trained: Callable[[Plan], None] | None = None,
          alike: tuple[type[Exception], ...] = ()) -> int:
    """Train on `plans` in order (replayed, or planned while training), after making `groups`; `source` names
    a plan's file (or planning node) in a failure's one line; `trained` is called with each plan once it is
    trained. A failure inside ends the job in one line (runtime/faults.py), except errors of the types `alike`,
    which every rank raises at the same point (a plan they all refuse) and which go to the caller."""
    watchdog = faults.Watchdog(dist.get_rank())
    heartbeat = liveness.Heartbeat(dist.get_rank(), dist.get_world_size(), config.liveness_s)
    at: list = [None, None]  # the plan iteration and source being trained

    def finished(plan: Plan) -> None:
        heartbeat.finished(plan.iteration)
        if trained is not None:
            trained(plan)

    try:
        code = _train(cfg, data, plans, groups, config, schedule, dev, hf_weights, done, source, finished, at)
    except alike:
        heartbeat.stop()
        watchdog.stop()
        raise
    except Exception as e:
        heartbeat.stop()
        watchdog.handle(e, at[0], at[1])  # one line for the job (the first rank to count itself); several ranks: never returns
        code = 1
    heartbeat.stop()
    watchdog.stop()
    return code


def _train(cfg: ModelConfig, data: TokenData, plans: Collection[Plan], groups: list[RankSet], config: TrainConfig,
           schedule: Schedule, dev: device.Device, hf_weights: hf.Checkpoint | None, done: int | None,
           source: Callable[[Plan], str], trained: Callable[[Plan], None] | None, at: list) -> int:
    rank = dist.get_rank()
    dtype = config.torch_dtype
    mdt = master_dtype(dtype)
    if rank == 0:
        choice = choice_for(dev.torch, dtype, cfg.head_dim)
        print(f"attention: {choice.backend} ({choice.reason})", flush=True)
    if config.memory:
        map_large_allocations()
    if config.compile:
        kernels.use(kernels.compiled())
    replayer = Replayer(cfg, data, dtype, config.init_seed, config.lr, dev, timedelta(seconds=config.timeout_s),
                        overlap=config.overlap, keep_grad=config.verify and dtype != torch.float64)
    replayer.master.schedule = schedule
    verifier = Verifier(replayer, cfg, data, config.init_seed, config.lr, dtype) if config.verify else None
    if verifier is not None and verifier.reference is not None:
        verifier.reference.schedule = schedule
    if done is not None:
        assert config.resume is not None  # `done` is the resumed checkpoint's last iteration
        replayer.master.load(**checkpoint.load(config.resume, rank, dist.get_world_size()))
        if rank == 0:
            print(f"resume: {config.resume} after iteration {done}, {len(plans)} plans to go", flush=True)
    elif hf_weights is not None:
        lo, hi = owner_ranges(replayer.numels, dist.get_world_size())
        replayer.master.load(hf_weights.shard(lo[rank], hi[rank], mdt))
        if verifier is not None and verifier.reference is not None:
            verifier.reference.load(hf_weights.full(torch.float64))
    _make_groups(replayer, groups)
    worst, last = (0.0, 0.0, 1.0), (done if done is not None else -1)  # (diff / tolerance, diff, tolerance)
    ahead = _SetupAhead(replayer, [] if config.memory else plans)  # --memory: no host work of the next plan inside
    if config.memory:
        memstats.collect()  # set up: what is alive now is left out of the per-step collections below
    ahead.start(0)
    for i, plan in enumerate(plans):
        ahead.join()
        ahead.start(i + 1)
        at[:] = [plan.iteration, source(plan)]
        last = plan.iteration
        if verifier is not None:
            verifier.before()
        if config.memory:
            held = replayer.master.held_bytes()  # persistent between steps: master shard and AdamW state
            memstats.collect()
            dist.barrier()
            with dev.peak_memory() as peak:
                st = replayer.step(plan)
            _print_memory(plan, replayer, peak.peak - peak.start + held, dtype)
        else:
            st = replayer.step(plan)
        if rank == 0:
            print(f"iteration {plan.iteration} strategy {plan.strategy} {describe(plan)} tokens={data.labeled_tokens(plan)} "
                  f"loss={st.loss:.6f} time={st.total_s:.3f}s (pull {st.pull_s:.3f}s, propagate {st.propagate_s:.3f}s, "
                  f"push {st.push_s:.3f}s, step {st.step_s:.3f}s; sync exposed {st.exposed_s:.3f}s, "
                  f"hidden {st.hidden_s:.3f}s, peer wait {st.peer_wait_s:.3f}s, pack {st.pack_s:.3f}s)"
                  + _optimizer_note(replayer), flush=True)
        if plan.cad is not None:
            _print_cad_balance(plan, replayer.cad_attention_s if replayer.last_role_cad else [])
        if verifier is not None:
            diff = verifier.compare(plan)
            if diff is not None:
                tol = config.tolerance if config.tolerance is not None else tolerance(config.dtype, cfg.layers, plan)
                print(f"verify: iteration {plan.iteration} {verifier.what}={diff:.3e}"
                      + ("" if verifier.exact else f" (fp64 reference at the same weights, tolerance {tol:.2e})"),
                      flush=True)
                worst = max(worst, (diff / tol, diff, tol))
            dist.barrier()  # the next iteration's timings must not include rank 0's reference training
        if trained is not None:
            trained(plan)
    ahead.join()
    at[:] = [None, None]
    if config.save:
        checkpoint.save(config.save, replayer.master.state(), cfg, mdt, last)
        if rank == 0:
            print(f"saved: {config.save} (iteration {last}, {dist.get_world_size()} shards)", flush=True)
    failed = torch.tensor([float(worst[0] > 1.0)], device=dev.torch)
    dist.broadcast(failed, 0)
    if failed.item():
        if rank == 0:
            print(f"verify: FAILED, {verifier.what}={worst[1]:.3e} exceeds tolerance {worst[2]:.2e}", file=sys.stderr)
        return 1
    return 0


class _SetupAhead:
    """A plan's LNK plan (Replayer.link_setup: roles and plan_link, host work of tens of milliseconds for a new
    64-GPU strategy and a quarter second at 1024 GPUs on a loaded CPU, bench/bench_lnk_host.py) made ahead of the step
    that needs it, so a step with a new strategy starts without it: a replayed plan's while the step before it
    runs (the next one is known); a plan planned while training on the feed's thread as it arrives
    (online.PlanFeed.prepare_with). link_setup makes no group (no collective off the main thread)."""

    def __init__(self, replayer: Replayer, plans: Collection[Plan]):
        self.replayer = replayer
        self.plans = plans if isinstance(plans, Sequence) else None
        self._thread: threading.Thread | None = None
        if isinstance(plans, online.PlanFeed):
            plans.prepare_with(self._run)

    def start(self, i: int) -> None:
        if self.plans is not None and i < len(self.plans):
            self._thread = threading.Thread(target=self._run, args=(self.plans[i],), name="hydraplan-setup-ahead",
                                            daemon=True)
            self._thread.start()

    def _run(self, plan: Plan) -> None:
        try:
            self.replayer.link_setup(plan)
        except Exception:  # the step that needs it sets it up again and reports the error where it belongs
            pass

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def _optimizer_note(replayer: Replayer) -> str:
    """The step's learning rate and, when clipping, the global gradient norm before it."""
    master = replayer.master
    norm = f" grad_norm={master.last_grad_norm:.4g}" if master.last_grad_norm is not None else ""
    return f" lr={master.schedule.lr_at(master.steps - 1):.4g}{norm}"


def _make_groups(replayer: Replayer, sets: list[tuple[int, ...]]) -> None:
    """Every TP, CP and CAD group of the run, before its first iteration (runtime/groups.py)."""
    t0 = time.perf_counter()
    replayer.groups.create(sets)
    dist.barrier()
    made = time.perf_counter() - t0
    used = [None, replayer.pull_pg, replayer.push_pg, *replayer.groups.ordered()]
    seconds = warm_up(used, replayer.device)  # before iteration 0, every rank alike
    if dist.get_rank() == 0:
        per_rank = int(groups_per_rank(sets, dist.get_world_size()).max(initial=0))
        print(f"groups: {len(sets)} process groups made before the first iteration ({per_rank} per rank at most) "
              f"in {made:.2f}s; rank 0's {len(used)} communicators warmed up in {seconds:.2f}s", flush=True)


def _model(config: TrainConfig) -> tuple[ModelConfig, hf.Checkpoint | None]:
    """The model config and, with --init-from (unless resuming), the checkpoint to read weights from."""
    if config.hf_config is not None:
        return hf.config_from_file(config.hf_config, f"--hf-config {config.hf_config}",
                                   f"hf:{Path(config.hf_config).stem}")[0], None
    if config.init_from is None:
        return get_config(config.model or "tiny"), None
    if config.resume:
        return hf.read_config(config.init_from)[0], None
    ckpt = hf.Checkpoint(config.init_from)
    return ckpt.cfg, ckpt


def _print_memory(plan: Plan, replayer: Replayer, measured: int, dtype: torch.dtype) -> None:
    """Rank 0 prints, per rank, the peak bytes of the step (plus the master shard and AdamW state held across
    steps) next to the memory model of the plan's profile for its scheme, stage and largest micro-batch
    (hydraplan.core.memory.rank_memory, LNK's buffers in this run's compute dtype)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    role = rank_roles(plan, world)[rank]
    mine = None
    if role is not None:
        try:
            profile = load_profile(plan.profile)
        except UserError:
            profile = None
        model = rank_model_bytes(plan, world, rank, profile, dtype.itemsize)
        mine = (role.pipeline, plan.pipelines[role.pipeline].key, role.stage,
                largest_micro_batch(plan, role.pipeline), measured, model)
    rows: list = [None] * world
    dist.all_gather_object(rows, mine)
    if rank != 0:
        return
    for r, row in enumerate(rows):
        if row is None:
            continue
        j, key, stage, tokens, got, model = row
        vs = "" if model is None else f", model {model / 2**20:.2f} MiB, measured/model {got / model:.3f}"
        print(f"memory: iteration {plan.iteration} rank {r} pipeline {j} {scheme_label(key)} stage {stage} "
              f"largest micro-batch {tokens} tokens: peak {got / 2**20:.2f} MiB{vs}", flush=True)


def _print_cad_balance(plan: Plan, mine: list[float]) -> None:
    """Core-attention disaggregation: per layer call, how evenly the ranks' measured attention seconds are
    spread (max/mean - 1, TP rank 0 of each replica), next to the plan's modeled balance per step."""
    from hydraplan.runtime.cad import balance_report

    per_rank: list[list[float]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(per_rank, mine)
    if dist.get_rank() != 0:
        return
    replicas = [per_rank[p.ranks[0]] for p in plan.pipelines]
    measured = balance_report(replicas)
    planned = [s.attention_imbalance for s in plan.cad.steps]
    print(f"cad: iteration {plan.iteration} attention imbalance per layer call (measured max/mean-1): "
          + " ".join(f"{x:.2f}" for x in measured) + "; planned per step: "
          + " ".join(f"{x:.2f}" for x in planned if x is not None), flush=True)


def _token_data(spec: str | None, cfg: ModelConfig, planning: bool = False) -> TokenData:
    """The tokens trained on: the dataset's ids, or synthetic ones without a dataset (or, when planning from
    a dataset of lengths only, such as builtin:wikipedia)."""
    if spec is None:
        return TokenData(cfg.vocab)
    from hydraplan.store.datasets import load_dataset

    dataset = load_dataset(spec)  # untruncated: a truncated document still has the label after its cut
    if not dataset.has_tokens:
        if planning:
            return TokenData(cfg.vocab)
        raise UserError(f"--dataset: {spec} has lengths only, no token ids (omit --dataset for synthetic tokens)")
    return TokenData(cfg.vocab, dataset)


def _replayed(config: TrainConfig, cfg: ModelConfig, data: TokenData, dev: device.Device
              ) -> tuple[list[tuple[str, Plan]], int | None]:
    """The plans of the plan argument and their files, checked against the job (after --resume's iteration)."""
    assert config.plan is not None
    plans = load_plans(config.plan, config.iterations)
    for source, plan in plans:
        _check(plan, source, cfg, data, config, dev)
    done = None
    if config.resume:
        done = checkpoint.check(config.resume, dist.get_rank(), dist.get_world_size(), cfg,
                                master_dtype(config.torch_dtype))
        plans = [(source, plan) for source, plan in plans if plan.iteration > done]
    return plans, done


def _check(plan: Plan, source: str, cfg: ModelConfig, data: TokenData, config: TrainConfig,
           dev: device.Device) -> None:
    check_plan(plan, source, dist.get_world_size(), cfg)
    check_splits(plan, source)
    data.check(plan, source)
    if dev.kind == "cuda" and (config.verify or config.dtype == "fp64"):
        capacity = torch.cuda.get_device_properties(dev.torch).total_memory
        if (why := fp64_attention_refusal([(source, plan)], cfg.heads, capacity)) is not None:
            raise UserError(why)


def _agree(error: str | None) -> str | None:
    """Every rank must agree before the first collective of training, or one would wait forever: the first
    rank's error, if any rank has one."""
    errors: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    return next((e for e in errors if e), None)


def _say_once(error: str) -> None:
    """An error every rank has (they agreed on it): rank 0 prints its one line, the others exit quietly."""
    if dist.get_rank() == 0:
        print(f"run_plan: {error}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dev = device.pick()
    device.init_distributed(dev, timedelta(seconds=args.timeout_s))
    try:
        error, config = None, None
        try:
            faults.configured()  # a malformed HYDRAPLAN_INJECT_FAULT is a user error like any other
            config = configure(args, device.default_dtype(dev), dist.get_world_size())
        except UserError as e:
            error = str(e)
        if (first := _agree(error)) is not None:
            _say_once(first)
            return 2
        assert config is not None
        return _replay(config, dev) if config.planning is None else _online(config, config.planning, dev)
    finally:
        dist.destroy_process_group()


def _replay(config: TrainConfig, dev: device.Device) -> int:
    """Replay the plan argument's plans; one line and exit 2 for a bad plan, model or dataset."""
    error, plans, cfg, data, weights, done, schedule = None, [], None, None, None, None, None
    try:
        cfg, weights = _model(config)
        data = _token_data(config.dataset, cfg)
        plans, done = _replayed(config, cfg, data, dev)
        schedule = config.schedule(max((p.iteration for _, p in plans), default=0) + 1)
    except UserError as e:
        error = str(e)
    if (first := _agree(error)) is not None:
        _say_once(first)
        return 2
    assert cfg is not None and data is not None and schedule is not None
    sources = {plan.iteration: source for source, plan in plans}
    only = [plan for _, plan in plans]
    return train(cfg, data, only, plan_groups(only), config, schedule, dev, weights, done, lambda p: sources[p.iteration])


def _online(config: TrainConfig, planning: online.OnlineConfig, dev: device.Device) -> int:
    """Plan while training (runtime/online.py): the run prepared on each node's first rank, the start-up
    groups from rank 0, plans fed by a thread; one line and exit 2 for a bad argument or plan."""
    world, error, run, done = dist.get_world_size(), None, None, None
    plan_group = dist.new_group(backend="gloo")  # plans travel beside training, on CPU
    topology = online.Topology.of(plan_group)
    planned = planning.run
    try:
        schedule = config.schedule(planned.iterations)
        cfg, weights = _model(config)
        data = _token_data(config.dataset, cfg, planning=True)
        if config.resume:
            done = checkpoint.check(config.resume, dist.get_rank(), world, cfg, master_dtype(config.torch_dtype))
            online.check_resume(config.resume, planned)
        if topology.leader:
            t0 = time.perf_counter()
            run = PlanRun.prepare(planned, load_profile(planned.profile))
            if dist.get_rank() == 0:
                print(f"planning: run prepared in {time.perf_counter() - t0:.2f}s; {topology.nodes} node(s) x "
                      f"{planning.planners_per_node} planner process(es)", flush=True)
    except UserError as e:
        error = str(e)
    if (first := _agree(error)) is not None:
        _say_once(first)
        return 2
    start = 0 if done is None else done + 1
    stop = min(planned.iterations, planning.stop_at) if planning.stop_at is not None else planned.iterations
    groups = online.broadcast_groups(online.startup_groups(run) if dist.get_rank() == 0 else None, plan_group)
    ahead = planning.plan_ahead or 2 * planning.planners_per_node * topology.nodes
    feed = online.PlanFeed(run, topology, start, stop, planning.planners_per_node, ahead, plan_group,
                           lambda plan: _check(plan, f"plan of iteration {plan.iteration}", cfg, data, config, dev))
    saving = (online.save_plans(planning.save_plans, planning.format, run)
              if planning.save_plans is not None and dist.get_rank() == 0 else None)
    try:
        code = train(cfg, data, feed, groups, config, schedule, dev, weights, done,
                     lambda p: f"planned on node {topology.planner_of(p.iteration)}", saving, alike=(UserError,))
    except UserError as e:  # every rank refuses the same plan at the same point
        _say_once(str(e))
        feed.close(abort=True)
        return 2
    feed.close()
    if config.save:
        online.save_run(config.save, planned)  # on every rank: --resume reads it on every node
    if dist.get_rank() == 0 and feed.waits:
        print(f"planning: {len(feed.waits)} plans; training waited {feed.waits[0]:.3f}s for the first and "
              f"{sum(feed.waits[1:]):.3f}s for the rest (at most {max(feed.waits[1:], default=0.0):.3f}s once)",
              flush=True)
    return code


if __name__ == "__main__":
    from hydraplan.runtime.groups import exit_process

    exit_process(main())
