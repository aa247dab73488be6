"""HiGHS MIP runs without its stray console line. highspy 1.12's MIP solver prints
"HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();" with C stdio straight to file
descriptor 1 whatever `output_flag` says (seen at 1024 GPUs in per-batch synthesis), which would land in
the middle of a command's `--json` output. LP solves do not print it and are run as they are."""

from __future__ import annotations

import ctypes
import os
import sys

import highspy

_LIBC = ctypes.CDLL(None)


def run_mip(h: highspy.Highs) -> None:
    """h.run() with file descriptor 1 pointed at /dev/null for its duration (C buffers flushed on both
    sides, so neither what was printed before nor the solver's line moves across the switch)."""
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
