"""Ctrl-C at any moment of `pack`: while preparing, while the workers start (importing, loading the compiled
solvers), and while they plan. As a terminal does, SIGINT goes to the whole process group. Each time: one
line saying how far the run got and how to resume, exit 130, no worker traceback, no leaked semaphore, no
process left; `--resume` then ends with the plans of an uninterrupted run."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import alive, children, write_run_inputs

from hydraplan.app.config import PackConfig
from hydraplan.app.pack import run_pack
from hydraplan.schema import Strategies
from hydraplan.store.runlock import LOCK_NAME

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

HYDRAPLAN = str(Path(sys.executable).with_name("hydraplan"))
ITERATIONS = 12


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("interrupt")
    rng = np.random.default_rng(3)
    lengths = np.minimum(rng.lognormal(6.0, 1.2, 3000).astype(np.int64) + 1, 4000)
    profile, data, strat = write_run_inputs(tmp, lengths, Strategies(candidates=[
        {"name": "mixed", "pipelines": [{"tp": 2, "pp": 1, "cp": 1}, *[{"tp": 1, "pp": 1, "cp": 1}] * 2]},
        {"name": "wide", "pipelines": [{"tp": 2, "pp": 1, "cp": 1}] * 2},
    ]))
    return {"profile": str(profile), "dataset": str(data), "strategies": str(strat), "gpus": 4,
            "tokens_per_iter": 15000, "iterations": ITERATIONS, "tmp": tmp}


def args(inputs, out: Path) -> list[str]:
    return ["pack", "--profile", inputs["profile"], "--dataset", inputs["dataset"], "--gpus", str(inputs["gpus"]),
            "--tokens-per-iter", str(inputs["tokens_per_iter"]), "--iterations", str(inputs["iterations"]),
            "--strategies", inputs["strategies"], "--workers", "2", "--out", str(out)]


def interrupt(inputs, out: Path, stage: str) -> tuple[str, set[int]]:
    """Start pack, SIGINT its process group once it reaches `stage`, return (stderr, its processes seen)."""
    proc = subprocess.Popen([HYDRAPLAN, *args(inputs, out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, "HYDRAPLAN_PROGRESS_EVERY_S": "0.05"})
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    seen: set[int] = set()
    reached = {
        "preparing": lambda: (out / LOCK_NAME).exists(),  # the run holds its folder: it loads and prepares
        "workers starting": lambda: len(seen) >= 3,  # the resource tracker and both workers exist, importing
        "planning": lambda: (out / "iter_000001.json").exists(),
    }[stage]
    deadline = time.monotonic() + 60
    while not reached():
        assert proc.poll() is None and time.monotonic() < deadline, f"pack ended before {stage}"
        seen |= children(proc.pid)
        time.sleep(0.01)
    seen |= children(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=60)
    reader.join(timeout=60)
    err = "".join(lines)
    assert proc.returncode == 130, (stage, proc.returncode, err)
    return err, seen


@pytest.mark.parametrize("stage", ["preparing", "workers starting", "planning"])
def test_ctrl_c_is_one_line_at_every_stage_and_resume_matches(inputs, stage):
    out = inputs["tmp"] / stage.replace(" ", "-")
    err, seen = interrupt(inputs, out, stage)
    # the progress lines of a log, and on a fresh install the note that the solvers compile (interrupted or not)
    lines = [ln for ln in err.splitlines() if not ln.startswith(("pack: ", "hydraplan: compiling solvers"))]
    assert len(lines) == 1 and lines[0].startswith("hydraplan: interrupted (SIGINT)"), err
    assert "--resume" in lines[0] and str(out) in lines[0]
    if stage == "planning":
        written = len(list(out.glob("iter_*.json")))
        assert f"{written} of {ITERATIONS} iterations planned" in lines[0]
        assert 2 <= written < ITERATIONS
    if stage == "workers starting":
        assert len(seen) >= 3
    deadline = time.monotonic() + 30
    while any(alive(p) for p in seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in seen if alive(p)]
    if stage != "planning":
        return
    resumed = subprocess.run([HYDRAPLAN, *args(inputs, out), "--resume"], capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    reference = inputs["tmp"] / "reference"
    run_pack(PackConfig(**{k: v for k, v in inputs.items() if k != "tmp"}, out=reference, workers=1))
    names = sorted(p.name for p in reference.glob("iter_*.json"))
    assert len(names) == ITERATIONS
    assert names == sorted(p.name for p in out.glob("iter_*.json"))
    for name in names:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
