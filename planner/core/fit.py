"""Fitting T(l) = a*l^2 + b*l + c to measured timings (appendix C.2)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


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
