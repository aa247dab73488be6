"""Fixtures shared by the solver and runtime tests; and GPUs hidden from the whole session. Other shared code is in
helpers.py, imported one way (`from helpers import ...`), as the worker scripts the runtime tests launch do."""

import os

import pytest

# The tests assert CPU behaviour (gloo, the exact CPU attention, heap statistics), in this process and in every
# rank they launch: on a machine with GPUs they must not pick NCCL or CUDA. `hydraplan doctor` checks the GPUs.
os.environ["CUDA_VISIBLE_DEVICES"] = ""
# --compile's tests: inductor compiles in the process (no pool of compile workers on a 2-core machine), read by
# torch when it first loads inductor's config; set here, before any test imports torch, not patched in its config
# (a patch undone by unittest.mock hides the setting for the rest of the process).
os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
# One compute thread per test process, as in every rank the tests launch: `make test`'s two xdist workers (and the
# ranks they start) already fill the 2 cores, and OpenMP threads of one process that wait for a core spin on it.
os.environ["OMP_NUM_THREADS"] = "1"


@pytest.fixture
def cpsat_calls(monkeypatch):
    """Every CP-SAT solve made during the test, as its deterministic time (packing's cache cleared first,
    so cached results cannot hide solves)."""
    from ortools.sat.python import cp_model

    from hydraplan.solve import packing

    calls: list[float] = []
    solve = cp_model.CpSolver.solve

    def spy(self, model, *args, **kwargs):
        status = solve(self, model, *args, **kwargs)
        calls.append(self.deterministic_time)
        return status

    monkeypatch.setattr(cp_model.CpSolver, "solve", spy)
    packing._pack_sorted.cache_clear()
    return calls


@pytest.fixture
def forked_runtime(monkeypatch):
    """`hydraplan profile` and `hydraplan doctor` with their runtime jobs' ranks forked (tests/ranks.py), for the
    tests whose subject is the job and not its launch."""
    import ranks

    from hydraplan.app import measure

    monkeypatch.setattr(measure, "launch_runtime", ranks.launch_runtime)


def pytest_collection_modifyitems(items):
    """Multi-process runtime tests (`slow`), bench smoke runs and the longest in-process tests first, the rest in
    collection order behind them: `make test`'s two xdist workers take the long ones in turns at the start and the
    short ones even out the end, so neither worker is left running a long test alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None and item.originalname not in FIRST)


FIRST = {"test_every_bench_runs_and_writes_what_the_docs_cite",  # tests/test_bench.py: a bench's smoke run
         "test_mypy_clean_over_every_planner_module",  # mypy, ~20 s with a cold cache
         "test_the_installed_wheel_plans_from_another_folder",  # a wheel built, installed, its numba kernels compiled
         "test_compiled_blocks_train_like_eager_in_fp64"}  # inductor compiling C++
