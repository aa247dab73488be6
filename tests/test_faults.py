"""One line per failure under torchrun (runtime/faults.py): when every rank fails at the same moment, one of
them prints the job's line and the others exit quietly."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import cpu_env, free_port

from hydraplan.core.errors import UserError
from hydraplan.runtime.faults import Fault, parse
from hydraplan.store.paths import ROOT


def test_fault_specs_name_one_rank_or_every_rank():
    assert parse("data@*:1") == Fault("data", None, 1) and parse("oom@3:0") == Fault("oom", 3, 0)
    for bad in ("data@x:1", "data@*", "disk@1:1"):
        with pytest.raises(UserError, match="HYDRAPLAN_INJECT_FAULT: .* is not KIND@RANK:ITERATION"):
            parse(bad)


@pytest.mark.slow
def test_a_failure_on_every_rank_of_four_prints_one_line(tmp_path):
    """Bad data on all 4 ranks at the start of iteration 1 of the committed example run, under torchrun: one
    `run_plan:` line in the whole job (each rank used to print its own), naming a rank and the plan file."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port", str(free_port()),
           "-m", "hydraplan.runtime.run_plan", str(ROOT / "plans" / "example"), "--timeout-s", "60"]
    res = subprocess.run(cmd, env=cpu_env(HYDRAPLAN_INJECT_FAULT="data@*:1"), capture_output=True, text=True, timeout=240,
                         cwd=tmp_path)
    assert res.returncode != 0
    lines = [x for x in res.stderr.splitlines() if x.startswith("run_plan: ")]
    assert len(lines) == 1, res.stderr
    assert re.match(r"run_plan: rank [0-3] on .*, iteration 1 \(.*iter_000001\.json\): bad data: token id", lines[0])
    assert "iteration 1 strategy" not in res.stdout and "[rank" not in res.stderr  # no rank's traceback
