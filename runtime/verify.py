"""`--verify` (run_plan, hydraplan doctor): a replay against single-process fp64 training on the same batches.

fp64 runs: the max abs parameter difference after every step against single-process fp64 training.
fp32/bf16 runs: the relative L2 error of the iteration's summed gradient against an fp64 reference at the
same weights (a parameter difference says little here: AdamW's first steps move every weight by ~lr whatever
the gradient's precision). Tolerances (TOLERANCE): bf16 1e-2. bf16 compute with fp32 accumulation stays
below it however many micro-batches add up (weights and activations rounded to bf16, and each pipeline's
gradient rounded once more to bf16 when LNK pushes it), while accumulating in bf16 grows past it as
micro-batches add up (tests/test_grads.py measures both on the tiny model), so 1e-2 passes the former and
fails the latter on long accumulations; on short ones the accumulation error hides in bf16 compute's own and
no tolerance can separate them.

On CUDA the fp64 reference's attention (and an fp64 run's) takes the math backend, which materializes a
[documents, heads, l, l] score tensor per group of equal documents: `fp64_attention_refusal` says when a plan
is too long for it, before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from hydraplan.core.schema import Plan
from hydraplan.runtime.batches import TokenData
from hydraplan.runtime.model import ModelConfig
from hydraplan.runtime.reference import Reference
from hydraplan.runtime.replay import Replayer

TOLERANCE = {"fp64": 1e-9, "fp32": 1e-5, "bf16": 1e-2}
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
        if self.exact:
            self.reference.step(plan)
            return float((got - self.reference.flat_weights()).abs().max())
        want = self.reference.gradient(plan, self._before.double())
        return float((got.double() - want).norm() / want.norm())
