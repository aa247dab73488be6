"""The dispatch methods (`--dispatch`), in one table: name, what it is, and the exact step it adds.

Every method runs Algorithm 1's randomized greedy trials and their local search (solve/dispatch/); a method may
add an exact step, run when the trials' best is not proven optimal and hinted with it. The CLI's help, the
planner settings' allowed values (`DispatchName`) and `dispatch` read this table: adding a method is one entry
here (and its step as a pure function in solve/dispatch/). Only the standard library is imported up front: the
CLI reads the table for its help without loading the solvers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import numpy as np

    from hydraplan.solve.dispatch import ExactStep
    from hydraplan.solve.dispatch.pipes import Costs, Pipes


@dataclass(frozen=True)
class DispatchMethod:
    name: str
    description: str  # for the CLI's help
    exact: ExactStep | None = None  # None: the greedy's best stands
    solver: str = ""  # the exact step in a plan's dispatch_solver (greedy+<solver>)


def _cpsat(lengths: np.ndarray, W: np.ndarray | Costs, J: np.ndarray, P: Pipes, hint: np.ndarray, ub: float,
           time_limit_s: float, seed: int) -> tuple[np.ndarray | None, bool]:
    from hydraplan.solve.dispatch.ilp import ilp  # CP-SAT (OR-Tools) loads in half a second: only when asked

    return ilp(lengths, W, J, P, hint, ub, time_limit_s, seed)


METHODS: tuple[DispatchMethod, ...] = (
    DispatchMethod("greedy", "Alg. 1 + local search"),
    DispatchMethod("ilp", "Eq. 3, exact", _cpsat, "cpsat"),
)
BY_NAME = {m.name: m for m in METHODS}
GREEDY = METHODS[0]  # the greedy alone: what an exact step's plan is checked against (engine/planner.py)
HELP = " or ".join(f"{m.name} ({m.description})" for m in METHODS)
if TYPE_CHECKING:  # a type checker cannot read names computed at run time; pydantic validates against them
    DispatchName = str
else:
    DispatchName = Literal[tuple(BY_NAME)]
