"""A plain FSDP2 training loop fed by hydraplan: balanced data parallelism for variable-length data.

    torchrun --nproc-per-node 2 examples/fsdp2_train.py                # CPU: gloo, fp32, synthetic tokens
    torchrun --nproc-per-node 8 examples/fsdp2_train.py --dataset TOKENS.parquet --dtype bf16   # GPUs: NCCL

Every iteration, rank 0 samples a global batch (`--tokens-per-iter` tokens of whole documents) and plans it
with hydraplan.Planner on a homogeneous layout of WORLD_SIZE one-GPU pipelines, i.e. plain data
parallelism: dispatch balances the ranks' estimated compute (attention grows with the square of a
document's length, so equal token counts are not equal work) and packing fills each rank's micro-batches
up to the profile's MaxLen (WLB-LLM-style balanced packing, which any data-parallel trainer can use). Each
rank trains on its own micro-batches from hydraplan.loader, FSDP2 (`fully_shard`) sums the gradients over
ranks (reduce-scatter with ReduceOp.SUM only: gloo has no PREMUL_SUM), and the loss is the sum of token losses
over the global batch's token count, so each update equals single-process training on the whole global batch.
On GPUs each rank uses the GPU of its LOCAL_RANK; `--dtype bf16` keeps fp32 parameters and AdamW state and
computes in bf16 (FSDP2's MixedPrecisionPolicy: bf16 parameters for compute, fp32 gradient reduction).

Without torchrun it runs as one process (the plan then has one pipeline). The model is the runtime's
LLaMA-style decoder (`--model tiny` by default); a dataset without token ids (such as builtin:wikipedia,
lengths only) trains on synthetic token ids.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from hydraplan import Planner
from hydraplan.core.errors import UserError
from hydraplan.loader import PackedBatch, PlanLoader
from hydraplan.runtime.batches import IGNORE
from hydraplan.runtime.groups import exit_process
from hydraplan.runtime.model import StageModule, get_config, init_full, load_full, param_specs
from hydraplan.schema import Candidate, PipelineSpec, Plan, Strategies
from hydraplan.store.datasets import Batch, load_dataset, sample_iterations
from hydraplan.store.fileio import write_model

DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="builtin:wikipedia", help="tokenized dataset (token ids) or a length file")
    ap.add_argument("--profile", default="cpu-tiny", help="cost model the planner balances with")
    ap.add_argument("--context-len", type=int, default=512, help="documents are cut to this many tokens")
    ap.add_argument("--tokens-per-iter", type=int, default=4096, help="tokens of one global batch")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32",
                    help="compute dtype (bf16: fp32 parameters and optimizer, bf16 compute, fp32 gradient reduction)")
    ap.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0, help="sampling, planning and initialization seed")
    ap.add_argument("--save-plans", default=None, help="folder: write each iteration's plan (iter_NNNNNN.json)")
    ap.add_argument("--out", default=None, help="write the trained parameters (flat, canonical order) with torch.save")
    return ap.parse_args(argv)


def init_distributed() -> torch.device:
    """NCCL on this rank's GPU (LOCAL_RANK) when there are GPUs, else gloo on CPU; returns the device."""
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)  # before the process group: NCCL binds each rank to its own GPU
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend, timeout=timedelta(minutes=5))
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return device


def data_parallel_planner(args: argparse.Namespace, world: int) -> Planner:
    """One candidate: WORLD_SIZE pipelines of one GPU each (<tp, pp, cp> = <1, 1, 1>)."""
    layout = Candidate(name="dp", pipelines=[PipelineSpec(tp=1, pp=1, cp=1)] * world)
    return Planner(args.profile, Strategies(candidates=[layout]), gpus=world, context_len=args.context_len, seed=args.seed,
                   synthesize=False)  # the layout is fixed: FSDP2 data parallelism over every rank


def plan_on_rank0(planner: Planner | None, batch: Batch) -> Plan:
    """Rank 0 plans, every rank trains on the same plan; a planning error stops every rank, not just rank 0."""
    box: list[Plan | str | None] = [None]
    if planner is not None:
        try:
            box[0] = planner.plan(batch)
        except UserError as e:
            box[0] = str(e)
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], str):
        raise UserError(box[0])
    return box[0]


def idle_batch(device: torch.device) -> PackedBatch:
    """One token without a label: a rank with no micro-batch still joins FSDP's collectives, adding 0."""
    one = torch.ones(1, dtype=torch.int64, device=device)
    return PackedBatch(tokens=one * 0, labels=one * IGNORE, positions=one * 0,
                       cu_seqlens=torch.tensor([0, 1], dtype=torch.int32, device=device), max_seqlen=1)


def build_model(args: argparse.Namespace, device: torch.device) -> StageModule:
    cfg = get_config(args.model)
    compute = DTYPES[args.dtype]
    dtype = torch.float32 if compute == torch.bfloat16 else compute  # parameters (and AdamW state)
    model = StageModule(cfg, dtype=dtype, device=device)
    load_full(model, [init_full(spec, i, args.seed, dtype) for i, spec in enumerate(param_specs(cfg))])
    model.dtype = compute  # what the stage computes its RoPE tables in (FSDP2 casts the parameters)
    policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=dtype) if compute != dtype else MixedPrecisionPolicy()
    for block in model.layers.values():
        fully_shard(block, reshard_after_forward=False, mp_policy=policy)
    fully_shard(model, reshard_after_forward=False, mp_policy=policy)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # sum the ranks' gradients: the loss is already a global mean
            m.set_force_sum_reduction_for_comms(True)  # ReduceOp.SUM only: gloo (and zero-copy NCCL) lack PREMUL_SUM
    return model


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(args, device)
    if args.optimizer == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    dataset = load_dataset(args.dataset)  # untruncated: a cut document keeps the label after its cut
    loader = PlanLoader(dataset, vocab=model.cfg.vocab, device=device)
    planner = data_parallel_planner(args, world) if rank == 0 else None  # planned once, broadcast
    batches = sample_iterations(dataset.truncate(args.context_len), args.tokens_per_iter, args.iterations, args.seed)

    for batch in batches:
        plan = plan_on_rank0(planner, batch)
        if rank == 0 and args.save_plans:
            write_model(Path(args.save_plans) / f"iter_{plan.iteration:06d}.json", plan)
        tokens = loader.labeled_tokens(plan)
        mbs = list(loader.micro_batches(plan, rank)) or [idle_batch(device)]
        local = torch.zeros((), dtype=torch.float64, device=device)
        for i, mb in enumerate(mbs):
            last = i == len(mbs) - 1  # accumulate unsharded gradients, reduce-scatter once per iteration
            model.set_requires_gradient_sync(last)
            model.set_reshard_after_backward(last)
            loss = model(None, mb) / tokens
            loss.backward()
            local += loss.detach().to(torch.float64)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(local)
        if rank == 0:
            loads = [f"{p.estimate_s:.4f}" for p in plan.pipelines]
            print(f"iteration {plan.iteration} tokens={tokens} loss={local.item():.6f} micro-batches/rank="
                  f"{[len(p.micro_batches) for p in plan.pipelines]} estimated s/rank={loads}", flush=True)

    full = [p.full_tensor().detach().reshape(-1) for p in model.ordered_params()]  # collective: every rank
    if rank == 0 and args.out:
        torch.save(torch.cat(full).cpu(), args.out)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except UserError as e:  # bad input: one line, exit 2
        print(f"fsdp2_train: {e}", file=sys.stderr)
        sys.exit(2)
    exit_process(code)  # after destroy_process_group: see hydraplan.runtime.groups
