"""The optimization phase between iterations: what LNK pull/push costs and how much of it compute hides.

docs/formats.md, "End-to-end estimate". Every GPU of pipeline j (scheme tp, pp, cp) pulls its stage's
parameter slice, 2*Phi/(tp*pp) bf16 bytes, from owners spread over all N GPUs of the job, and pushes the
same bytes of gradients back. A fraction G/N of the owners share its node (G = min(gpus_per_node, N)), so
the bytes move at the harmonic mix of the intra- and inter-node bandwidths. The pull overlaps the forward
(a third of the pipeline's propagation time), the push the backward (two thirds); what sticks out is
exposed. A pipeline with no micro-batch moves nothing. A homogeneous layout pays the same: ZeRO's
all-gather and reduce-scatter move the same slice bytes.

Pure functions, vectorized over pipelines, so the proposal DP, the selection and `compare` all share them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np

from hydraplan.core.schema import Profile

WIRE_BYTES_PER_PARAM = 2  # bf16 parameters and gradients on the wire
FORWARD_SHARE = 1.0 / 3.0  # the forward's share of a pipeline's propagation time
BACKWARD_SHARE = 1.0 - FORWARD_SHARE  # the backward's (2/3): the one spelling every end-to-end formula uses


def has_sync_model(profile: Profile) -> bool:
    """Whether the profile states what the end-to-end estimate needs (model.params and network)."""
    return profile.model.params is not None and profile.network is not None


def effective_bandwidth_GBps(profile: Profile, gpus: int) -> float:
    """Per-GPU GB/s of a pull or push whose owners are spread evenly over all `gpus` GPUs."""
    assert profile.network is not None
    g = min(profile.gpu.gpus_per_node, gpus)
    local = g / gpus
    return 1.0 / (local / profile.network.intra_node_GBps + (1.0 - local) / profile.network.inter_node_GBps)


def transfer_s(profile: Profile, tp: int | np.ndarray, pp: int | np.ndarray, gpus: int) -> np.ndarray | float:
    """Seconds of one direction (pull or push) for one GPU of a <tp, pp, *> pipeline; 0 without a sync model."""
    if not has_sync_model(profile):
        return np.zeros(np.shape(tp)) if np.ndim(tp) else 0.0
    slice_bytes = WIRE_BYTES_PER_PARAM * profile.model.params / (np.asarray(tp) * np.asarray(pp))
    out = slice_bytes / (effective_bandwidth_GBps(profile, gpus) * 1e9)
    return out if np.ndim(out) else float(out)


def exposed_s(transfer: np.ndarray | float, propagation: np.ndarray | float) -> np.ndarray | float:
    """The part of a pipeline's pull and push its forward and backward cannot hide (0 for an idle pipeline)."""
    t = np.asarray(transfer, dtype=np.float64)
    p = np.asarray(propagation, dtype=np.float64)
    out = np.maximum(0.0, t - FORWARD_SHARE * p) + np.maximum(0.0, t - BACKWARD_SHARE * p)
    out = np.where(p > 0, out, 0.0)
    return out if out.ndim else float(out)


class IterationEstimate(NamedTuple):
    iteration_s: float  # max over pipelines of propagation + exposed sync
    sync_s: float  # exposed sync of the first pipeline attaining it
    exposed_s: list[float]  # per pipeline


def iteration_estimate(profile: Profile, gpus: int, keys: Sequence[tuple[int, int, int]],
                       propagation_s: Sequence[float]) -> IterationEstimate:
    """The end-to-end estimate of one plan: pipelines given by their (tp, pp, cp) and canonical times."""
    if not keys:
        return IterationEstimate(0.0, 0.0, [])
    tp = np.array([k[0] for k in keys], dtype=np.float64)
    pp = np.array([k[1] for k in keys], dtype=np.float64)
    prop = np.asarray(propagation_s, dtype=np.float64)
    exp = np.asarray(exposed_s(transfer_s(profile, tp, pp, gpus), prop), dtype=np.float64)
    total = prop + exp
    j = int(np.argmax(total))  # first maximum: plan order on a tie
    return IterationEstimate(float(total[j]), float(exp[j]), exp.tolist())


def end_to_end_s(transfer: np.ndarray | float, propagation: np.ndarray | float) -> np.ndarray | float:
    """propagation + exposed sync = max(2t, t + 2p/3, p) for p > 0 and 0 for an idle pipeline: nondecreasing
    in p (and in t), which is what lets the proposal and pruning map propagation bounds and budgets through it."""
    t = np.asarray(transfer, dtype=np.float64)
    p = np.asarray(propagation, dtype=np.float64)
    out = np.where(p > 0, np.maximum(2.0 * t, busy_s(t, p)), 0.0)
    return out if out.ndim else float(out)


def busy_s(transfer: np.ndarray | float, propagation: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """h(t, p) = max(p, t + 2p/3): end_to_end_s of a pipeline known to hold work, without the 2t floor that no
    dispatch changes once it has some. Strictly increasing in p, so the dispatch minimizes it as it would p."""
    return np.maximum(propagation, transfer + BACKWARD_SHARE * propagation, out=out)


def busy_float_s(transfer: float, propagation: float) -> float:
    """busy_s of one pipeline in Python floats (the heap greedy's inner loop, where numpy scalars are slow)."""
    return max(propagation, transfer + BACKWARD_SHARE * propagation)


def propagation_budget_s(transfer: np.ndarray | float, budget: np.ndarray | float) -> np.ndarray | float:
    """The largest propagation p > 0 whose end-to-end time is within `budget`: min(Y, 1.5 (Y - t)), -inf when
    even an instant pipeline exceeds it (Y < 2t). The inverse of end_to_end_s on p > 0; with t = 0 it is Y."""
    t = np.asarray(transfer, dtype=np.float64)
    y = np.asarray(budget, dtype=np.float64)
    out = np.where(y >= 2.0 * t, np.minimum(y, (y - t) / BACKWARD_SHARE), -np.inf)
    return out if out.ndim else float(out)


Objective = Literal["end-to-end", "propagation"]
OBJECTIVES: tuple[str, ...] = ("end-to-end", "propagation")


def check_objective(objective: str) -> None:
    from hydraplan.core.errors import UserError

    if objective not in OBJECTIVES:
        raise UserError(f"--objective must be end-to-end or propagation (got {objective!r})")


def objective_transfer_s(profile: Profile, tp: np.ndarray, pp: np.ndarray, gpus: int, objective: str) -> np.ndarray:
    """Per-pipeline transfer the planner optimizes with: the sync model's for end-to-end, zeros (so every
    end-to-end mapping is the identity and the plans are the propagation objective's) otherwise."""
    check_objective(objective)
    tp, pp = np.asarray(tp, dtype=np.float64), np.asarray(pp, dtype=np.float64)
    if objective == "propagation":
        return np.zeros(tp.shape)
    return np.asarray(transfer_s(profile, tp, pp, gpus), dtype=np.float64).reshape(tp.shape)
