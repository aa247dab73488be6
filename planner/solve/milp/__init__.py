"""The one place CP-SAT and HiGHS run: a model built with the solver's own API in, a typed `Solution` out.

Callers build their model as the solvers' own examples do (`cp_model.CpModel`; `highspy.Highs` from `highs_model`)
and never touch a solver object to run it, read its status or its point. Every run is deterministic: one worker
or thread, a fixed seed, limits in deterministic time or branch-and-bound nodes (HiGHS' clock limit only where a
caller asks for one), so a plan does not depend on the machine's speed or load. Neither library is imported
until a model is solved: importing this module stays cheap.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    import highspy
    from ortools.sat.python import cp_model

# optimal: proven (within the gap asked for); feasible: a point, not proven optimal (a limit stopped the search);
# infeasible: proven to have no point; limit: a limit stopped the search before a point was found; unknown: the
# solver could not tell
Status = Literal["optimal", "feasible", "infeasible", "limit", "unknown"]


@dataclass(frozen=True)
class Solution:
    status: Status
    values: np.ndarray | None  # every variable's value by its index (CP-SAT `var.index`, HiGHS column); None: no point
    objective_value: float | None  # at the point (named as the solvers name it: not the planner's objective)
    bound: float | None  # the best proven bound on the objective (None: the solver gives none, as for an LP)
    wall_s: float  # wall-clock seconds of the solve (for reports only: no decision may read it)
    dtime_s: float = 0.0  # CP-SAT's deterministic seconds spent (callers sharing one budget charge it); 0 for HiGHS


def cpsat(model: cp_model.CpModel, *, seed: int, max_dtime_s: float, abs_gap: float | None = None) -> Solution:
    """Solve a CP-SAT model on one worker with `seed`, stopping after `max_dtime_s` deterministic seconds or
    within `abs_gap` of the bound (None: CP-SAT's default gap)."""
    from ortools.sat.python import cp_model

    s = cp_model.CpSolver()
    s.parameters.catch_sigint_signal = False  # its handler, once removed, leaves SIGINT at SIG_DFL: Ctrl-C killed us
    s.parameters.num_workers = 1
    s.parameters.random_seed = seed
    s.parameters.max_deterministic_time = max_dtime_s
    if abs_gap is not None:
        s.parameters.absolute_gap_limit = abs_gap
    start = time.perf_counter()
    st = s.solve(model)
    wall = time.perf_counter() - start
    if st == cp_model.MODEL_INVALID:
        raise ValueError(f"CP-SAT model invalid: {model.validate()}")
    statuses: dict[cp_model.CpSolverStatus, Status] = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
                                                       cp_model.INFEASIBLE: "infeasible", cp_model.UNKNOWN: "limit"}
    status = statuses[st]
    if status not in ("optimal", "feasible"):
        return Solution(status, None, None, None, wall, s.deterministic_time)
    return Solution(status, np.asarray(s.response_proto.solution, dtype=np.int64), s.objective_value,
                    s.best_objective_bound, wall, s.deterministic_time)


def highs_model() -> highspy.Highs:
    """An empty HiGHS model to build in, silent from the start (HiGHS logs to stdout while rows are added,
    small matrix values for one)."""
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    return h


def highs(h: highspy.Highs, *, mip: bool, max_nodes: int | None = None, time_limit_s: float | None = None,
          rel_gap: float | None = None, start: np.ndarray | None = None,
          options: Mapping[str, str] | None = None) -> Solution:
    """Solve the model built in `h` (from `highs_model`) on one thread with seed 0: a MIP under the stdout guard
    (`run_mip`), stopped after `max_nodes` branch-and-bound nodes or within `rel_gap` of the bound (None: HiGHS'
    defaults), warm-started from `start` (a value per column); `options` are further HiGHS options (the LP
    algorithm, say). `time_limit_s` is a clock limit: plans must not depend on it, so only answers that do not
    (a feasibility check giving up) may use one."""
    import highspy

    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    if rel_gap is not None:
        h.setOptionValue("mip_rel_gap", rel_gap)
    for k, v in (options or {}).items():
        h.setOptionValue(k, v)
    if max_nodes is not None:
        h.setOptionValue("mip_max_nodes", int(max_nodes))
    if time_limit_s is not None:
        h.setOptionValue("time_limit", float(time_limit_s))
    if start is not None:
        warm = highspy.HighsSolution()
        warm.col_value = np.asarray(start, dtype=np.float64).tolist()
        warm.value_valid = True
        h.setSolution(warm)
    began = time.perf_counter()
    run_mip(h) if mip else h.run()
    wall = time.perf_counter() - began
    model, info = h.getModelStatus(), h.getInfo()
    S = highspy.HighsModelStatus
    if model == S.kInfeasible:
        return Solution("infeasible", None, None, None, wall)
    bound = info.mip_dual_bound if mip else None
    if model == S.kOptimal or info.primal_solution_status == 2:  # 2: HiGHS' kSolutionStatusFeasible
        return Solution("optimal" if model == S.kOptimal else "feasible", np.asarray(h.getSolution().col_value),
                        info.objective_function_value, bound, wall)
    if model in (S.kTimeLimit, S.kIterationLimit, S.kSolutionLimit):
        return Solution("limit", None, None, bound, wall)
    return Solution("unknown", None, None, None, wall)


# ---------------------------------------------------------------------------------------- HiGHS' stray line
_LIBC = ctypes.CDLL(None)


def run_mip(h: highspy.Highs) -> None:
    """h.run() with file descriptor 1 pointed at /dev/null for its duration (C buffers flushed on both
    sides, so neither what was printed before nor the solver's line moves across the switch).

    highspy 1.12's MIP solver prints "HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();"
    with C stdio straight to file descriptor 1 whatever `output_flag` says (seen at 1024 GPUs in per-batch
    synthesis), which would land in the middle of a command's `--json` output. LP solves do not print it and are
    run as they are."""
    sys.stdout.flush()
    _LIBC.fflush(None)
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
        try:
            h.run()
        finally:
            _LIBC.fflush(None)
            os.dup2(saved, 1)
    finally:
        os.close(saved)
