"""The memory model of one rank, measured instead of modeled (Hydraulis appendix C.1): MaxLen of a scheme
from a measured profile's memory, and the bytes a rank holds under a plan.

Stage r of a 1F1B pipeline holds pp - r micro-batches at its peak: pp - r - 1 of them as saved activations
act_r(l) = q*l^2 + p*l (q: attention kernels that materialize scores, ~0 with FlashAttention) and one in its
backward, whose peak peak_r(l) (saved activations plus the backward's working set, read from the allocator's
statistics) is fitted the same way plus a constant (buffers a backward allocates whatever the length); with
fixed bytes F_r the scheme's MaxLen is the largest l with F_r + (pp - r - 1) * act_r(l) + peak_r(l) <= capacity
on every stage. A measured profile carries no memory constants, so its MaxLen holds for any --gpus
(docs/formats.md). The runtime measures the memory at MEMORY_LENGTHS (runtime/profile.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.core.errors import UserError
from hydraplan.core.fit import LENGTH_QUANTUM, PACKED_DOCS
from hydraplan.core.schema import Scheme

MEMORY_LENGTHS = (128, 512, 1024, 2048)


@dataclass(frozen=True)
class StageMemory:
    """One rank's memory measurement: fixed bytes, micro-batches stashed at the 1F1B peak, and the
    activation bytes of one micro-batch at each length."""

    stage: int
    fixed_bytes: float
    stash: int
    lengths: list[int]
    act_bytes: list[float]  # saved for backward by one micro-batch's forward
    peak_bytes: list[float]  # most bytes one micro-batch's forward + backward adds at once (saved + working set)


def activation_fit(lengths: Sequence[int], act_bytes: Sequence[float]) -> tuple[float, float]:
    """(q, p) of act(l) = q*l^2 + p*l, least squares with both nonnegative."""
    l = np.asarray(lengths, dtype=np.float64)
    y = np.asarray(act_bytes, dtype=np.float64)
    (q, p), *_ = np.linalg.lstsq(np.column_stack([l * l, l]), y, rcond=None)
    if q < 0:
        q, p = 0.0, float(l @ y / (l @ l))
    elif p < 0:
        q, p = float((l * l) @ y / ((l * l) @ (l * l))), 0.0
    return float(q), float(p)


def peak_fit(lengths: Sequence[int], peak_bytes: Sequence[float]) -> tuple[float, float, float]:
    """(q, p, r) of peak(l) = q*l^2 + p*l + r, least squares with all three nonnegative (exact NNLS: the best
    of the 8 active sets). r is what a backward allocates whatever the length (its working buffers)."""
    l = np.asarray(lengths, dtype=np.float64)
    y = np.asarray(peak_bytes, dtype=np.float64)
    cols = np.column_stack([l * l, l, np.ones_like(l)])
    best, best_res = np.zeros(3), float(y @ y)
    for mask in range(1, 8):
        use = [k for k in range(3) if mask >> k & 1]
        coef, *_ = np.linalg.lstsq(cols[:, use], y, rcond=None)
        if (coef < 0).any():
            continue
        res = float(np.sum((cols[:, use] @ coef - y) ** 2))
        if res < best_res:
            best, best_res = np.zeros(3), res
            best[use] = coef
    return float(best[0]), float(best[1]), float(best[2])


def stage_max_len(m: StageMemory, capacity_bytes: float) -> int:
    """Largest l with fixed + (stash - 1) * act(l) + peak(l) <= capacity: the stashed micro-batches' saved
    activations, and the one in backward at its peak."""
    qa, pa = activation_fit(m.lengths, m.act_bytes)
    qp, pk, r = peak_fit(m.lengths, m.peak_bytes)
    q, p = (m.stash - 1) * qa + qp, (m.stash - 1) * pa + pk
    free = capacity_bytes - m.fixed_bytes - r
    if free <= 0:
        return 0
    # root of q l^2 + p l = free in the form without cancellation (a fitted q of 1e-18 is q = 0 here)
    return int(2 * free / (p + math.sqrt(p * p + 4 * q * free)))


def scheme_max_len(stages: Sequence[StageMemory], capacity_bytes: float) -> int:
    """MaxLen of a scheme: the tightest stage, a multiple of LENGTH_QUANTUM."""
    ml = min(stage_max_len(m, capacity_bytes) for m in stages) // LENGTH_QUANTUM * LENGTH_QUANTUM
    if ml < PACKED_DOCS * LENGTH_QUANTUM:
        raise UserError(f"--memory-gib: {capacity_bytes / 2**30:g} GiB leaves room for only {ml} tokens per micro-batch "
                        f"(need at least {PACKED_DOCS * LENGTH_QUANTUM})")
    return ml


def rank_memory_bytes(scheme: Scheme, stage: int, gpus: int, tokens: int) -> float | None:
    """The profile's memory model for one rank of `scheme` on `stage` whose largest micro-batch has `tokens`:
    a measured profile's fixed + stash * act(tokens) of that stage (measured_memory), an analytic one's
    sharded / gpus + local + act_bytes_per_token * tokens (its worst stage). None: the profile has neither."""
    measured = getattr(scheme, "measured_memory", None)
    if measured:
        m = next((e for e in measured if e["stage"] == stage), None)
        if m is None:
            return None
        act = m["act_bytes_per_token2"] * tokens**2 + m["act_bytes_per_token"] * tokens
        if "peak_bytes_per_token" not in m:  # profiles measured before the peak: all stashed micro-batches alike
            return m["fixed_bytes"] + m["stash"] * act
        peak = m["peak_bytes_per_token2"] * tokens**2 + m["peak_bytes_per_token"] * tokens + m["peak_bytes"]
        return m["fixed_bytes"] + (m["stash"] - 1) * act + peak
    if scheme.memory is not None:
        mem = scheme.memory
        return mem.sharded_bytes / gpus + mem.local_bytes + mem.act_bytes_per_token * tokens
    return None
