"""Planning while training (runtime/online.py), measured: how long training waits for each plan.

4 gloo ranks on this 2-core machine train the cpu-tiny model in fp64 with --verify on builtin:wikipedia
(1536 tokens per iteration, 768-token context, 8 iterations), planning their own iterations with 1 and with
2 planner processes on one node, and as two nodes (two torchrun agents, 2 ranks and 2 planner processes
each). Per run: rank 0's wait for every plan (the first includes starting the planner processes), the
largest parameter difference to one-process training, and whether the plans trained on equal `hydraplan
pack`'s for the same arguments. Writes bench/results/online.json; the smoke run trains 2 iterations with one
planner process on one node.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import run as bench_run
from bench.run import Run
from hydraplan.loader import read_plans
from hydraplan.store.paths import ROOT
from tests.helpers import free_port

ARGS = ["--profile", "cpu-tiny", "--dataset", "builtin:wikipedia", "--tokens-per-iter", "1536", "--context-len", "768",
        "--seed", "1"]
WAIT = re.compile(r"^plan: iteration (\d+) from node (\d+), training waited (\S+)s$", re.M)
DIFF = re.compile(r"^verify: iteration \d+ max_abs_param_diff=(\S+)$", re.M)


def _nodes(flags: list[str], nodes: int) -> str:
    """run_plan FLAGS under `nodes` torchrun agents of 4 / nodes ranks each on this machine, all at once: rank 0's
    stdout."""
    port, env = str(free_port()), dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    base = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(4 // nodes), "--master-port", port,
            "--nnodes", str(nodes), "--master-addr", "127.0.0.1"]
    procs = [subprocess.Popen([*base, "--node-rank", str(n), str(ROOT / "runtime" / "run_plan.py"), *flags], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(nodes)]
    outs = [p.communicate(timeout=900) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("\n".join(o + e for o, e in outs))
    return outs[0][0]


def train(out: Path, args: list[str], planners: int, nodes: int) -> dict:
    flags = [*args, "--planners-per-node", str(planners), "--dtype", "fp64", "--verify", "--save-plans", str(out)]
    if nodes > 1:
        stdout = _nodes(flags, nodes)
    else:
        res = bench_run.torchrun(4, flags, timeout=900)
        if res.returncode:
            raise RuntimeError(res.stdout + res.stderr)
        stdout = res.stdout
    waits = [(int(i), int(n), float(w)) for i, n, w in WAIT.findall(stdout)]
    return {"id": f"{nodes}x{planners}", "planners_per_node": planners, "nodes": nodes, "ranks": 4,
            "waits_s": [w for _, _, w in waits], "planned_by_node": [n for _, n, _ in waits],
            "first_wait_s": waits[0][2], "max_later_wait_s": max(w for _, _, w in waits[1:]),
            "max_abs_param_diff": max(float(x) for x in DIFF.findall(stdout))}


def main(run: Run) -> None:
    args = [*ARGS, "--iterations", str(run.pick(8, 2))]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        pack = Path(tmp) / "pack"
        subprocess.run([str(Path(sys.executable).with_name("hydraplan")), "pack", *args, "--gpus", "4", "--out",
                        str(pack)], check=True, capture_output=True)
        want = list(read_plans(pack))
        for planners, nodes in run.pick(((1, 1), (2, 1), (2, 2)), ((1, 1),)):
            r = train(Path(tmp) / f"trained_{planners}_{nodes}", args, planners, nodes)
            r["plans_equal_pack"] = list(read_plans(Path(tmp) / f"trained_{planners}_{nodes}")) == want
            rows.append(r)
            print(f"{nodes} node(s) x {planners} planner(s): first plan waited {r['first_wait_s']:.2f} s, later at most "
                  f"{r['max_later_wait_s']:.3f} s; plans equal pack's: {r['plans_equal_pack']}", flush=True)
    run.write({"runs": rows, "args": args, "note": "4 gloo ranks on a shared 2-core machine; waits are rank 0's, in seconds"})
