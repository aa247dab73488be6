"""The CAD cost model: bytes and bandwidths between replicas, the attention cost of a query chunk, and the
seconds a task's queries and its document's keys and values take to move (the package docstring states it)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hydraplan.core.schema import Profile, Scheme

BF16 = 2


@dataclass(frozen=True)
class CommModel:
    """Per-layer bytes per token and the pairwise bandwidth of one CAD layout."""

    token_bytes: float  # q: bytes per token per layer of Q (= of K, V, O and their gradients) per TP rank
    layers: int  # decoder layers per stage
    bw: np.ndarray  # d x d bytes/s between ranks (inf on the diagonal)

    def seconds(self, bytes_per_layer: np.ndarray) -> np.ndarray:
        return bytes_per_layer * self.layers


def comm_model(profile: Profile, scheme: Scheme, d: int) -> CommModel:
    """Bandwidths between the d replicas of `scheme` placed contiguously (replica j on GPUs [j*g, (j+1)*g))."""
    g, gpn = scheme.gpus, profile.gpu.gpus_per_node
    node = (np.arange(d) * g) // gpn
    same = node[:, None] == node[None, :]
    if profile.network is None:
        intra, inter = math.inf, math.inf
    else:
        intra, inter = profile.network.intra_node_GBps * 1e9, profile.network.inter_node_GBps * 1e9
    bw = np.where(same, intra, inter)
    np.fill_diagonal(bw, math.inf)
    layers = profile.model.layers // scheme.pp
    return CommModel(BF16 * profile.model.hidden / scheme.tp, layers, bw)


def task_cost(scheme: Scheme, start: int | np.ndarray, end: int | np.ndarray) -> np.ndarray | float:
    """Attention seconds of query chunk [start, end) with its causal prefix: a*(end^2 - start^2)."""
    s, e = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    out = scheme.time.a * (e * e - s * s)
    return out if out.ndim else float(out)


def prefix_tokens(pieces: Sequence[tuple[int, int, int, int]], doc: int, end: int, d: int) -> np.ndarray:
    """Per rank, how many tokens of doc's [0, end) it holds (pieces: (doc, start, end, home))."""
    out = np.zeros(d, dtype=np.float64)
    for pd, ps, pe, ph in pieces:
        if pd == doc and ps < end:
            out[ph] += min(pe, end) - ps
    return out


def pair_comm(cm: CommModel, tokens: np.ndarray, x: int) -> np.ndarray:
    """Per rank, seconds spent moving 2 * tokens[h] rows of q bytes each way between every rank h and
    executor x (one direction's bytes: links are full duplex and both directions carry the same);
    x itself pays the sum (it talks to every h)."""
    sec = cm.seconds(2.0 * tokens * cm.token_bytes / cm.bw[:, x])
    sec[x] = 0.0
    sec[x] = sec.sum()
    return sec


def q_comm(cm: CommModel, n: int, home: int, x: int) -> np.ndarray:
    """Per rank, seconds of a task's queries and outputs: home -> x carries Q (fwd) and dO (bwd), x -> home
    O (fwd) and dQ (bwd): 2 rows each way per query."""
    tokens = np.zeros(cm.bw.shape[0])
    tokens[home] = n
    return pair_comm(cm, tokens, x)


def kv_comm(cm: CommModel, kv: np.ndarray, x: int) -> np.ndarray:
    """Per rank, seconds of the K and V rows executor x reads (forward) and their gradients it returns
    (backward): kv[h] tokens from h, 2 rows each way."""
    return pair_comm(cm, kv, x)


def task_comm(cm: CommModel, kv: np.ndarray, n: int, home: int) -> np.ndarray:
    """C[x, r]: seconds rank r communicates for one task alone on executor x (its queries and its whole
    prefix's K/V). Executors de-duplicate K/V of one document (`StepProblem.loads`); this is one task's share."""
    d = kv.size
    return np.stack([q_comm(cm, n, home, x) + kv_comm(cm, kv, x) for x in range(d)])
