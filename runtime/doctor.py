"""`hydraplan doctor`'s runtime side: what a new cluster must get right before a real run, checked on its devices.

    torchrun --nproc-per-node N runtime/doctor.py --out result.json [--checks attention,collectives,replay,memory] [--quick]

(`hydraplan doctor` launches it and prints the table.) Every rank runs every check; a check passes when it passes
on every rank, and its detail is the first failing rank's one line. On a machine without GPUs it runs the same
on CPU with gloo.

- environment: torch, CUDA and NCCL versions, the backend, the device and the attention backend chosen;
- attention: every backend the device offers (runtime/attention.py `available`) against dense SDPA with an
  explicit bottom-right causal mask in fp64, forward and backward, on plain packed documents, grouped-query
  heads and windows whose queries are the last of longer keys (Seq1F1B, CP), in the device's dtype;
- collectives: what the runtime uses: all_to_all_single with uneven splits, batch_isend_irecv around a ring, and
  a collective in new subgroups;
- replay: small plans (plain, TP+PP, CP, Seq1F1B, CAD) trained with the runtime in the device's dtype and
  checked with --verify's comparison against the single-process fp64 reference (runtime/verify.py);
- memory: each rank's measured peak (runtime/device.py) of steps whose micro-batches fill the scheme's MaxLen
  (every rank <1,1,1>, then <2,2,1>), against the memory model (hydraplan.core.memory): measured / model at most
  MEMORY_SLACK. The model is the measured cpu-tiny profile's on CPU; on CUDA an analytic one of the tiny model
  (hydraplan.core.analytic) without its NCCL term, which torch's allocator does not see;
- activations: what one decoder layer of the analytic profiles' model (LLaMA-2 7B: hidden, heads, FFN) keeps for
  its backward per token in bf16, at ACTIVATION_TOKENS tokens (QUICK_ACTIVATION_TOKENS with --quick: a layer keeps
  the same bytes per token at any length, so only the run time differs), without, with selective and with full
  recomputation at TP 1 and TP 2 with SP (runtime/saved.py; the cases shared out over the ranks), against the
  memory model's per-token term: it fails when a layer keeps more than the model charges (beyond the
  statistics the model leaves out) or less than saved.MIN_SHARE of it.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]

import argparse
import json
import platform
from collections.abc import Callable
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from hydraplan.core.schema import GPUInfo, Plan, Profile, Scheme, TimeCoeffs
from hydraplan.runtime import attention, device, faults, memstats, saved
from hydraplan.runtime.batches import TokenData
from hydraplan.runtime.groups import warm_up
from hydraplan.runtime.memstats import map_large_allocations
from hydraplan.runtime.model import get_config
from hydraplan.runtime.plan_roles import build_plan, rank_model_bytes
from hydraplan.runtime.recompute import MODES
from hydraplan.runtime.replay import Replayer
from hydraplan.runtime.verify import Verifier, tolerance

CHECKS = ("attention", "collectives", "replay", "memory", "activations")
ATTENTION_TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 3e-2}  # relative L2 error vs fp64 SDPA
MEMORY_SLACK = 1.10  # measured / model at most this (the model must not underestimate a rank)
CUDA_MEMORY_TOKENS = 4096  # the memory check's micro-batch on CUDA, where the tiny model's MaxLen is enormous
MODEL = "tiny"
ACTIVATION_TOKENS = 2048  # the activations check's one-document micro-batch
QUICK_ACTIVATION_TOKENS = 256  # with --quick: bytes per token are the same, an eighth of the matmuls


# --------------------------------------------------------------------------------------- attention
def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: attention.Windows) -> torch.Tensor:
    """Reference: per segment, fp64 SDPA with an explicit boolean bottom-right causal mask."""
    outs = []
    gqa = q.shape[1] // k.shape[1]
    for (q0, q1), (k0, k1) in zip(zip(w.cu_q[:-1].tolist(), w.cu_q[1:].tolist()),
                                  zip(w.cu_k[:-1].tolist(), w.cu_k[1:].tolist()), strict=True):
        lq, lk = q1 - q0, k1 - k0
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
        qs, ks, vs = (t.double().transpose(0, 1) for t in (q[q0:q1], k[k0:k1].repeat_interleave(gqa, 1),
                                                            v[k0:k1].repeat_interleave(gqa, 1)))
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask).transpose(0, 1))
    return torch.cat(outs)


def _attention_cases(dev: device.Device, dtype: torch.dtype) -> list[tuple[str, tuple, attention.Windows]]:
    gen = torch.Generator().manual_seed(0)

    def case(heads: int, kv_heads: int, q_lens: list[int], k_lens: list[int]):
        d = 64
        tensors = [torch.randn(sum(n), h, d, generator=gen, dtype=torch.float64) for n, h in
                   ((q_lens, heads), (k_lens, kv_heads), (k_lens, kv_heads))]
        cu = [torch.tensor(np.concatenate(([0], np.cumsum(x))), dtype=torch.int32, device=dev.torch)
              for x in (q_lens, k_lens)]
        return tuple(t.to(dev.torch, dtype) for t in tensors), attention.Windows(cu[0], cu[1], max(q_lens), max(k_lens))

    return [("plain", *case(4, 4, [37, 5, 64, 1], [37, 5, 64, 1])),
            ("GQA", *case(8, 2, [40, 23, 64], [40, 23, 64])),
            ("bottom-right windows", *case(4, 2, [16, 7, 1, 30], [48, 7, 33, 30]))]


def check_attention(dev: device.Device, dtype: torch.dtype) -> str:
    """Every available backend against dense fp64 SDPA, outputs and gradients."""
    tol = ATTENTION_TOL[dtype]
    done = []
    for backend in attention.available(dev.torch, dtype, 64):
        for name, (q, k, v), w in _attention_cases(dev, dtype):
            ins = [t.detach().requires_grad_() for t in (q, k, v)]
            ref_ins = [t.detach().double().requires_grad_() for t in (q, k, v)]
            out = attention.run_backend(backend, *ins, w)
            ref = _dense(*ref_ins, w)
            grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dev.torch)
            out.backward(grad.to(out.dtype))
            ref.backward(grad)
            for what, got, want in [("output", out, ref)] + [(f"d{n}", a.grad, b.grad)
                                                             for n, a, b in zip("qkv", ins, ref_ins)]:
                err = float((got.detach().double() - want.detach()).norm() / want.detach().norm())
                if not err <= tol:
                    raise AssertionError(f"{backend}, {name}: {what} relative error {err:.2e} > {tol:g}")
        done.append(backend)
    return f"{', '.join(done)} in {dtype}: plain, GQA and bottom-right windows, forward and backward"


# ------------------------------------------------------------------------------------- collectives
def check_collectives(dev: device.Device, timeout: timedelta) -> str:
    rank, world = dist.get_rank(), dist.get_world_size()
    # uneven all_to_all_single: rank r sends r + p + 1 values to peer p, each value = 100 * r + p
    send_splits = [rank + p + 1 for p in range(world)]
    recv_splits = [q + rank + 1 for q in range(world)]
    send = torch.cat([torch.full((n,), 100.0 * rank + p, device=dev.torch) for p, n in enumerate(send_splits)])
    recv = torch.empty(sum(recv_splits), device=dev.torch)
    dist.all_to_all_single(recv, send, recv_splits, send_splits)
    want = torch.cat([torch.full((n,), 100.0 * q + rank, device=dev.torch) for q, n in enumerate(recv_splits)])
    if not torch.equal(recv, want):
        raise AssertionError("all_to_all_single with uneven splits delivered wrong values")
    # batch_isend_irecv around a ring, both directions at once (the pipeline's pattern)
    if world > 1:
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        a, b = torch.empty(3, device=dev.torch), torch.empty(3, device=dev.torch)
        ops = [dist.P2POp(dist.isend, torch.full((3,), float(rank), device=dev.torch), nxt),
               dist.P2POp(dist.isend, torch.full((3,), -float(rank), device=dev.torch), prv),
               dist.P2POp(dist.irecv, a, prv), dist.P2POp(dist.irecv, b, nxt)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        if a.tolist() != [float(prv)] * 3 or b.tolist() != [-float(nxt)] * 3:
            raise AssertionError("batch_isend_irecv around the ring delivered wrong values")
    # subgroups: every rank creates every group (collective), the even and odd ranks reduce within theirs
    groups = [dist.new_group([r for r in range(world) if r % 2 == k], timeout=timeout) for k in (0, 1)]
    x = torch.tensor([float(rank)], device=dev.torch)
    dist.all_reduce(x, group=groups[rank % 2])
    if x.item() != sum(r for r in range(world) if r % 2 == rank % 2):
        raise AssertionError("all_reduce in a new subgroup gave a wrong sum")
    return f"uneven all_to_all_single, batch_isend_irecv, new_group on {world} {dev.backend} ranks"


# ------------------------------------------------------------------------------------------- plans
def doctor_plans(world: int) -> dict[str, Plan]:
    """One small plan per runtime path, on `world` ranks (paths that need more ranks than there are are left out)."""
    pairs = [list(range(r, r + 2)) for r in range(0, world - 1, 2)]
    out = {"plain": build_plan(0, "plain", world, [(1, 1, 1, [r], [[40, 23], [64]]) for r in range(world)], 0)}
    if world >= 4:
        rest = [(1, 1, 1, [r], [[30, 9]]) for r in range(4, world)]
        out["TP+PP"] = build_plan(1, "TP+PP", world, [(2, 2, 1, [0, 1, 2, 3], [[50, 14], [33], [7, 7, 7]])] + rest, 100)
    if pairs:
        out["CP"] = build_plan(2, "CP", world, [(1, 1, 2, p, [[61, 12], [25]]) for p in pairs], 200)
        seq = build_plan(3, "Seq1F1B", world, [(1, 2, 1, p, [[45, 19], [30, 2], [16]]) for p in pairs], 300)
        for pipe in seq.pipelines:
            for mb, bounds in zip(pipe.micro_batches, ([0, 30, 64], [0, 16, 32], [0, 6, 16]), strict=True):
                mb.splits = bounds
        out["Seq1F1B"] = seq
        out["CAD"] = _cad_plan(world)
    return out


def _cad_plan(world: int) -> Plan:
    """A CAD plan on `world` <1,1,1> replicas from the planner itself, with attention moved between replicas
    (no network in the profile, so moving costs nothing and the planner balances freely)."""
    from hydraplan.core.batch import as_batch
    from hydraplan.core.cluster import Cluster
    from hydraplan.engine.cad_plan import cad_plan
    from hydraplan.solve.cad import plan_cad
    from hydraplan.store.profiles import load_profile

    cluster = Cluster.of(load_profile("cpu-tiny").model_copy(update={"network": None}), world)
    lengths = np.array([90, 9, 41, 6, 17, 3, 30, 12, 55, 4][: max(4, 2 * world)])
    b = as_batch(lengths, 4)
    b = type(b)(iteration=4, ids=b.ids + 400, lengths=b.lengths)
    return cad_plan(b, plan_cad(cluster, cluster.scheme((1, 1, 1)), b.lengths, 2, exact=False, ids=b.ids.tolist()),
                    cluster)


# ----------------------------------------------------------------------------------- replay, memory
def check_replays(dev: device.Device, dtype_name: str, timeout: timedelta) -> str:
    """Each plan trained once and verified like run_plan --verify."""
    cfg = get_config(MODEL)
    dtype = device.DTYPES[dtype_name]
    data = TokenData(cfg.vocab)
    replayer = Replayer(cfg, data, dtype, 0, 1e-3, dev, timeout, keep_grad=dtype != torch.float64)
    verifier = Verifier(replayer, cfg, data, 0, 1e-3, dtype)
    worst: list[str] = []
    for name, plan in doctor_plans(dist.get_world_size()).items():
        verifier.before()
        replayer.step(plan)
        box = [verifier.compare(plan)]
        dist.broadcast_object_list(box, src=0)
        tol = tolerance(dtype_name, cfg.layers, plan)
        if box[0] > tol:
            raise AssertionError(f"{name}: {verifier.what} {box[0]:.2e} exceeds {tol:.2e}")
        worst.append(f"{name} {box[0]:.1e}")
    return f"{verifier.what} in {dtype_name} against fp64: " + ", ".join(worst)


def memory_profile(dev: device.Device) -> Profile:
    """The memory model the measured peaks are held to (module docstring)."""
    from hydraplan.store.profiles import load_profile

    if dev.kind != "cuda":
        return load_profile("cpu-tiny")
    from hydraplan.core.analytic import analytic_memory, model_info
    from hydraplan.core.hardware import ModelSpec

    cfg = get_config(MODEL)
    spec = ModelSpec(MODEL, MODEL, cfg.layers, cfg.hidden, cfg.ffn, cfg.heads, cfg.vocab, "runtime/model.py tiny")
    schemes = []
    for tp, pp in ((1, 1), (2, 2)):
        mem = analytic_memory(spec, tp, pp, 1, gpus_per_node=torch.cuda.device_count())
        local = {k: v for k, v in mem.local_terms.items() if k != "communicators"}  # NCCL's own cudaMalloc
        mem = mem.model_copy(update={"local_terms": local, "local_bytes": sum(local.values())})
        schemes.append(Scheme(tp=tp, pp=pp, cp=1, max_len=CUDA_MEMORY_TOKENS, util_len=1,
                              time=TimeCoeffs(a=0, b=0, c=0), memory=mem))
    return Profile(name="tiny-analytic", gpu=GPUInfo(name=dev.describe(), memory_gib=1), model=model_info(spec),
                   schemes=schemes)


def check_memory(dev: device.Device, dtype_name: str, timeout: timedelta) -> str:
    """Each rank's peak over a step at MaxLen (the second run of each plan: the first warms the allocator up)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    profile = memory_profile(dev)
    if dev.kind != "cuda":
        map_large_allocations()  # stable heap statistics (runtime/memstats.py)
    ml = {s.key[:2]: s.max_len for s in profile.schemes if s.recompute == "none"}
    layouts = {"<1,1,1> x{}".format(world): [(1, 1, 1, [r], [[ml[(1, 1)] // 2, ml[(1, 1)] - ml[(1, 1)] // 2]])
                                             for r in range(world)]}
    if world >= 4 and (2, 2) in ml:
        layouts["<2,2,1>"] = [(2, 2, 1, [0, 1, 2, 3], [[ml[(2, 2)]]] * 2)] + [(1, 1, 1, [r], [[64]]) for r in range(4, world)]
    cfg = get_config(MODEL)
    dtype = device.DTYPES[dtype_name]
    replayer = Replayer(cfg, TokenData(cfg.vocab), dtype, 0, 1e-3, dev, timeout)
    ratios = {}
    for k, (name, pipes) in enumerate(layouts.items()):
        plan = build_plan(10 + k, name, world, pipes, 1000 * (k + 1))
        for _ in range(2):
            held = replayer.master.held_bytes()
            memstats.collect()
            dist.barrier()
            with dev.peak_memory() as reading:
                replayer.step(plan)
        model = rank_model_bytes(plan, world, rank, profile, dtype.itemsize)
        if model:
            ratios[name] = (reading.peak - reading.start + held) / model
    worst = max(ratios, key=ratios.get)
    if ratios[worst] > MEMORY_SLACK:
        raise AssertionError(f"{worst}: peak {ratios[worst]:.2f}x the model ({profile.name}) at MaxLen")
    return f"peak / model ({profile.name}) at MaxLen: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())


def check_activations(dev: device.Device, tokens: int) -> str:
    """Saved bytes per token of one LLaMA-2 7B layer at a `tokens`-token micro-batch against the memory model, every
    (mode, TP) case once."""
    cfg = get_config(saved.PROFILE_MODEL)
    cases = [(mode, tp) for tp in (1, 2) for mode in MODES]
    mine = [(mode, tp, saved.saved_bytes_per_token(cfg, mode, tp, tokens, torch.bfloat16, dev.torch))
            for mode, tp in cases[dist.get_rank()::dist.get_world_size()]]
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    rows = []
    for mode, tp, got in sorted((r for part in every for r in part), key=lambda r: (r[1], MODES.index(r[0]))):
        model = saved.model_bytes_per_token(saved.PROFILE_MODEL, mode, tp)
        beyond = got - saved.uncharged_bytes_per_token(cfg, tp, mode)
        rows.append(f"{mode} TP{tp} {got:,.0f}/{model:,.0f}")
        if not saved.MIN_SHARE * model <= beyond <= model:
            raise AssertionError(f"{mode} recomputation at TP {tp}: a layer keeps {got:,.0f} bytes per token, the model "
                                 f"charges {model:,.0f} (+{got - beyond:,.0f} uncharged statistics)")
    return f"{saved.PROFILE_MODEL} layer at {tokens:,} tokens, bytes per token kept / modeled: " + ", ".join(rows)


# --------------------------------------------------------------------------------------------- run
def environment(dev: device.Device, dtype_name: str) -> dict:
    cuda = dev.kind == "cuda"
    choice = attention.choice_for(dev.torch, device.DTYPES[dtype_name], get_config(MODEL).head_dim)
    return {"torch": torch.__version__, "python": platform.python_version(), "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None, "backend": dev.backend,
            "device": dev.describe(), "ranks": dist.get_world_size(), "dtype": dtype_name,
            "attention": f"{choice.backend} ({choice.reason})"}


def _run(name: str, fn: Callable[[], str], local: bool = False) -> dict:
    """Run a check on every rank; it passes if it passed everywhere (detail: rank 0's, or the first failure).
    A wrong result (AssertionError, raised alike by every rank of a collective check) or any error of a `local`
    check is a failed check; any other error inside collectives ends the job in one line (runtime/faults.py),
    which `hydraplan doctor` reports against the check that was running."""
    try:
        mine = (True, fn())
    except Exception as e:
        if not (local or isinstance(e, AssertionError)):
            raise
        mine = (False, f"rank {dist.get_rank()}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}")
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    failed = [d for ok, d in every if not ok]
    return {"check": name, "passed": not failed, "detail": failed[0] if failed else every[0][1]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--checks", default=",".join(CHECKS))
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--quick", action="store_true", help=f"the activations check at {QUICK_ACTIVATION_TOKENS} tokens")
    args = ap.parse_args(argv)
    timeout = timedelta(seconds=args.timeout_s)
    dev = device.pick()
    device.init_distributed(dev, timeout)
    warm_s = warm_up([None], dev.torch)  # the default group's communicator, before any check (runtime/groups.py)
    watchdog = faults.Watchdog(dist.get_rank(), "doctor")
    dtype_name = device.default_dtype(dev)
    todo = set(args.checks.split(","))
    report = {"environment": environment(dev, dtype_name) | {"warm_up_s": round(warm_s, 3)}, "checks": []}
    steps = [("attention", lambda: check_attention(dev, device.DTYPES[dtype_name]), True),
             ("collectives", lambda: check_collectives(dev, timeout), False),
             ("replay", lambda: check_replays(dev, dtype_name, timeout), False),
             ("memory", lambda: check_memory(dev, dtype_name, timeout), False),
             ("activations", lambda: check_activations(dev, QUICK_ACTIVATION_TOKENS if args.quick else ACTIVATION_TOKENS),
              False)]
    for name, fn, local in steps:
        if name not in todo:
            continue
        try:
            report["checks"].append(_run(name, fn, local))
        except Exception as e:
            watchdog.handle(e, None, None)  # never returns in a job of several ranks
            report["checks"].append({"check": name, "passed": False, "detail": faults.describe(e, 0, None, None, "doctor")})
        if dist.get_rank() == 0:  # after every check: a job that dies later still reports what it did
            Path(args.out).write_text(json.dumps(report, indent=1))
    watchdog.stop()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from hydraplan.runtime.groups import exit_process

    exit_process(main())
