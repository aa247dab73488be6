"""Fitting a profile's numbers to measurements: T(l) = a*l^2 + b*l + c to timings (appendix C.2) on the
grid they are measured on, and the LNK bandwidth to pull/push times.

Grid. Timing runs at TIME_FRACTIONS of the scheme's MaxLen (multiples of LENGTH_QUANTUM), each once as one
sequence and once as PACKED_DOCS equal documents. a, b, c are fitted on all of them (fit_micro_batches, NNLS
on relative error): plans are made of packed micro-batches, and a packing of the same total as a single
sequence separates the quadratic from the linear term. The worst error on the packings alone tests the premise
that a packed micro-batch costs sum(a*l_i^2 + b*l_i) + c (a backend attending across documents would cost
a*(sum l_i)^2).

Network. LNK pull and push of homogeneous layouts at the real slice sizes are fitted to the one bandwidth
with which hydraplan.core.sync.transfer_s reproduces them (the end-to-end model of docs/formats.md has no
latency term, so at these sizes latency is folded into it). One node is measured; inter_node_GBps is set
equal to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from hydraplan.core.schema import TimeCoeffs
from hydraplan.core.sync import WIRE_BYTES_PER_PARAM

TIME_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 1.0)
PACKED_DOCS = 4
LENGTH_QUANTUM = 16


# ------------------------------------------------------------------------------------------- fitting
class TimeFit(NamedTuple):
    a: float
    b: float
    c: float
    r2: float
    worst_rel_err: float


def fit_time_coeffs(lengths: np.ndarray | Sequence[float], seconds: np.ndarray | Sequence[float]) -> TimeFit:
    """Nonnegative least-squares fit of T(l) = a*l^2 + b*l + c to measured timings (appendix C.2).

    Minimizes the squared *relative* error, so short micro-batches (milliseconds) weigh as much as long
    ones (seconds). Exact NNLS: the optimum is the unconstrained fit on some subset of the three terms,
    so every subset is tried and the best nonnegative one kept (no scipy needed).
    """
    l = np.asarray(lengths, dtype=np.float64).ravel()
    return _fit_terms(l * l, l, seconds)


def fit_micro_batches(micro_batches: Sequence[Sequence[int]], seconds: np.ndarray | Sequence[float]) -> TimeFit:
    """`fit_time_coeffs` on timings of packed micro-batches: T(m) = a*sum(l_i^2) + b*sum(l_i) + c. Packings
    of equal total length pin the linear term, which single sequences alone leave to noise."""
    sq = np.array([float(np.sum(np.square(np.asarray(m, dtype=np.float64)))) for m in micro_batches])
    lin = np.array([float(np.sum(m)) for m in micro_batches], dtype=np.float64)
    return _fit_terms(sq, lin, seconds)


def _fit_terms(sq: np.ndarray, lin: np.ndarray, seconds: np.ndarray | Sequence[float]) -> TimeFit:
    l = lin
    y = np.asarray(seconds, dtype=np.float64).ravel()
    if l.size != y.size or l.size == 0:
        raise ValueError(f"fit_time_coeffs: need equally many lengths and timings (got {l.size} and {y.size})")
    if np.any(y <= 0) or np.any(l <= 0):
        raise ValueError("fit_time_coeffs: lengths and timings must be positive")
    X = np.column_stack([sq, l, np.ones_like(l)]) / y[:, None]
    scale = np.abs(X).max(axis=0)
    Xs = X / scale
    ones = np.ones_like(y)
    best_coef, best_sse = np.zeros(3), float(ones @ ones)
    for cols in ((0, 1, 2), (0, 1), (0, 2), (1, 2), (0,), (1,), (2,)):
        sub, *_ = np.linalg.lstsq(Xs[:, cols], ones, rcond=None)
        if np.any(sub < 0):
            continue
        resid = ones - Xs[:, cols] @ sub
        sse = float(resid @ resid)
        if sse < best_sse:
            best_sse = sse
            best_coef = np.zeros(3)
            best_coef[list(cols)] = sub
    a, b, c = (best_coef / scale).tolist()
    pred = a * sq + b * l + c
    sst = float(((y - y.mean()) ** 2).sum())
    sse_abs = float(((y - pred) ** 2).sum())
    r2 = 1.0 - sse_abs / sst if sst > 0 else float(sse_abs == 0.0)
    return TimeFit(a, b, c, r2, float(np.max(np.abs(pred - y) / y)))


class Increments(NamedTuple):
    a: float
    b: float
    c: float
    worst_rel_err: float


def fit_increments(lengths: np.ndarray, base: np.ndarray, exposed: np.ndarray) -> Increments:
    """Nonnegative increments (a, b, c) of a time whose exact part `base` is known and whose `exposed` part (>= 0,
    no polynomial) is not: minimizes the relative error of base + a*l^2 + b*l + c against base + exposed (exact NNLS
    over the active sets, as `fit_time_coeffs`). The base's own coefficients stay as they are: a fit that could move
    them would trade a physical term for a fitted one. worst_rel_err: over the lengths given."""
    l = np.asarray(lengths, dtype=np.float64).ravel()
    e = np.asarray(exposed, dtype=np.float64).ravel()
    total = np.asarray(base, dtype=np.float64).ravel() + e
    X = np.column_stack([l * l, l, np.ones_like(l)]) / total[:, None]
    y = e / total
    scale = np.abs(X).max(axis=0)
    Xs = X / scale
    best, best_sse = np.zeros(3), float(y @ y)
    for cols in ((0, 1, 2), (0, 1), (0, 2), (1, 2), (0,), (1,), (2,)):
        sub, *_ = np.linalg.lstsq(Xs[:, cols], y, rcond=None)
        if np.any(sub < 0):
            continue
        resid = y - Xs[:, cols] @ sub
        sse = float(resid @ resid)
        if sse < best_sse:
            best_sse, best = sse, np.zeros(3)
            best[list(cols)] = sub
    a, b, c = (best / scale).tolist()
    worst = float(np.max(np.abs((a * l + b) * l + c - e) / total)) if l.size else 0.0
    return Increments(a, b, c, worst)


def time_grid(max_len: int) -> list[list[int]]:
    """The timing grid of a scheme: single sequences at TIME_FRACTIONS of MaxLen, then the same totals
    as PACKED_DOCS equal documents (deterministic for a MaxLen)."""
    q = LENGTH_QUANTUM
    totals = sorted({max(PACKED_DOCS * q, int(max_len * f) // q * q) for f in TIME_FRACTIONS})
    return [[n] for n in totals] + [[n // PACKED_DOCS] * PACKED_DOCS for n in totals]


@dataclass(frozen=True)
class SchemeFit:
    """a, b, c fitted on every point; R^2 and worst relative error over them; worst relative error of the
    packed points alone (None without any)."""

    time: TimeCoeffs
    r2: float
    worst_rel_err: float
    packed_worst_rel_err: float | None
    points: int


def fit_points(points: Sequence[tuple[Sequence[int], float]]) -> SchemeFit:
    """Fit T(m) on the points (packed lengths, seconds)."""
    if len({(sum(ls), len(ls)) for ls, _ in points}) < 3:
        raise ValueError(f"need at least 3 distinct points to fit a, b, c (got {len(points)})")
    fit = fit_micro_batches([ls for ls, _ in points], [s for _, s in points])
    time = TimeCoeffs(a=fit.a, b=fit.b, c=fit.c)
    packed = [(np.asarray(ls, dtype=np.float64), s) for ls, s in points if len(ls) > 1]
    errs = [abs(float(((time.a * ls + time.b) * ls).sum()) + time.c - s) / s for ls, s in packed]
    return SchemeFit(time, fit.r2, fit.worst_rel_err, max(errs) if errs else None, len(points))


@dataclass(frozen=True)
class BandwidthFit:
    """The one bandwidth with which sync.transfer_s reproduces measured LNK times best (relative least
    squares), and its worst relative error over them."""

    GBps: float
    worst_rel_err: float
    points: int


def fit_bandwidth(slice_bytes: Sequence[float], seconds: Sequence[float]) -> BandwidthFit:
    """Fit t = bytes / bw (the end-to-end model of docs/formats.md has no latency term) on (slice bytes, seconds) pairs:
    with r_i = bytes_i / t_i, minimizing sum((bytes_i / bw - t_i) / t_i)^2 gives 1/bw = sum(r) / sum(r^2).
    At the real slice sizes a fixed latency is folded into bw, which is what the estimate then sees."""
    b = np.asarray(slice_bytes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if len(b) == 0 or np.any(b <= 0) or np.any(t <= 0):
        raise ValueError("need positive bytes and seconds to fit a bandwidth")
    r = b / t
    inv = float(r.sum() / (r * r).sum())  # seconds per byte
    return BandwidthFit(1e-9 / inv, float(np.max(np.abs(b * inv - t) / t)), len(b))


def network_slices(params: int, samples: Sequence[dict]) -> tuple[list[float], list[float]]:
    """(bytes as sync.transfer_s counts them: WIRE_BYTES_PER_PARAM * params / (tp * pp), seconds) of every
    measured pull and push; the wire may carry a wider dtype (fp32 on CPU), which the bandwidth absorbs."""
    sizes, secs = [], []
    for x in samples:
        for key in ("pull_s", "push_s"):
            sizes.append(WIRE_BYTES_PER_PARAM * params / (x["tp"] * x["pp"]))
            secs.append(float(x[key]))
    return sizes, secs
