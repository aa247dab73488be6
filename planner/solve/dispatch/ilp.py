"""Eq. (3) in CP-SAT: the exact dispatch, warm-started from the greedy's, for `--dispatch ilp`."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from ortools.sat.python import cp_model

from hydraplan.core.sync import BACKWARD_SHARE
from hydraplan.solve import milp
from hydraplan.solve.dispatch.pipes import Costs, Pipes

ILP_SCALE = 1e7  # the greedy cost maps to this many integer units in CP-SAT
_BACKWARD = Fraction(BACKWARD_SHARE).limit_denominator(1000)  # 2/3 in integers: z >= h_j(load) in CP-SAT's terms


def _assignment_vars(m: cp_model.CpModel, lengths: np.ndarray, J: np.ndarray, P: Pipes,
                     order: np.ndarray) -> dict[tuple[int, int], cp_model.IntVar]:
    """x[i, j]: sequence i on pipeline j, exactly one per sequence. Within a group of identical pipelines the
    k-th sequence (longest first) eligible for the group may use only its first k+1 pipelines (symmetry)."""
    gid = P.gid
    x: dict[tuple[int, int], cp_model.IntVar] = {}
    seen = np.zeros(gid.max() + 1, dtype=np.int64)  # sequences placed so far per group
    rank = np.zeros(len(gid), dtype=np.int64)  # pipeline's position inside its group
    for g in range(gid.max() + 1):
        members = np.flatnonzero(gid == g)
        rank[members] = np.arange(len(members))
    for i in order:
        allowed = [j for j in range(J[i]) if rank[j] <= seen[gid[j]]]
        for g in np.unique(gid[: J[i]]):
            seen[g] += 1
        xs = []
        for j in allowed:
            x[i, j] = m.new_bool_var("")
            xs.append(x[i, j])
        m.add_exactly_one(xs)
    return x


def _bound_loads(m: cp_model.CpModel, x: dict[tuple[int, int], cp_model.IntVar], lengths: np.ndarray,
                 W: np.ndarray | Costs, P: Pipes, z: cp_model.IntVar, big: int, scale: float) -> None:
    """z >= every pipeline's scaled Eq. (2) load, and z >= h_j(load) on pipelines with a transfer once busy."""
    B, D = W.shape
    total = int(lengths.sum())
    for j in range(D):
        vs = [(i, x[i, j]) for i in range(B) if (i, j) in x]
        if not vs:
            continue
        nv = m.new_int_var(0, -(-total // int(P.max_len[j])), "")
        m.add(int(P.max_len[j]) * nv >= sum((int(lengths[i]) * v for i, v in vs), start=0))
        e = m.new_int_var(0, big, "")
        for i, v in vs:
            m.add(e >= int(round(P.ppm1[j] * (W[i, j] + P.c[j]) * scale)) * v)
        load = sum(int(round(W[i, j] * scale)) * v for i, v in vs) + int(round(P.c[j] * scale)) * nv + e
        m.add(z >= load)
        if P.t[j] > 0:  # z >= h_j(load) = max(load, t_j + 2 load / 3) once the pipeline has a sequence
            busy = m.new_bool_var("")
            for _, v in vs:
                m.add_implication(v, busy)
            den, num = _BACKWARD.denominator, _BACKWARD.numerator
            m.add(den * z >= int(round(den * P.t[j] * scale)) * busy + num * load)


def _symmetric_hint(hint: np.ndarray, P: Pipes, order: np.ndarray) -> np.ndarray:
    """The hint with identical pipelines relabelled in order of their longest sequence, so it obeys the symmetry
    breaking."""
    B = len(hint)
    pos = np.empty(B, dtype=np.int64)
    pos[order] = np.arange(B)
    h = hint.copy()
    for g in range(P.gid.max() + 1):
        members = np.flatnonzero(P.gid == g)
        firsts = [pos[hint == j].min(initial=B) for j in members]
        for src, dst in zip(members[np.argsort(firsts, kind="stable")], members):
            h[hint == src] = dst
    return h


def ilp(lengths: np.ndarray, W: np.ndarray | Costs, J: np.ndarray, P: Pipes, hint: np.ndarray, ub: float,
        time_limit_s: float, seed: int) -> tuple[np.ndarray | None, bool]:
    """Eq. (3) in CP-SAT, hinted with `hint` whose objective is `ub`: (sorted-pipeline index per sequence or None,
    proven optimal)."""
    order = np.argsort(-lengths, kind="stable")
    scale = ILP_SCALE / max(ub, 1e-30)
    m = cp_model.CpModel()
    x = _assignment_vars(m, lengths, J, P, order)
    big = int(np.ceil(ub * scale * 1.01)) + 1
    z = m.new_int_var(0, big, "z")
    _bound_loads(m, x, lengths, W, P, z, big, scale)
    m.minimize(z)
    h = _symmetric_hint(hint, P, order)
    for (i, j), v in x.items():
        m.add_hint(v, int(h[i] == j))
    sol = milp.cpsat(m, seed=seed, max_dtime_s=time_limit_s)
    if sol.values is None:
        return None, False
    out = np.empty(len(lengths), dtype=np.int64)
    for (i, j), v in x.items():
        if sol.values[v.index]:
            out[i] = j
    return out, sol.status == "optimal"
