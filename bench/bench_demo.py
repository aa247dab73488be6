"""`make demo`, recorded: the Makefile's demo commands (dataset stats, propose, pack, validate, compare, with its
RUN arguments) run through the `hydraplan` command, what each printed and how long they took together (wall
seconds on this shared machine), so the README shows today's output.
Also the proposed candidates (name, layout, lengths each is optimal for) and the dataset's long tail (share of
documents and tokens above 4K). The smoke run plans 2 iterations on 8 GPUs at 20K tokens. Writes
bench/results/demo.json.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.run import Run
from hydraplan.schema import Strategies
from hydraplan.solve.proposal import strategy_label
from hydraplan.store.paths import ROOT

HYDRAPLAN = str(Path(sys.executable).with_name("hydraplan"))
SMOKE = {"--gpus": "8", "--tokens-per-iter": "20000"}
DEMO = "plans/demo"  # the Makefile's DEMO folder


def makefile_run() -> list[str]:
    """The Makefile's RUN arguments (what `make demo` plans with)."""
    line = next(x for x in (ROOT / "Makefile").read_text().splitlines() if x.startswith("RUN :="))
    return shlex.split(line.split(":=", 1)[1])


def demo_iterations() -> int:
    """The `--iterations` of the Makefile's demo pack and compare."""
    return int(re.search(r"\$\(HP\) pack \$\(RUN\) --iterations (\d+)", (ROOT / "Makefile").read_text()).group(1))


def with_args(args: list[str], changes: dict[str, str]) -> list[str]:
    out = list(args)
    for flag, value in changes.items():
        out[out.index(flag) + 1] = value
    return out


def hydraplan(cwd: Path, *args: str) -> list[str]:
    """The command's stdout lines, trailing blanks dropped (a table is as wide as the widest run needs)."""
    res = subprocess.run([HYDRAPLAN, *args], cwd=cwd, capture_output=True, text=True, timeout=3600,
                         env=dict(os.environ, COLUMNS="120", HYDRAPLAN_PROGRESS_EVERY_S="3600"))
    if res.returncode != 0:
        raise RuntimeError(f"hydraplan {' '.join(args)}: exit {res.returncode}\n{res.stderr}")
    return [line.rstrip() for line in res.stdout.splitlines()]


def candidate(c) -> dict:
    return {"name": c.name, "label": strategy_label(c), "optimal_for": c.optimal_for, "kind": c.kind,
            "pipelines": len(c.pipelines), "text": f"{c.name}  {strategy_label(c)}"}


def main(run: Run) -> None:
    args = run.pick(makefile_run(), with_args(makefile_run(), SMOKE))
    iterations = str(run.pick(demo_iterations(), 2))
    profile, dataset, context = (args[args.index(f) + 1] for f in ("--profile", "--dataset", "--context-len"))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:  # run in a scratch folder with the Makefile's paths
        cwd, out = Path(tmp), DEMO
        stats = json.loads("\n".join(hydraplan(cwd, "dataset", "stats", dataset, "--context-len", context, "--json")))
        propose = hydraplan(cwd, "propose", *args, "--out", f"{out}/strategies.json")
        pack = hydraplan(cwd, "pack", *args, "--iterations", iterations, "--strategies", f"{out}/strategies.json",
                         "--out", f"{out}/run")
        validate = hydraplan(cwd, "validate", f"{out}/run", "--profile", profile)
        compare = hydraplan(cwd, "compare", *args, "--iterations", iterations, "--out", f"{out}/compare")
        strategies = Strategies.model_validate_json((cwd / out / "strategies.json").read_text())
        summary = json.loads((cwd / out / "run" / "summary.json").read_text())
        compared = json.loads((cwd / out / "compare" / "compare.json").read_text())["methods"]
    wall_s = time.perf_counter() - t0
    above_4k = next(s for s in stats["share_above"] if s["threshold"] == 4096)
    full = [c for c in strategies.candidates if c.optimal_for and c.optimal_for[1] >= int(context)]
    header = next(i for i, line in enumerate(compare) if line.split()[:2] == ["method", "strategy"])
    rows = [line for line in compare[header:] if line.strip()]
    table = rows[:next((i for i, line in enumerate(rows) if i > 1 and not line.startswith("  ")), len(rows))]
    run.write({
        "args": args, "iterations": int(iterations),
        "dataset_stats": {"docs_above_4k": above_4k["docs"], "tokens_above_4k": above_4k["tokens"],
                          "truncated": stats["truncated"]},
        "candidates": [candidate(c) for c in strategies.candidates],
        "candidate_count": len(strategies.candidates),
        "full_length_candidate": candidate(full[0]) if full else None,
        "pack_mean_iteration_s": summary.get("mean_iteration_s"), "pack_mean_estimate_s": summary["mean_estimate_s"],
        "compare_hydraplan_mean_iteration_s": compared["hydraplan"]["mean_iteration_s"],
        "wall_s": wall_s, "cores": os.cpu_count(),
        "output": {"propose": propose, "pack": pack, "validate": validate, "compare": compare,
                   "pack_tail": pack[-2:], "compare_table": table},
    })
    print("\n".join(pack[-2:] + table))
