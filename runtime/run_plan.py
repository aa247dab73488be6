"""Replay hydraplan plans: heterogeneous pipelines per iteration, LNK resharding, one global update.

    torchrun --nproc-per-node N runtime/run_plan.py PLAN_DIR_OR_JSON [--iterations K] [--model tiny | --init-from HF_DIR]
             [--dtype fp64|fp32|bf16] [--dataset TOKENIZED_DATASET] [--verify] [--save DIR] [--resume DIR]
             [--no-overlap] [--memory]

Per iteration every rank: creates the TP and CP groups of the plan's pipelines it has not seen yet
(collective, plan order), pulls its stage's parameters from the owners' master shards (lnk.py), runs its
pipeline's micro-batches with 1F1B (pipeline_exec.py; a CP rank on its share of the tokens,
context_parallel.py), pushes its gradients to the owners, and each owner takes one AdamW step on its shard.
Pull and push go one layer group at a time: layer k+1 is pulled while layer k computes, and a layer's
gradients are pushed as soon as the last backward has produced them (`--no-overlap`: all before / after).
Each iteration prints its phases (replay.StepStats): pull, propagate, push and step times, how long compute
was blocked on LNK ("sync exposed") and how much in-flight LNK time it did not wait for ("hidden").
The loss is the token mean over the whole global batch, so the result equals single-process training on
the same batch; `--verify` checks exactly that against runtime/reference.py.
Without torchrun it runs as a single process. CUDA (NCCL, bf16 by default, TF32 allowed) is used when present,
else CPU (gloo, fp32 by default); every time and byte it reports is read through runtime/device.py.
--init-from loads a local Hugging Face Llama checkpoint (runtime/hf.py: each owner reads only its shard);
--save / --resume write and read the sharded masters, AdamW states and step (runtime/checkpoint.py).
--memory prints each rank's peak bytes per step (the C heap on CPU, the CUDA caching allocator on GPU) next
to the memory model of the plan's profile for the rank's scheme, stage and largest micro-batch.
A failure inside training prints one line naming the rank, host, iteration and plan file and ends every rank
within seconds (runtime/faults.py; HYDRAPLAN_INJECT_FAULT=KIND@RANK:ITERATION injects one).
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
import gc
from collections import Counter
from datetime import timedelta

import torch
import torch.distributed as dist

from hydraplan.core.errors import UserError
from hydraplan.core.schema import Plan
from hydraplan.runtime import checkpoint, device, faults, hf
from hydraplan.runtime.attention import choice_for
from hydraplan.runtime.batches import TokenData
from hydraplan.runtime.lnk import owner_ranges
from hydraplan.runtime.memstats import map_large_allocations
from hydraplan.runtime.model import CONFIGS, ModelConfig, get_config
from hydraplan.runtime.optim import master_dtype
from hydraplan.runtime.plans import check_plan, largest_micro_batch, load_plans, rank_model_bytes, rank_roles
from hydraplan.runtime.replay import Replayer
from hydraplan.runtime.seq1f1b import check_splits
from hydraplan.runtime.verify import TOLERANCE, Verifier, fp64_attention_refusal


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        print(f"run_plan: {message}", file=sys.stderr)
        sys.exit(2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = _Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan", help="a plan JSON file, or a run folder of iter_*.json (replayed in order)")
    ap.add_argument("--iterations", type=int, default=None, help="replay only the first K plans")
    ap.add_argument("--model", default=None, help=f"model config: {', '.join(CONFIGS)} (default tiny)")
    ap.add_argument("--init-from", default=None, metavar="DIR",
                    help="start from a local Hugging Face Llama checkpoint (config.json + safetensors); sets the model")
    ap.add_argument("--save", default=None, metavar="DIR",
                    help="after the last iteration, save the sharded masters and AdamW states")
    ap.add_argument("--resume", default=None, metavar="DIR",
                    help="continue a run saved with --save (same world size and model): the plans after its last iteration")
    ap.add_argument("--dtype", choices=sorted(device.DTYPES), default=None,
                    help="compute dtype (default bf16 on CUDA, fp32 on CPU; masters are fp32, fp64 for fp64)")
    ap.add_argument("--dataset", default=None,
                    help="tokenized dataset the plans were sampled from (token ids); default: synthetic tokens per sequence id")
    ap.add_argument("--verify", action="store_true",
                    help="rank 0 also trains in one process in fp64 and compares parameters (fp64) or gradients (fp32, bf16)")
    ap.add_argument("--tolerance", type=float, default=None,
                    help="--verify tolerance: max abs parameter difference (fp64) or relative gradient error "
                         "(fp32, bf16) (default per dtype: 1e-9, 1e-5, 1e-2; runtime/verify.py)")
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    ap.add_argument("--seed", type=int, default=0, help="parameter initialisation seed")
    ap.add_argument("--memory", action="store_true",
                    help="measure each rank's peak bytes during every step (CPU: glibc heap statistics; CUDA: "
                         "max_memory_allocated) and print them next to the plan's profile's memory model")
    ap.add_argument("--no-overlap", action="store_true",
                    help="pull everything before and push everything after the propagation (no communication hidden)")
    ap.add_argument("--timeout-s", type=float, default=300.0,
                    help="collective timeout: a stuck peer fails the job instead of hanging it")
    return ap.parse_args(argv)


def describe(plan: Plan) -> str:
    counts = Counter(f"<{p.tp},{p.pp},{p.cp}>" for p in plan.pipelines)
    return "+".join(f"{n}x{k}" for k, n in counts.items())


def train(cfg: ModelConfig, data: TokenData, plans: list[tuple[str, Plan]], args: argparse.Namespace,
          dev: device.Device, hf_weights: hf.Checkpoint | None, done: int | None) -> int:
    """Replay the plans; a failure inside ends the job in one line (runtime/faults.py)."""
    rank = dist.get_rank()
    watchdog = faults.Watchdog(rank)
    at: list = [None, None]  # the plan iteration and file being replayed
    try:
        code = _train(cfg, data, plans, args, dev, hf_weights, done, at)
    except Exception as e:
        watchdog.handle(e, at[0], at[1])  # several ranks: never returns
        code = 1
    watchdog.stop()
    return code


def _train(cfg: ModelConfig, data: TokenData, plans: list[tuple[str, Plan]], args: argparse.Namespace,
           dev: device.Device, hf_weights: hf.Checkpoint | None, done: int | None, at: list) -> int:
    rank = dist.get_rank()
    dtype = device.DTYPES[args.dtype]
    mdt = master_dtype(dtype)
    tolerance = args.tolerance if args.tolerance is not None else TOLERANCE[args.dtype]
    if rank == 0:
        choice = choice_for(dev.torch, dtype, cfg.head_dim)
        print(f"attention: {choice.backend} ({choice.reason})", flush=True)
    if args.memory:
        map_large_allocations()
    replayer = Replayer(cfg, data, dtype, args.seed, args.lr, dev, timedelta(seconds=args.timeout_s),
                        overlap=not args.no_overlap, keep_grad=args.verify and dtype != torch.float64)
    verifier = Verifier(replayer, cfg, data, args.seed, args.lr, dtype) if args.verify else None
    if done is not None:
        replayer.master.load(**checkpoint.load(args.resume, rank, dist.get_world_size()))
        if rank == 0:
            print(f"resume: {args.resume} after iteration {done}, {len(plans)} plans to go", flush=True)
    elif hf_weights is not None:
        lo, hi = owner_ranges(replayer.numels, dist.get_world_size())
        replayer.master.load(hf_weights.shard(lo[rank], hi[rank], mdt))
        if verifier is not None and verifier.reference is not None:
            verifier.reference.load(hf_weights.full(torch.float64))
    worst = 0.0
    for source, plan in plans:
        at[:] = [plan.iteration, source]
        if verifier is not None:
            verifier.before()
        if args.memory:
            held = replayer.master.held_bytes()  # persistent between steps: master shard and AdamW state
            gc.collect()  # buffers of earlier collectives are freed now, not inside the measured window
            dist.barrier()
            with dev.peak_memory() as peak:
                st = replayer.step(plan)
            _print_memory(plan, replayer, peak.peak - peak.start + held, args.dtype)
        else:
            st = replayer.step(plan)
        if rank == 0:
            print(f"iteration {plan.iteration} strategy {plan.strategy} {describe(plan)} tokens={data.labeled_tokens(plan)} "
                  f"loss={st.loss:.6f} time={st.total_s:.3f}s (pull {st.pull_s:.3f}s, propagate {st.propagate_s:.3f}s, "
                  f"push {st.push_s:.3f}s, step {st.step_s:.3f}s; sync exposed {st.exposed_s:.3f}s, "
                  f"hidden {st.hidden_s:.3f}s, peer wait {st.peer_wait_s:.3f}s, pack {st.pack_s:.3f}s)", flush=True)
        if plan.cad is not None:
            _print_cad_balance(plan, replayer.cad_attention_s if replayer.last_role_cad else [])
        if verifier is not None:
            diff = verifier.compare(plan)
            if diff is not None:
                print(f"verify: iteration {plan.iteration} {verifier.what}={diff:.3e}"
                      + ("" if verifier.exact else " (fp64 reference at the same weights)"), flush=True)
                worst = max(worst, diff)
            dist.barrier()  # the next iteration's timings must not include rank 0's reference training
    at[:] = [None, None]
    if args.save:
        last = plans[-1][1].iteration if plans else (done if done is not None else -1)
        checkpoint.save(args.save, replayer.master.state(), cfg, mdt, last)
        if rank == 0:
            print(f"saved: {args.save} (iteration {last}, {dist.get_world_size()} shards)", flush=True)
    failed = torch.tensor([float(worst > tolerance)], device=dev.torch)
    dist.broadcast(failed, 0)
    if failed.item():
        if rank == 0:
            print(f"verify: FAILED, {verifier.what}={worst:.3e} exceeds tolerance {tolerance:g}", file=sys.stderr)
        return 1
    return 0


def _model(args: argparse.Namespace) -> tuple[ModelConfig, hf.Checkpoint | None]:
    """The model config and, with --init-from (unless resuming), the checkpoint to read weights from."""
    if args.verify and args.resume:
        raise UserError("--verify and --resume: give one (the reference would start from the initial weights)")
    if args.init_from is None:
        return get_config(args.model or "tiny"), None
    if args.model is not None:
        raise UserError("--model and --init-from: give one (--init-from takes the model from DIR/config.json)")
    if args.resume:
        return hf.read_config(args.init_from)[0], None
    ckpt = hf.Checkpoint(args.init_from)
    return ckpt.cfg, ckpt


def _print_memory(plan: Plan, replayer: Replayer, measured: int, dtype: str) -> None:
    """Rank 0 prints, per rank, the peak bytes of the step (plus the master shard and AdamW state held across
    steps) next to the memory model of the plan's profile for its scheme, stage and largest micro-batch
    (hydraplan.core.memory.rank_memory, LNK's buffers in this run's compute dtype)."""
    from hydraplan.store.profiles import load_profile

    rank, world = dist.get_rank(), dist.get_world_size()
    role = rank_roles(plan, world)[rank]
    mine = None
    if role is not None:
        try:
            profile = load_profile(plan.profile)
        except UserError:
            profile = None
        model = rank_model_bytes(plan, world, rank, profile, device.DTYPES[dtype].itemsize)
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
        print(f"memory: iteration {plan.iteration} rank {r} pipeline {j} <{key[0]},{key[1]},{key[2]}> stage {stage} "
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


def _token_data(spec: str | None, cfg: ModelConfig) -> TokenData:
    if spec is None:
        return TokenData(cfg.vocab)
    from hydraplan.store.datasets import load_dataset

    dataset = load_dataset(spec)  # untruncated: a truncated document still has the label after its cut
    if not dataset.has_tokens:
        raise UserError(f"--dataset: {spec} has lengths only, no token ids (omit --dataset for synthetic tokens)")
    return TokenData(cfg.vocab, dataset)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dev = device.pick()
    device.init_distributed(dev, timedelta(seconds=args.timeout_s))
    args.dtype = args.dtype or device.default_dtype(dev)
    try:
        error, plans, cfg, data, weights, done = None, [], None, None, None, None
        try:
            faults.configured()  # a malformed HYDRAPLAN_INJECT_FAULT is a user error like any other
            cfg, weights = _model(args)
            data = _token_data(args.dataset, cfg)
            plans = load_plans(args.plan, args.iterations)
            for source, plan in plans:
                check_plan(plan, source, dist.get_world_size(), cfg)
                check_splits(plan, source)
                data.check(plan, source)
            if dev.kind == "cuda" and (args.verify or args.dtype == "fp64"):
                capacity = torch.cuda.get_device_properties(dev.torch).total_memory
                if (why := fp64_attention_refusal(plans, cfg.heads, capacity)) is not None:
                    raise UserError(why)
            if args.resume:
                done = checkpoint.check(args.resume, dist.get_rank(), dist.get_world_size(), cfg,
                                        master_dtype(device.DTYPES[args.dtype]))
                plans = [(source, plan) for source, plan in plans if plan.iteration > done]
        except UserError as e:
            error = str(e)
        # Every rank must agree before the first collective of training, or one would wait forever.
        errors: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
        first = next((e for e in errors if e), None)
        if first is not None:
            print(f"run_plan: {first}", file=sys.stderr, flush=True)
            return 2
        return train(cfg, data, plans, args, dev, weights, done)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    from hydraplan.runtime.groups import exit_process

    exit_process(main())
