"""The run folder of `hydraplan pack`: one plan file per iteration (JSON, or compact: store/planfile.py),
summary.json, strategies.json. The one place their names are defined; `validate`, the runtime and the
loader read run folders through it."""

from __future__ import annotations

import re
from pathlib import Path
from time import perf_counter

import numpy as np

from hydraplan.core.cluster import score
from hydraplan.core.schema import Summary
from hydraplan.store.fileio import write_model
from hydraplan.store.planfile import SUFFIX

PLAN_FILE = re.compile(r"^iter_(\d+)\.(json|parquet)$")  # store/planfile.py: JSON or compact
SUMMARY_FILE = "summary.json"
STRATEGIES_FILE = "strategies.json"


def plan_path(out: Path, iteration: int, fmt: str = "json") -> Path:
    """Iteration's plan file in `fmt` (json | compact)."""
    return out / f"iter_{iteration:06d}{SUFFIX[fmt]}"


def plan_files(folder: Path) -> list[Path]:
    """The folder's plan files (either form) in iteration order."""
    found = [(int(m[1]), p) for p in folder.iterdir() if (m := PLAN_FILE.match(p.name))]
    return [p for _, p in sorted(found, key=lambda t: t[0])]


def remove_plans_from(out: Path, first: int) -> None:
    """Drop plan files (either form) a new or resumed run will (re)write, so the folder never mixes two runs."""
    for p in out.glob("iter_*.*"):
        m = PLAN_FILE.match(p.name)
        if m and int(m.group(1)) >= first:
            p.unlink()


class SummaryWriter:
    """Rewrites summary.json after a plan is written, at most every SUMMARY_EVERY_S seconds (or 5x the
    last write's duration on long runs) so a 10,000-iteration run does not spend its time rewriting it.
    A plan newer than the summary is simply redone by --resume."""

    SUMMARY_EVERY_S = 0.5

    def __init__(self, out: Path, summary: Summary) -> None:
        self.out, self.summary = out, summary
        self.next_at = 0.0
        self.write()

    def maybe_write(self) -> None:
        if perf_counter() >= self.next_at:
            self.write()

    def write(self) -> None:
        t0 = perf_counter()
        its = self.summary.iterations
        self.summary.mean_estimate_s = float(np.mean([i.estimate_s for i in its])) if its else None
        if self.summary.outlier_delay is not None and its:
            delayed = sum(i.delayed_token_iters or 0 for i in its) / max(sum(i.tokens or 0 for i in its), 1)
            self.summary.outlier_delay.avg_delay_iters_per_token = delayed
        base = [i.baselines_s["megatron"] for i in its if "megatron" in i.baselines_s]
        self.summary.mean_baseline_s = float(np.mean(base)) if base and len(base) == len(its) else None
        e2e = [i.iteration_s for i in its if i.iteration_s is not None]
        self.summary.mean_iteration_s = float(np.mean(e2e)) if its and len(e2e) == len(its) else None
        base = [i.baselines_iteration_s["megatron"] for i in its if "megatron" in i.baselines_iteration_s]
        self.summary.mean_baseline_iteration_s = float(np.mean(base)) if base and len(base) == len(its) else None
        ratios = [score(self.summary.objective, i.estimate_s, i.iteration_s) / i.bound_s for i in its if i.bound_s]
        self.summary.mean_plan_over_bound = float(np.mean(ratios)) if ratios else None
        self.summary.max_plan_over_bound = float(np.max(ratios)) if ratios else None
        write_model(self.out / SUMMARY_FILE, self.summary)
        t1 = perf_counter()
        self.next_at = t1 + max(self.SUMMARY_EVERY_S, 5 * (t1 - t0))
