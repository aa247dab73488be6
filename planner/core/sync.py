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
from typing import NamedTuple

import numpy as np

from hydraplan.core.schema import Network, Profile

WIRE_BYTES_PER_PARAM = 2  # bf16 parameters and gradients on the wire
FORWARD_SHARE = 1.0 / 3.0  # the forward's share of a pipeline's propagation time
BACKWARD_SHARE = 1.0 - FORWARD_SHARE  # the backward's (2/3): the one spelling every end-to-end formula uses


def has_sync_model(profile: Profile) -> bool:
    """Whether the profile states what the end-to-end estimate needs (model.params and network)."""
    return profile.model.params is not None and profile.network is not None


def effective_bandwidth_GBps(network: Network, gpus_per_node: int, gpus: int) -> float:
    """Per-GPU GB/s of a pull or push whose owners are spread evenly over all `gpus` GPUs."""
    g = min(gpus_per_node, gpus)
    local = g / gpus
    return 1.0 / (local / network.intra_node_GBps + (1.0 - local) / network.inter_node_GBps)


def transfer_s(params: int | None, bandwidth_GBps: float | None, tp: int | np.ndarray,
               pp: int | np.ndarray) -> np.ndarray | float:
    """Seconds of one direction (pull or push) for one GPU of a <tp, pp, *> pipeline moving its slice of
    `params` parameters at `bandwidth_GBps`; 0 without a sync model (either None)."""
    if params is None or bandwidth_GBps is None:
        return np.zeros(np.shape(tp)) if np.ndim(tp) else 0.0
    slice_bytes = WIRE_BYTES_PER_PARAM * params / (np.asarray(tp) * np.asarray(pp))
    out = slice_bytes / (bandwidth_GBps * 1e9)
    return out if np.ndim(out) else float(out)


def exposed_pull_s(transfer: np.ndarray | float, propagation: np.ndarray | float) -> np.ndarray:
    """The part of the parameter pull the forward (FORWARD_SHARE of the propagation) cannot hide."""
    return np.maximum(0.0, np.asarray(transfer, dtype=np.float64) - FORWARD_SHARE * np.asarray(propagation, dtype=np.float64))


def exposed_push_s(transfer: np.ndarray | float, propagation: np.ndarray | float) -> np.ndarray:
    """The part of the gradient push the backward (the rest of the propagation) cannot hide."""
    t, p = np.asarray(transfer, dtype=np.float64), np.asarray(propagation, dtype=np.float64)
    return np.maximum(0.0, t - BACKWARD_SHARE * p)


def exposed_s(transfer: np.ndarray | float, propagation: np.ndarray | float) -> np.ndarray | float:
    """The part of a pipeline's pull and push its forward and backward cannot hide (0 for an idle pipeline)."""
    p = np.asarray(propagation, dtype=np.float64)
    out = np.where(p > 0, exposed_pull_s(transfer, p) + exposed_push_s(transfer, p), 0.0)
    return out if out.ndim else float(out)


class IterationEstimate(NamedTuple):
    iteration_s: float  # max over pipelines of propagation + exposed sync
    sync_s: float  # exposed sync of the first pipeline attaining it
    exposed_s: list[float]  # per pipeline


def iteration_estimate(transfer: np.ndarray | Sequence[float], propagation_s: Sequence[float]) -> IterationEstimate:
    """The end-to-end estimate of one plan from its pipelines' transfers and canonical times."""
    prop = np.asarray(propagation_s, dtype=np.float64)
    if prop.size == 0:
        return IterationEstimate(0.0, 0.0, [])
    exp = np.asarray(exposed_s(np.asarray(transfer, dtype=np.float64), prop), dtype=np.float64)
    total = prop + exp
    j = int(np.argmax(total))  # first maximum: plan order on a tie
    return IterationEstimate(float(total[j]), float(exp[j]), exp.tolist())


def charges(transfer: np.ndarray | Sequence[float] | None, n: int) -> np.ndarray:
    """The one encoding of what the objective charges for sync, per scheme or pipeline: seconds of one direction,
    0 where nothing is charged (the propagation objective, or no sync model: Cluster.charged_s). A solver argument
    left out (None) means nothing charged."""
    return np.zeros(n) if transfer is None else np.asarray(transfer, dtype=np.float64)


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
