"""Sequences -> pipelines (Hydraulis §6.2): randomized greedy Algorithm 1 and the exact ILP of Eq. (3).

The load of a pipeline is the Eq. (2) lower bound written in the canonical cost model (c once per
micro-batch, docs/formats.md): ``sum_i (a l_i^2 + b l_i) + c * ceil(L / MaxLen) + (pp-1) * (a lmax^2 + b lmax + c)``
with L the pipeline's tokens (it needs at least ceil(L/MaxLen) micro-batches, each paying c) and 0 for an
empty pipeline. Any packing of those sequences costs at least this, so it is a valid Eq. (2) bound.

End-to-end objective: given each pipeline's one-direction LNK transfer t_j (core/sync.py), the dispatch
minimizes max_j h_j(O_j), h_j(O) = max(O, t_j + 2 O / 3) (sync.busy_s): a busy pipeline's end-to-end time
max(2 t_j, h_j(O)) without the 2 t_j floor, which no dispatch changes once a pipeline has work. h_j is strictly
increasing, so Alg. 1's argmin, the local search and the ILP carry over on h_j of the loads; t = 0 is Eq. (3).

Modules: pipes (the sorted pipelines, cost table and Eq. (2) of running sums), bounds, greedy (Alg. 1 and its
trials), search (the local search), ilp (CP-SAT); this file holds the entry, `dispatch`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hydraplan.core.schema import Scheme
from hydraplan.core.sync import busy_float_s, charges
from hydraplan.solve.dispatch.bounds import (
    lower_bound,
    pigeonhole_bound,
    scheme_arrays,
    top_sequences_bound,
    trivial_bound,
)
from hydraplan.solve.dispatch.greedy import greedy_best
from hydraplan.solve.dispatch.pipes import Costs, Pipes, cost_sorted

__all__ = ["DispatchResult", "ExactStep", "Infeasible", "Method", "dispatch", "lower_bound", "pigeonhole_bound",
           "scheme_arrays", "top_sequences_bound"]


class Infeasible(Exception):
    """A sequence no pipeline can hold; the caller turns it into a UserError or drops the candidate."""

    def __init__(self, length: int, max_len: int):
        self.length = int(length)
        self.max_len = int(max_len)
        super().__init__(f"a sequence of length {self.length} exceeds the largest MaxLen available ({self.max_len})")


@dataclass(frozen=True)
class DispatchResult:
    assign: np.ndarray  # pipeline index (into `schemes`) per sequence
    cost: float  # max over pipelines of the Eq. (2) lower bound
    solver: str  # greedy | greedy+cpsat | greedy+cpsat-limit | greedy+warm-start
    optimal: bool  # proven optimal for Eq. (3)
    trials: int  # greedy trials actually run (capped so trials * sequences * pipelines <= greedy.WORK)


# an exact step after the greedy: (lengths, costs, eligible pipelines per sequence, pipelines, hint, the hint's cost,
# deterministic time limit, seed) -> (sorted-pipeline index per sequence or None, proven optimal)
ExactStep = Callable[[np.ndarray, Costs, np.ndarray, Pipes, np.ndarray, float, float, int],
                     tuple[np.ndarray | None, bool]]


class Method(Protocol):
    """What `dispatch` reads of a dispatch method (solve/dispatch_methods.py lists them)."""

    @property
    def exact(self) -> ExactStep | None: ...

    @property
    def solver(self) -> str: ...


def dispatch(lengths: np.ndarray, schemes: list[Scheme], *, method: Method | None = None, trials: int = 32,
             seed: int = 0, time_limit_s: float = 10.0, transfer: np.ndarray | None = None) -> DispatchResult:
    """Assign every sequence to a pipeline minimizing the largest Eq. (2) bound (Eq. 3), or with `transfer`
    (per pipeline) the largest h_j of it (the module docstring's end-to-end objective; `cost` is then in h).

    `schemes` has one entry per pipeline, MaxLen already for the cluster size. `trials` is capped so
    trials x sequences x pipelines stays under greedy.WORK: at a thousand GPUs only the LPT trial runs (on the
    batches measured it equalled the best of all trials, at a fraction of their cost). `method`'s exact step (None:
    the greedy alone) runs when the trials' best is not proven optimal; `time_limit_s` bounds it in deterministic
    time, so results are identical run to run.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if not schemes:
        raise ValueError("dispatch needs at least one pipeline")
    t = charges(transfer, len(schemes))
    uniform = 0.0
    if len(set(t.tolist())) == 1:
        # one transfer for all (none charged included): h is one increasing map, so Eq. (3)'s dispatch is optimal
        # for it; search without it (cheaper) and report the cost through it
        uniform, t = float(t[0]), np.zeros(len(t))
    res = _solve(lengths, schemes, method, trials, seed, time_limit_s, t)
    if uniform and res.cost > 0:
        res = dataclasses.replace(res, cost=busy_float_s(uniform, res.cost))
    return res


def _solve(lengths: np.ndarray, schemes: list[Scheme], method: Method | None, trials: int, seed: int,
           time_limit_s: float, transfer: np.ndarray) -> DispatchResult:
    """dispatch on the pipelines sorted by MaxLen (Pipes): greedy trials, then the method's exact step when it has
    one and the trials are not proven optimal."""
    P = Pipes.of(schemes, transfer)
    if len(lengths) == 0:
        return DispatchResult(np.zeros(0, dtype=np.int64), 0.0, "greedy", True, 0)
    J = P.eligible_count(lengths)
    if (J == 0).any():
        raise Infeasible(int(lengths[J == 0].max()), int(P.max_len[0]))
    if (J == 1).all():  # one pipeline can hold them all (or there is only one): nothing to choose
        assign = np.zeros(len(lengths), dtype=np.int64)
        cost = P.h(lower_bound(lengths, P.order[assign], schemes)[P.order], slice(None)).max()
        return DispatchResult(P.order[assign], float(cost), "greedy", True, 0)
    Wg = P.group_cost(lengths)
    W = Costs(Wg, P.gid)
    bound = trivial_bound(Wg, P, lengths)
    assign, cost, trials = greedy_best(lengths, Wg, W, J, P, max(1, trials), seed, bound)
    optimal = cost <= bound * (1 + 1e-12)
    solver = "greedy"
    if method is not None and method.exact is not None and not optimal:
        sol, proven = method.exact(lengths, W, J, P, assign, cost, time_limit_s, seed)
        exact_cost = cost_sorted(lengths, W, P, sol) if sol is not None else np.inf
        if sol is not None and exact_cost < cost * (1 - 1e-12):
            assign, cost = sol, exact_cost
            solver = f"greedy+{method.solver}" if proven else f"greedy+{method.solver}-limit"
        else:
            solver = f"greedy+{method.solver}" if proven else "greedy+warm-start"
        optimal = proven
    return DispatchResult(P.order[assign], float(cost), solver, bool(optimal), trials)
