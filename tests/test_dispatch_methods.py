"""solve/dispatch_methods.py is the one table of dispatch methods: the planner settings accept exactly its names,
`pack --help` and the runtime's `--dispatch` help describe each, and `dispatch` runs an entry's exact step (a method
added there needs nothing else)."""

import argparse
import dataclasses

import numpy as np
import pytest
from test_dispatch import instances, objective
from typer.testing import CliRunner

from hydraplan.app.cli import app
from hydraplan.core.errors import UserError
from hydraplan.engine.settings import PlanSettings
from hydraplan.solve import dispatch_methods
from hydraplan.solve.dispatch import dispatch
from hydraplan.solve.dispatch_methods import BY_NAME, METHODS


def test_the_settings_accept_exactly_the_registered_names():
    for m in METHODS:
        assert PlanSettings.of({"dispatch": m.name}).dispatch == m.name
    with pytest.raises(UserError, match="option dispatch") as e:
        PlanSettings.of({"dispatch": "magic"})
    assert all(repr(m.name) in str(e.value) for m in METHODS)
    assert PlanSettings().dispatch == dispatch_methods.GREEDY.name and dispatch_methods.GREEDY.exact is None


def test_the_cli_and_runtime_help_describe_every_method():
    r = CliRunner().invoke(app, ["pack", "--help"], env={"COLUMNS": "400"})
    text = " ".join(r.output.split())
    assert r.exit_code == 0 and all(f"{m.name} ({m.description})" in text for m in METHODS)

    from hydraplan.runtime.online import add_arguments

    ap = argparse.ArgumentParser()
    add_arguments(ap)
    text = " ".join(ap.format_help().split())
    assert all(f"{m.name} ({m.description})" in text for m in METHODS)


def test_dispatch_runs_an_entrys_exact_step_and_names_it():
    """A made-up method whose exact step returns the best assignment by brute force: dispatch calls it when the
    greedy is not proven optimal, keeps its assignment when cheaper and names it greedy+<solver>."""
    calls = []

    def exact(lengths, W, J, P, hint, ub, time_limit_s, seed):
        calls.append((ub, time_limit_s, seed))
        return BY_NAME["ilp"].exact(lengths, W, J, P, hint, ub, time_limit_s, seed)

    made_up = dataclasses.replace(BY_NAME["ilp"], name="made-up", exact=exact, solver="mine")
    seen = set()
    for lengths, schemes in instances(12, seed=5):
        g = dispatch(lengths, schemes, seed=1)
        r = dispatch(lengths, schemes, method=made_up, seed=1, time_limit_s=7.0)
        ilp = dispatch(lengths, schemes, method=BY_NAME["ilp"], seed=1, time_limit_s=7.0)
        assert np.array_equal(r.assign, ilp.assign) and r.cost == ilp.cost and r.optimal == ilp.optimal
        assert r.solver == ilp.solver.replace("cpsat", "mine")
        assert r.cost == pytest.approx(objective(lengths, schemes, r.assign), rel=1e-9) and r.cost <= g.cost
        seen.add(r.solver)
    assert calls and all(c[1:] == (7.0, 1) for c in calls)
    assert "greedy+mine" in seen  # the step ran and was proven on some instance
