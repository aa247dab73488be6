"""`--verify` (run_plan, hydraplan doctor): a replay against single-process fp64 training on the same batches.

fp64 runs: the max abs parameter difference after every step against single-process fp64 training.
fp32/bf16 runs: the relative L2 error of the iteration's summed gradient against an fp64 reference at the
same weights (a parameter difference says little here: AdamW's first steps move every weight by ~lr whatever
the gradient's precision), held to `tolerance`, an error model of the dtype, the depth, TP and the tokens summed:

    err^2 = u_c^2 * (A + L * (B + D * (tp - 1))) + u_a^2 * n,   tolerance = SAFETY * err

u_c is the compute dtype's unit roundoff (bf16 2^-8, fp32 2^-24), u_a the accumulation dtype's (fp32: every sum
over tokens -- GEMM reductions, the embedding's and norms' weight gradients, micro-batches in the GradBuffer, the
owners' push sums -- runs in fp32), L the decoder layers, tp the plan's largest TP degree and n its tokens.
Each rounding of a weight or activation adds an independent relative error, so their squares add up: a fixed
part for the embedding, final norm, head and loss (A), a part per layer (B), and per layer the TP partial sums
the reduce-scatters add in the compute dtype (D per extra rank, as Megatron's SP collectives do in bf16). A, B,
D are fitted on the tiny model (hidden 32) in bf16 against fp64: 2, 4, 8, 16 layers at 2K tokens gave
err^2/u^2 = 1.57, 2.35, 3.83, 7.79 (A 0.5, B 0.45), and TP 4 added 1.45 at 4 layers and 19K tokens (D 0.12);
with the embedding's gradient summed in fp32 (runtime/model.py) the error no longer grows with the tokens
(6.0e-3 at 2K, 6.2e-3 at 19K, 4 layers), so the length enters only through fp32 sums. SAFETY 1.6 leaves room
for the seed-to-seed spread and still fails a bf16 GradBuffer over 64 micro-batches (tests/test_grads.py).
Whether B and D hold at LLaMA widths has not been measured (they should not grow with width: each rounding is
per element and every reduction over the hidden or token dimension accumulates in fp32).

On CUDA the fp64 reference's attention (and an fp64 run's) takes the math backend, which materializes a
[documents, heads, l, l] score tensor per group of equal documents: `fp64_attention_refusal` says when a plan
is too long for it, before anything runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from hydraplan.core.schema import Plan
from hydraplan.runtime import kernels
from hydraplan.runtime.batches import TokenData
from hydraplan.runtime.model import ModelConfig
from hydraplan.runtime.reference import Reference
from hydraplan.runtime.replay import Replayer

EXACT_TOLERANCE = 1e-9  # fp64: max abs parameter difference against the fp64 reference
UNIT_ROUNDOFF = {"fp32": 2.0 ** -24, "bf16": 2.0 ** -8}
ROUNDING_FIXED, ROUNDING_PER_LAYER, ROUNDING_PER_LAYER_AND_TP_RANK = 0.5, 0.45, 0.12  # A, B, D (fitted, above)
SAFETY = 1.6


def tolerance(dtype: str, layers: int, plan: Plan) -> float:
    """--verify's default bound on this plan's iteration (the module docstring's error model)."""
    if dtype == "fp64":
        return EXACT_TOLERANCE
    tp = max(p.tp for p in plan.pipelines)
    tokens = sum(s.length for s in plan.batch)
    roundings = ROUNDING_FIXED + layers * (ROUNDING_PER_LAYER + ROUNDING_PER_LAYER_AND_TP_RANK * (tp - 1))
    return SAFETY * math.sqrt(UNIT_ROUNDOFF[dtype] ** 2 * roundings + UNIT_ROUNDOFF["fp32"] ** 2 * tokens)
MATH_SCORE_COPIES = 3  # scores, probabilities and, in backward, their gradient live together (fp64: 8 bytes each)


def fp64_attention_refusal(plans: Sequence[tuple[str, Plan]], heads: int, capacity_bytes: float) -> str | None:
    """Why fp64 attention on a CUDA device of `capacity_bytes` cannot run these plans (None: it can): the
    largest group of equal-length documents of a micro-batch needs more than half of the device for its
    [documents, heads, l, l] fp64 scores."""
    worst = None
    for source, plan in plans:
        lengths = {s.id: s.length for s in plan.batch}
        for i, p in enumerate(plan.pipelines):
            for j, mb in enumerate(p.micro_batches):
                counts: dict[int, int] = {}
                for sid in mb.seqs:
                    counts[lengths[sid]] = counts.get(lengths[sid], 0) + 1
                for n, g in counts.items():
                    need = MATH_SCORE_COPIES * g * heads * n * n * 8
                    if worst is None or need > worst[0]:
                        worst = (need, source, i, j, g, n)
    if worst is None or worst[0] <= capacity_bytes / 2:
        return None
    need, source, i, j, g, n = worst
    return (f"{source}: field pipelines.{i}.micro_batches.{j}: {g} document(s) of {n} tokens; fp64 attention on CUDA "
            f"(--dtype fp64, or --verify's fp64 reference) runs the math backend, which holds [{g}, {heads}, {n}, {n}] "
            f"fp64 scores ({need / 2**30:.1f} GiB, more than half of the device's {capacity_bytes / 2**30:.0f} GiB): "
            "verify shorter plans, or on CPU")


class Verifier:
    """Rank 0 trains the same iterations in one process in fp64 (runtime/reference.py); `compare` is collective."""

    def __init__(self, replayer: Replayer, cfg: ModelConfig, data: TokenData, seed: int, lr: float, dtype: torch.dtype):
        self.replayer = replayer
        self.exact = dtype == torch.float64
        self.reference = (Reference(cfg, data, seed, torch.float64, lr, replayer.device) if dist.get_rank() == 0
                          else None)
        self._before: torch.Tensor | None = None

    @property
    def what(self) -> str:
        return "max_abs_param_diff" if self.exact else "grad_rel_err"

    def before(self) -> None:
        """Call before the replayed step (collective): fp32/bf16 compare gradients at these weights."""
        self._before = None if self.exact else self.replayer.gather_weights()

    def compare(self, plan: Plan) -> float | None:
        """After the replayed step (collective): the difference on rank 0, None elsewhere."""
        got = self.replayer.gather_weights() if self.exact else self.replayer.gather_grads()
        if self.reference is None:
            return None
        with kernels.using(kernels.EAGER):  # the reference stays eager under run_plan --compile
            if self.exact:
                self.reference.step(plan)
                return float((got - self.reference.flat_weights()).abs().max())
            want = self.reference.gradient(plan, self._before.double())
        return float((got.double() - want).norm() / want.norm())
