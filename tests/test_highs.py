"""run_mip keeps a solver's C-level prints off stdout and loses nothing printed around it; an LP asked only for
feasibility goes to interior point first."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hydraplan.solve.highs import SparseModel

SCRIPT = textwrap.dedent("""
    import ctypes
    from hydraplan.solve.milp import run_mip

    LIBC = ctypes.CDLL(None)

    class PrintingSolver:  # stands in for highspy.Highs: run() prints with C stdio, as HiGHS 1.12's MIP does
        def run(self):
            LIBC.printf(b"stray solver line\\n")

    print("python before")  # in Python's buffer when the solver starts
    LIBC.printf(b"c before\\n")  # in the C buffer
    run_mip(PrintingSolver())
    print("python after")
    LIBC.printf(b"c after\\n")
""")


def test_the_solvers_c_print_is_dropped_and_stdout_keeps_everything_else():
    # stdout a pipe and no PYTHONUNBUFFERED: both Python's and C's stdout fully buffered, as in a user's `> file`
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, check=True).stdout
    assert "stray solver line" not in out
    assert "python before" in out and "c before" in out and "python after" in out and "c after" in out


@pytest.mark.parametrize("vertex", [True, False])
def test_an_lp_asked_only_for_feasibility_is_solved_by_interior_point_first(monkeypatch, vertex):
    from hydraplan.solve import milp

    tried = []
    run = milp.highs

    def recording(h, **kw):
        tried.append((kw["options"] or {}).get("solver", "simplex"))
        return run(h, **kw)

    monkeypatch.setattr(milp, "highs", recording)
    m = SparseModel()
    x = m.add_vars(2, 0.0, 10.0, integer=True)
    m.add_rows(1, np.zeros(2), x, np.ones(2), lower=3.0, upper=3.0)
    sol = m.solve(relax=True, vertex=vertex)
    assert sol.status == "optimal" and sol.values.sum() == pytest.approx(3.0)
    assert tried == ["simplex" if vertex else "ipm"]
